"""A user's feed: this node's event log (``store.events``) as one user may read it.

``feed(user, after)`` walks the log from a position and keeps the events of the chats
the user may read now (``may_read``: an active member of a group, a party of a DM),
and the member ops about the user anywhere — so a user removed from a group still
learns it. It returns the records themselves, signed, as stored, and the position to
go on from: the last one looked at, kept or not, so paging moves on through events of
other users' chats. A message hidden or gone (erased, expired) by the time the feed is
read is left out; its delete, or a HIDDEN event, says why.

Events of a chat from before the user could read it are not given again when they
become a member: the member event is their cue to page the chat's history.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from store.events import POSITION_LEN, EventKind, EventLog
from store.hidden import Hidden
from store.keys import CHAT_ID_LEN, MESSAGES_KEY_LEN, USER_ID_LEN, seq_of
from store.members import Members
from store.metas import Metas
from store.ops import MembershipOp, decode_membership_op
from store.reads import Receipts
from store.records import MsgV1, decode_msg
from store.rocks import Rocks

FEED_SCAN = 4096  # events looked at per call, kept or not: a bound on one call's work
FEED_BYTES = 256 * 1024  # records per call, about: a page (a stream's frame) stays small


@dataclass(frozen=True, slots=True)
class FeedEvent:
    position: int
    kind: EventKind
    chat_id: bytes
    msg: MsgV1 | None = None  # MESSAGE, DELETE, HIDDEN (whose payload is not for readers)
    member_op: MembershipOp | None = None  # MEMBER

    @property
    def about(self) -> bytes | None:
        """The user a member event is about (they see it wherever it is)."""
        return None if self.member_op is None else self.member_op.user_id

    @property
    def size(self) -> int:
        """The record's bytes, about."""
        return len(self.msg.encoded) if self.msg is not None else 200


# pending; delivered: a device of theirs acknowledged it here; read: their receipt reaches it
DeliveryState = Literal["pending", "delivered", "read"]


@dataclass(frozen=True, slots=True)
class Recipient:
    """A message's delivery to one of its recipients (RFC-0005's PENDING -> DELIVERED -> READ)."""

    user_id: bytes
    state: DeliveryState
    devices: dict[str, bool]  # the user's devices streaming from this node: has each got it


@dataclass(frozen=True, slots=True)
class FeedPage:
    events: list[FeedEvent]
    position: int  # go on after this one (the last event looked at)


class Feeds:
    """The users' feeds over this node's event log, and the devices' acknowledged positions
    (``delivered``: the one write here, a local view the node's ``Acks`` makes)."""

    def __init__(
        self,
        rocks: Rocks,
        metas: Metas,
        log: EventLog,
        members: Members,
        hidden: Hidden,
        receipts: Receipts,
    ) -> None:
        self._rocks, self._metas, self._log = rocks, metas, log
        self._members, self._hidden, self._receipts = members, hidden, receipts

    def may_read(self, chat_id: bytes, user_id: bytes) -> bool:
        """A chat's history is for its active members (a group's) or its two parties (a DM's)."""
        parties = self._metas.load(chat_id).identity
        if parties is not None and len(parties) == 2 * USER_ID_LEN:
            return user_id in (parties[:USER_ID_LEN], parties[USER_ID_LEN:])
        return self._members.is_member(chat_id, user_id)

    def acknowledge(self, acks: dict[tuple[bytes, str], int]) -> None:
        """Each (user, device) has the user's feed up to its position (never moves back). A
        local view, not replicated: written here, outside the writer (node/delivery.py)."""
        keys = [user + device.encode() for user, device in acks]
        rocks = self._rocks
        batch = rocks.new_batch()
        for key, position, held in zip(
            keys, acks.values(), rocks.multi_get("delivered", keys), strict=True
        ):
            if held is None or int.from_bytes(held, "big") < position:
                batch.put(key, position.to_bytes(POSITION_LEN, "big"), rocks.handle["delivered"])
        if batch.len():
            rocks.write(batch)

    def delivered(self, user_id: bytes) -> dict[str, int]:
        """Device -> the position it acknowledged last."""
        return {
            key[USER_ID_LEN:].decode(errors="replace"): int.from_bytes(value, "big")
            for key, value in self._rocks.iter_prefix("delivered", user_id)
        }

    def delivery(self, msg_id: bytes) -> tuple[MsgV1, list[Recipient]] | None:
        """The message and its delivery to every reader of its chat but its sender (None: not
        held, or hidden). Delivered is this node's knowledge — a device counts where it
        streams from; read comes from the signed receipts, the same on every node."""
        seen = self._rocks.get("seen_msg", msg_id)
        key = None if seen is None else seen[:MESSAGES_KEY_LEN]
        raw = None if key is None else self._rocks.get("messages", key)
        position = None if seen is None else self._log.event_position(seen)
        if key is None or raw is None or position is None:
            return None
        msg = decode_msg(raw, trusted=True)
        parties = self._metas.load(msg.chat_id).identity
        if parties is not None and len(parties) == 2 * USER_ID_LEN:
            readers = [parties[:USER_ID_LEN], parties[USER_ID_LEN:]]
        else:
            readers = self._members.list_members(msg.chat_id)
        out = []
        for user in (u for u in readers if u != msg.sender):
            devices = {d: p >= position for d, p in self.delivered(user).items()}
            read = self._receipts.read_position(msg.chat_id, user)
            state: DeliveryState = "read" if read is not None and read >= msg.hlc else "pending"
            if state == "pending" and any(devices.values()):
                state = "delivered"
            out.append(Recipient(user, state, devices))
        return msg, out

    def feed(
        self,
        user_id: bytes,
        after: int,
        limit: int,
        scan: int = FEED_SCAN,
        max_bytes: int = FEED_BYTES,
    ) -> FeedPage:
        """Up to ``limit`` of the user's events after position ``after`` — fewer once their
        records pass ``max_bytes`` (one at least) — looking at no more than ``scan`` events
        of the log."""
        reader = Reader(self, user_id)
        out: list[FeedEvent] = []
        size = 0
        position = after
        for position, kind, ref in self._log.events_after(after, scan):
            readable = reader.reads_chat(ref[:CHAT_ID_LEN], kind)
            if not readable and kind is not EventKind.MEMBER:
                continue  # (a member op may be about the user: decoded to see)
            event = self.log_event(position, kind, ref)
            if event is not None and (readable or event.about == user_id):
                out.append(event)
                size += event.size
                if len(out) == limit or size >= max_bytes:
                    break
        return FeedPage(out, position)

    def shown_messages(self, msg_ids: list[bytes]) -> list[bool]:
        """For each id, whether this replica holds the message and shows it."""
        hidden: dict[bytes, set[int]] = {}
        out = []
        for key in self._rocks.multi_get("seen_msg", msg_ids):
            if key is None:
                out.append(False)
                continue
            chat = key[:CHAT_ID_LEN]
            if chat not in hidden:
                hidden[chat] = self._hidden.seqs(chat)
            out.append(seq_of(key[:MESSAGES_KEY_LEN]) not in hidden[chat])
        return out

    def log_page(self, after: int, limit: int) -> FeedPage:
        """Every event after ``after`` (up to ``limit`` looked at), for any reader: what a
        stream at the log's end filters for its user (``FeedEvent.about``, ``may_read``)."""
        out: list[FeedEvent] = []
        position = after
        for position, kind, ref in self._log.events_after(after, limit):
            event = self.log_event(position, kind, ref)
            if event is not None:
                out.append(event)
        return FeedPage(out, position)

    def log_event(self, position: int, kind: EventKind, ref: bytes) -> FeedEvent | None:
        """The event with its record (None: gone — erased, expired — or hidden now)."""
        chat = ref[:CHAT_ID_LEN]
        if kind is EventKind.MEMBER:
            raw = self._rocks.get("member_ops", ref)
            return (
                None
                if raw is None
                else FeedEvent(position, kind, chat, member_op=decode_membership_op(raw[1:]))
            )
        if kind is EventKind.DELETE:
            raw = self._rocks.get("deletes", ref)
        else:  # MESSAGE, HIDDEN: held, and shown unless it is the HIDDEN event
            raw = self._rocks.get("messages", ref)
            if kind is EventKind.MESSAGE and seq_of(ref) in self._hidden.seqs(chat):
                return None
        if raw is None:
            return None
        return FeedEvent(position, kind, chat, msg=decode_msg(raw, trusted=True))


class ChatReaders(Protocol):
    """What ``Reader`` asks: ``Feeds.may_read`` (or the API's ``store.chat_reads.ChatReads``)."""

    def may_read(self, chat_id: bytes, user_id: bytes) -> bool: ...


class Reader:
    """Which events one user may read (the module's rule): those of the chats they may read
    (``Feeds.may_read``, asked once per chat, and again after a member event of that chat,
    which may have changed who reads it), and the member ops about them anywhere."""

    def __init__(self, db: ChatReaders, user_id: bytes) -> None:
        self._db, self.user_id = db, user_id
        self._readable: dict[bytes, bool] = {}

    def reads_chat(self, chat_id: bytes, kind: EventKind) -> bool:
        if kind is EventKind.MEMBER:
            self._readable.pop(chat_id, None)
        readable = self._readable.get(chat_id)
        if readable is None:
            readable = self._readable[chat_id] = self._db.may_read(chat_id, self.user_id)
        return readable

    def keeps(self, kind: EventKind, chat_id: bytes, about: bytes | None) -> bool:
        """Does the user read an event of this kind, chat and subject (a member op's user)?"""
        return self.reads_chat(chat_id, kind) or about == self.user_id
