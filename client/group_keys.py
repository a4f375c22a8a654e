"""A group member's keys, gathered from the node: the I/O around ``client/group_e2e.py``.

Everything comes from the replicated chat, nothing from local state: the grants (messages of
kind KEYS, ``GET /chats/{chat}/messages?kind=6``, and the ones the chat hides,
``GET /chats/{chat}/hidden-grants``), the members with their add stamps, and the
members' box keys from their verified identities. So any node, and any device of the user
holding the key file, seals and opens the same way.

Cost: one page walk over the chat's grants, one read of its hidden grants (none in most
chats: the node answers from memory) and one walk over its member ops per command (a few
per membership change and sender), and a backward walk over the chat's newest messages only
when a member was added behind a sender's epoch (down to that add's stamp) for the late
grants, or a removed sender's epoch left out someone this user now hands keys to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nacl.signing import VerifyKey

from client.e2e import E2eError, UserKey
from client.group_e2e import (
    NO_REMOVALS,
    Grant,
    Keyring,
    Membership,
    Removed,
    SenderState,
    decode_group,
    epoch_grants,
    handover_grants,
    is_group_sealed,
    message_key,
    missing_grants,
    needs_new_epoch,
    new_epoch,
    open_grants,
    read_notice,
    seal_grants_split,
    seal_group,
)
from client.http import ChatsyncClient, Member
from store.hlc import Hlc
from store.messages import MAX_PAGE_LIMIT
from store.ops import MembershipAction, MembershipOp
from store.records import MessageKind, MsgV1

SEALED_KINDS = (MessageKind.NEW, MessageKind.REPLY, MessageKind.EDIT)


@dataclass(frozen=True)
class Sealed:
    """What to post for one group message: grants first (if any), then the message itself."""

    grants: list[MsgV1]
    payload: bytes
    left_out: list[bytes]  # members with no published identity: nothing to seal to


class BoxKeys:
    """Users' published box keys (their identities, signatures checked), each looked up once;
    the user's own from its key file."""

    def __init__(self, client: ChatsyncClient, key: UserKey) -> None:
        self.client = client
        self._known: dict[bytes, bytes | None] = {key.user_id: key.box_key}

    def __call__(self, user: bytes) -> bytes | None:
        if user not in self._known:
            doc = self.client.identity_doc(user)
            self._known[user] = None if doc is None else doc.box_key
        return self._known[user]


class GroupKeys:
    """One user's view of one group's keys, read from the node once per command."""

    def __init__(
        self,
        client: ChatsyncClient,
        key: UserKey,
        chat_id: bytes,
        box_keys: BoxKeys | None = None,
    ) -> None:
        self.client, self.key, self.chat_id = client, key, chat_id
        self._grants: list[MsgV1] | None = None
        self._box_keys = box_keys or BoxKeys(client, key)
        self._keyring: Keyring | None = None
        self._starts: dict[tuple[bytes, bytes], Hlc] = {}  # (sender, epoch id) -> its grant's

    # --- reading ---

    def grants_messages(self) -> list[MsgV1]:
        """The chat's grants, shown and hidden (``client.group_e2e``: hidden grants count)."""
        if self._grants is None:
            self._grants = [
                msg
                for msg in self.client.hidden_grants(self.chat_id)
                if msg.chat_id == self.chat_id and msg.kind is MessageKind.KEYS  # a node's word
            ]
            cursor = None
            while True:
                page = self.client.history(
                    self.chat_id, cursor=cursor, limit=MAX_PAGE_LIMIT, direction="forward",
                    kind=int(MessageKind.KEYS),
                )  # fmt: skip
                self._grants += [item.msg for item in page.messages]
                if (cursor := page.next_cursor) is None:
                    break
            self._grants.sort(key=lambda msg: msg.hlc)
        return self._grants

    def box_key(self, user: bytes) -> bytes | None:
        """The user's published box key (their identity, its signature checked), or None."""
        return self._box_keys(user)

    def keyring(self) -> Keyring:
        """Every key granted to this user, per sender. A grants message that does not open
        (forged, tampered, sealed with a box key not its signer's) grants nothing."""
        if self._keyring is None:
            ring = Keyring(self.chat_id)
            for msg in self.grants_messages():
                # the sender's box key from the key that signed the grants (the user's one seed
                # gives both): no identity to look up, nothing another key could stand in for
                sender_box = box_key_of_signer(msg.author_key)
                try:
                    grants = open_grants(self.key, msg.payload, sender_box)
                    ring.learn(msg.sender, grants, read_notice(msg.payload))
                    for g in grants:
                        if g.hlc is None:
                            self._starts.setdefault((msg.sender, g.key_id), msg.hlc)
                except E2eError:
                    continue
            self._keyring = ring
        return self._keyring

    def message_key(self, msg: MsgV1) -> bytes | None:
        """The key that opens a sealed message, if one was granted to this user."""
        try:
            return self.keyring().open_with_key(msg.sender, msg.hlc, msg.payload)[1]
        except E2eError:
            return None

    def open(self, msg: MsgV1) -> bytes:
        """A sealed message's text; E2eError (Undecryptable: no key reached this user)."""
        return self.keyring().open(msg.sender, msg.hlc, msg.payload)

    # --- sealing ---

    def seal(
        self, text: bytes, now: Callable[[], Hlc], members: list[Member] | None = None
    ) -> tuple[Sealed, Hlc]:
        """Seal ``text`` for the members now (``members`` given: a new group's first message,
        which the node does not know yet): the late grants this user owes, a new epoch's grants when the members
        changed, then the payload, stamped with the returned HLC."""
        new_chat = members is not None  # its first message: no grants to read back yet
        if members is None:
            members = self.client.member_list(self.chat_id)
        recipients = frozenset(m.user_id for m in members if self.box_key(m.user_id) is not None)
        left_out = sorted(m.user_id for m in members if m.user_id not in recipients)
        membership = Membership([]) if new_chat else self.membership()
        state = SenderState() if new_chat else self._sender_state(members)
        grants: list[MsgV1] = []
        late = missing_grants(
            self.chat_id, self.key.user_id, state.sent, _member_at(members), recipients,
            lambda user, key_id, hlc: (user, key_id, hlc) in state.granted,
        )  # fmt: skip
        grants += self._grant_messages(late, now)
        removals: Removed = NO_REMOVALS
        if not new_chat:
            removals = membership.removals()
            grants += self._grant_messages(self._handovers(membership, state), now)
        epoch = state.current
        stamp = now()
        if needs_new_epoch(epoch, recipients, stamp, removals):
            epoch = new_epoch(recipients, stamp, removals)
            grants += self._grant_messages(epoch_grants(epoch), now, removals)
            stamp = now()
        assert epoch is not None
        key = message_key(epoch.key, self.chat_id, self.key.user_id, stamp)
        payload = seal_group(key, epoch.key_id, self.chat_id, self.key.user_id, stamp, text)
        return Sealed(grants, payload, left_out), stamp

    def grant_past(self, user: bytes, msgs: list[MsgV1], now: Callable[[], Hlc]) -> list[MsgV1]:
        """Grants handing ``user`` the keys of those of ``msgs`` this user can open: what the
        group shows a member it adds (its name, and history when asked for)."""
        if self.box_key(user) is None:
            return []
        grants = []
        for msg in msgs:
            if not is_group_sealed(msg.payload) or (key := self.message_key(msg)) is None:
                continue
            key_id = decode_group(msg.payload).key_id
            grants.append(Grant(key_id, msg.hlc, key))
        return self._grant_messages({user: grants}, now) if grants else []

    def _grant_messages(
        self,
        grants: dict[bytes, list[Grant]],
        now: Callable[[], Hlc],
        removals: Removed = NO_REMOVALS,
    ) -> list[MsgV1]:
        box_keys = {user: key for user in grants if (key := self.box_key(user)) is not None}
        grants = {user: given for user, given in grants.items() if user in box_keys}
        return [
            MsgV1.create(self.key.signing_key, self.chat_id, now(), payload, kind=MessageKind.KEYS)
            for payload in (
                seal_grants_split(self.key, grants, box_keys, removals) if grants else []
            )
        ]

    def membership(self) -> Membership:
        """The chat's member ops as this node holds them."""
        ops: list[tuple[bytes, Hlc, bool]] = []
        cursor = None
        while True:
            page = self.client.member_ops(self.chat_id, cursor=cursor, limit=MAX_PAGE_LIMIT)
            ops += [
                (op.user_id, op.hlc, op.action == MembershipAction.ADD)
                for op in page.ops
                if isinstance(op, MembershipOp)
            ]
            if (cursor := page.next_cursor) is None:
                return Membership(ops)

    def _handovers(self, membership: Membership, state: SenderState) -> dict[bytes, list[Grant]]:
        """The keys this user hands over for removed senders (``handover_grants``). The
        chat's messages are walked back only when some removed sender's epoch left out a user
        added before that epoch ended (its sender's next epoch, or its removal) and not on
        purpose; down to the earliest such add or epoch start."""
        ring = self.keyring()
        since = _handover_window(membership, ring, self._starts)
        if since is None:
            return {}
        active = membership.active()
        wanted = self._sealed_since(since, lambda msg: msg.sender not in active)
        return handover_grants(
            ring, self.key.user_id, [(m.sender, m.hlc, m.payload) for m in wanted], membership,
            lambda user, key_id, hlc: (user, key_id, hlc) in state.granted,
        )  # fmt: skip

    def _sender_state(self, members: list[Member]) -> SenderState:
        """This user's epochs and grants, from its grants (shown and hidden)."""
        me = self.key.user_id
        own = [(m.hlc, m.payload) for m in self.grants_messages() if m.sender == me]
        epochs_only = SenderState.read(self.key, own, [])
        # only messages after an add that some epoch of ours left out can owe a grant
        behind = [
            m.added_at
            for m in members
            for epoch in epochs_only.epochs.values()
            if m.user_id not in epoch.recipients and m.added_at >= epoch.started
        ]
        if not behind:
            return epochs_only
        mine = self._sealed_since(min(behind), lambda msg: msg.sender == me)
        return SenderState.read(self.key, own, [(m.hlc, m.payload) for m in mine])

    def _sealed_since(self, since: Hlc, wanted: Callable[[MsgV1], bool]) -> list[MsgV1]:
        """The chat's sealed messages stamped at or after ``since`` that are ``wanted``,
        newest first."""
        out: list[MsgV1] = []
        cursor = None
        while True:
            page = self.client.history(
                self.chat_id, cursor=cursor, limit=MAX_PAGE_LIMIT, raw=True
            )  # backward: newest first
            for item in page.messages:
                msg = item.msg
                if msg.hlc < since:
                    return out
                if msg.kind in SEALED_KINDS and wanted(msg):
                    out.append(msg)
            if (cursor := page.next_cursor) is None:
                return out


def box_key_of_signer(author_key: bytes) -> bytes:
    """The x25519 key of the ed25519 key that signed a message (``UserKey.box_key``)."""
    return bytes(VerifyKey(author_key).to_curve25519_public_key())


def _handover_window(
    membership: Membership, ring: Keyring, starts: dict[tuple[bytes, bytes], Hlc]
) -> Hlc | None:
    """The earliest stamp a hand-over may be owed from (None: none is)."""
    active = membership.active()
    by_sender: dict[bytes, list[tuple[Hlc, bytes]]] = {}
    for (sender, key_id), start in starts.items():
        if sender not in active and (sender, key_id) in ring.notices:
            by_sender.setdefault(sender, []).append((start, key_id))
    since: Hlc | None = None
    for sender, epochs in by_sender.items():
        history = membership.histories.get(sender)
        if history is None or not history.removes:
            continue
        epochs.sort()
        ends = [start for start, _ in epochs[1:]] + [history.removes[-1]]
        for (start, key_id), end in zip(epochs, ends, strict=True):
            notice = ring.notices[(sender, key_id)]
            for user, other in membership.histories.items():
                if user in notice.recipients:
                    continue
                added = [a for a in other.adds if a < end]
                removal = notice.removed.get(user)
                if not added or (removal is not None and removal >= added[-1]):
                    continue  # never a member then, or left out on purpose
                first = max(start, added[-1])
                since = first if since is None else min(since, first)
    return since


def _member_at(members: list[Member]) -> Callable[[bytes, Hlc], bool]:
    """Whether a user was a member at a stamp, as far as the active members tell: added at or
    before it (a member removed since is no longer owed anything)."""
    added = {m.user_id: m.added_at for m in members}
    return lambda user, hlc: user in added and added[user] <= hlc
