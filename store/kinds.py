"""What edits, deletes, reactions and read receipts mean (MESSAGES.md). Pure.

Every rule here is a function of the chat's replicated sets — its messages, its
DELETE messages and its member ops (through ``is_admin``) — never of arrival
order. The store applies the same functions incrementally; ``fold_chat`` is the
whole rule in one place, the reference that tests compare the store with.

Three kinds carry public payloads the node acts on:

* DELETE: the target's sender (20 bytes), HLC (8, packed big-endian) and kind
  (1) — the *claims* that let every replica judge the delete without the target;
* REACTION: a flag byte (1 react, 0 retract), then the reaction key (1..64 bytes);
* READ_RECEIPT: the packed HLC (8 bytes) of the newest message read.

NEW, REPLY and EDIT payloads are the client's content, never read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from store.errors import DecodeError
from store.hlc import Hlc
from store.keys import USER_ID_LEN
from store.records import MessageKind, MsgV1

CONTENT = frozenset({MessageKind.NEW, MessageKind.REPLY})
CHANGES_TARGET = frozenset({MessageKind.EDIT, MessageKind.REACTION})  # part of the target's view
CLAIMS_LEN = USER_ID_LEN + 8 + 1
MAX_REACTION_KEY = 64
REACT, RETRACT = 1, 0

# (user, stamp) -> may this user delete others' messages at this stamp (a group's creator, or
# an admin add at or before it). Only ever turns true as ops arrive: erasure is irreversible.
IsAdmin = Callable[[bytes, Hlc], bool]


# --- public payloads ---


@dataclass(frozen=True, slots=True)
class Claims:
    """What a DELETE says its target is."""

    sender: bytes
    hlc: Hlc
    kind: MessageKind

    def encode(self) -> bytes:
        return self.sender + self.hlc.to_bytes() + bytes([self.kind])

    @classmethod
    def of(cls, target: MsgV1) -> Claims:
        return cls(target.sender, target.hlc, target.kind)


def decode_claims(payload: bytes) -> Claims:
    if len(payload) != CLAIMS_LEN:
        raise DecodeError(f"a DELETE payload is {CLAIMS_LEN} bytes, got {len(payload)}")
    try:
        kind = MessageKind(payload[-1])
    except ValueError:
        raise DecodeError(f"a DELETE names an unknown kind {payload[-1]}") from None
    return Claims(payload[:USER_ID_LEN], Hlc.from_bytes(payload[USER_ID_LEN:-1]), kind)


def reaction_payload(key: bytes, *, retract: bool = False) -> bytes:
    if not 1 <= len(key) <= MAX_REACTION_KEY:
        raise ValueError(f"a reaction key is 1..{MAX_REACTION_KEY} bytes, got {len(key)}")
    return bytes([RETRACT if retract else REACT]) + key


def decode_reaction(payload: bytes) -> tuple[bool, bytes]:
    """(reacts, key) — False for a retraction."""
    if not 2 <= len(payload) <= 1 + MAX_REACTION_KEY or payload[0] not in (REACT, RETRACT):
        raise DecodeError("a REACTION payload is a flag byte (0 or 1) and a 1..64-byte key")
    return payload[0] == REACT, payload[1:]


def decode_receipt(msg: MsgV1) -> Hlc:
    """The receipt's read position; not after the receipt's own stamp."""
    if len(msg.payload) != 8:
        raise DecodeError(f"a READ_RECEIPT payload is 8 bytes, got {len(msg.payload)}")
    position = Hlc.from_bytes(msg.payload)
    if position > msg.hlc:
        raise DecodeError("a READ_RECEIPT cannot read past its own stamp")
    return position


def check_public_payload(msg: MsgV1) -> None:
    """DecodeError unless a DELETE, REACTION or READ_RECEIPT payload is well formed — checked
    at every ingress alike (API, gossip, sync), so every replica refuses the same messages."""
    if msg.kind is MessageKind.DELETE:
        decode_claims(msg.payload)
    elif msg.kind is MessageKind.REACTION:
        decode_reaction(msg.payload)
    elif msg.kind is MessageKind.READ_RECEIPT:
        decode_receipt(msg)


# --- deletes ---


def claims_of(delete: MsgV1) -> Claims | None:
    """The delete's claims, or None if its payload is not well formed (it erases nothing)."""
    try:
        return decode_claims(delete.payload)
    except DecodeError:
        return None


def delete_is_valid(delete: MsgV1, is_admin: IsAdmin) -> bool:
    """A delete of content stamped before it, by its author or an admin (MESSAGES.md)."""
    claims = claims_of(delete)
    if claims is None or claims.kind not in CONTENT or not claims.hlc < delete.hlc:
        return False
    return delete.sender == claims.sender or is_admin(delete.sender, delete.hlc)


def erases(delete: MsgV1, msg: MsgV1) -> bool:
    """Does this (valid) delete erase ``msg``: its target, an edit by the target's author, or
    a reaction to it. Decided without the target, so that every replica decides alike."""
    if msg.chat_id != delete.chat_id:
        return False
    claims = claims_of(delete)
    assert claims is not None  # valid
    if msg.msg_id == delete.ref:
        return Claims.of(msg) == claims
    if msg.ref != delete.ref:
        return False
    if msg.kind is MessageKind.EDIT:
        return msg.sender == claims.sender
    return msg.kind is MessageKind.REACTION


def erased_by(msg: MsgV1, deletes: Iterable[MsgV1], is_admin: IsAdmin) -> MsgV1 | None:
    """The valid delete with the smallest (hlc, id) that erases ``msg``, if any."""
    found = [d for d in deletes if delete_is_valid(d, is_admin) and erases(d, msg)]
    return min(found, key=_order) if found else None


# --- the view ---


@dataclass(frozen=True, slots=True)
class Tombstone:
    """Where an erased message was: who and when, from the delete's claims; no payload."""

    msg_id: bytes
    hlc: Hlc
    sender: bytes
    deleted_by: bytes
    deleted_at: Hlc

    @property
    def order(self) -> tuple[Hlc, bytes]:
        return self.hlc, self.msg_id


@dataclass(frozen=True, slots=True)
class MessageView:
    """A content message as readers see it."""

    msg: MsgV1
    edit: MsgV1 | None = None  # the latest applying edit (signed: a client can check it)
    reply_state: str | None = None  # REPLY: "present", "deleted" or "unknown"
    reactions: dict[bytes, tuple[bytes, ...]] = field(default_factory=dict)  # key -> users

    @property
    def payload(self) -> bytes:
        return self.edit.payload if self.edit is not None else self.msg.payload

    @property
    def edited_at(self) -> Hlc | None:
        return self.edit.hlc if self.edit is not None else None

    @property
    def order(self) -> tuple[Hlc, bytes]:
        return _order(self.msg)


_SET_VIEW = tuple(MessageView.__dict__[name].__set__ for name in MessageView.__slots__)
assert MessageView.__slots__ == ("msg", "edit", "reply_state", "reactions")


def message_view(
    msg: MsgV1,
    edit: MsgV1 | None,
    reply_state: str | None,
    reactions: dict[bytes, tuple[bytes, ...]],
) -> MessageView:
    """``MessageView(msg, edit, reply_state, reactions)`` built through its slots: a folded
    page makes one per changed message, and a frozen dataclass's __init__ costs twice as
    much (tests/store/test_views.py: equal)."""
    view = object.__new__(MessageView)
    set_msg, set_edit, set_reply_state, set_reactions = _SET_VIEW
    set_msg(view, msg)
    set_edit(view, edit)
    set_reply_state(view, reply_state)
    set_reactions(view, reactions)
    return view


@dataclass(frozen=True, slots=True)
class ChatView:
    items: list[MessageView | Tombstone]  # in (hlc, id) order
    read_positions: dict[bytes, Hlc]  # user -> greatest receipt position

    def unread(self, user: bytes) -> int:
        position = self.read_positions.get(user)
        return sum(
            1
            for item in self.items
            if isinstance(item, MessageView)
            and item.msg.sender != user
            and (position is None or item.msg.hlc > position)
        )


def fold_chat(
    msgs: Iterable[MsgV1],
    deletes: Iterable[MsgV1],
    is_admin: IsAdmin,
    shown: Callable[[MsgV1], bool] = lambda m: True,
) -> ChatView:
    """The chat as readers see it, from its held messages (one chat, admissible), its deletes
    and who is admin when; ``shown``: the who-may-post visibility of a held message."""
    valid = [d for d in {d.msg_id: d for d in deletes}.values() if delete_is_valid(d, is_admin)]
    held = {m.msg_id: m for m in msgs}
    naming: dict[
        bytes | None, list[MsgV1]
    ] = {}  # a delete erases only what has its ref as id or ref
    for d in valid:
        naming.setdefault(d.ref, []).append(d)
    kept = {
        i: m
        for i, m in held.items()
        if not any(erases(d, m) for d in [*naming.get(i, ()), *naming.get(m.ref, ())])
    }
    visible = [m for m in kept.values() if shown(m)]
    by_ref: dict[bytes, list[MsgV1]] = {}
    for m in visible:
        if m.ref is not None:
            by_ref.setdefault(m.ref, []).append(m)
    items: list[MessageView | Tombstone] = [
        _view(m, by_ref.get(m.msg_id, []), kept, valid) for m in visible if m.kind in CONTENT
    ]
    items += _tombstones(valid, kept)
    items.sort(key=lambda item: item.order)
    positions: dict[bytes, Hlc] = {}
    for m in visible:
        if m.kind is MessageKind.READ_RECEIPT and (position := position_of(m)) is not None:
            positions[m.sender] = max(positions.get(m.sender, position), position)
    return ChatView(items, positions)


def _view(
    msg: MsgV1, refs: list[MsgV1], kept: dict[bytes, MsgV1], valid: list[MsgV1]
) -> MessageView:
    return MessageView(
        msg,
        latest_edit(msg, refs),
        _reply_state(msg, kept, valid),
        reactions_of(r for r in refs if r.kind is MessageKind.REACTION),
    )


def latest_edit(msg: MsgV1, refs: Iterable[MsgV1]) -> MsgV1 | None:
    """Of the shown messages referring to ``msg``, the applying edit with the greatest (hlc, id)."""
    edits = [e for e in refs if e.kind is MessageKind.EDIT and edit_applies(e, msg)]
    if len(edits) < 2:  # the common case: no need to hash an id for the order
        return edits[0] if edits else None
    return max(edits, key=_order)


def edit_applies(edit: MsgV1, target: MsgV1) -> bool:
    """``edit`` (shown, ref = target's id) changes ``target``: its author's, stamped after it."""
    return (
        target.kind in CONTENT
        and target.chat_id == edit.chat_id
        and target.sender == edit.sender
        and target.hlc < edit.hlc
    )


def reactions_of(reactions: Iterable[MsgV1]) -> dict[bytes, tuple[bytes, ...]]:
    """key -> the users whose latest (hlc, id) reaction with that key reacts (not retracts)."""
    latest: dict[tuple[bytes, bytes], MsgV1] = {}
    for r in reactions:
        try:
            _, key = decode_reaction(r.payload)
        except DecodeError:
            continue
        slot = (r.sender, key)
        if slot not in latest or _order(r) > _order(latest[slot]):
            latest[slot] = r
    users: dict[bytes, list[bytes]] = {}
    for (user, key), r in latest.items():
        if r.payload[0] == REACT:
            users.setdefault(key, []).append(user)
    return {key: tuple(sorted(who)) for key, who in sorted(users.items())}


def _reply_state(msg: MsgV1, kept: dict[bytes, MsgV1], valid: list[MsgV1]) -> str | None:
    if msg.kind is not MessageKind.REPLY:
        return None
    target = kept.get(msg.ref or b"")
    if target is not None and target.chat_id == msg.chat_id:
        return "present"
    return "deleted" if any(d.ref == msg.ref for d in valid) else "unknown"


def _tombstones(valid: list[MsgV1], kept: dict[bytes, MsgV1]) -> list[Tombstone]:
    """One per erased target: from the first valid delete naming it, unless a held message
    with that id contradicts the claims (the delete then erased nothing of it)."""
    first: dict[bytes, MsgV1] = {}
    for d in sorted(valid, key=_order):
        assert d.ref is not None
        if d.ref not in kept:
            first.setdefault(d.ref, d)
    out = []
    for ref, d in first.items():
        claims = claims_of(d)
        assert claims is not None
        out.append(Tombstone(ref, claims.hlc, claims.sender, d.sender, d.hlc))
    return out


def position_of(receipt: MsgV1) -> Hlc | None:
    """A READ_RECEIPT's position, or None if its payload is not one (the fold ignores it)."""
    try:
        return decode_receipt(receipt)
    except DecodeError:
        return None


def _order(msg: MsgV1) -> tuple[Hlc, bytes]:
    return msg.hlc, msg.msg_id
