"""A group member's keys, gathered from the node: the I/O around ``client/group_e2e.py``.

Everything comes from the replicated chat, nothing from local state: the grants (messages of
kind KEYS, ``GET /chats/{chat}/messages?kind=6``), the members with their add stamps, and the
members' box keys from their verified identities. So any node, and any device of the user
holding the key file, seals and opens the same way.

Cost: one page walk over the chat's grants per command (a few per membership change and
sender), and a backward walk over the chat's newest messages only when a member was added
behind a sender's epoch (down to that add's stamp) for the late grants.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nacl.signing import VerifyKey

from client.e2e import E2eError, UserKey
from client.group_e2e import (
    Grant,
    Keyring,
    SenderState,
    decode_group,
    epoch_grants,
    is_group_sealed,
    message_key,
    missing_grants,
    needs_new_epoch,
    new_epoch,
    open_grants,
    seal_grants_split,
    seal_group,
)
from client.http import ChatsyncClient, Member
from store.hlc import Hlc
from store.messages import MAX_PAGE_LIMIT
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

    # --- reading ---

    def grants_messages(self) -> list[MsgV1]:
        if self._grants is None:
            self._grants = []
            cursor = None
            while True:
                page = self.client.history(
                    self.chat_id, cursor=cursor, limit=MAX_PAGE_LIMIT, direction="forward",
                    kind=int(MessageKind.KEYS),
                )  # fmt: skip
                self._grants += [item.msg for item in page.messages]
                if (cursor := page.next_cursor) is None:
                    break
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
                    ring.learn(msg.sender, open_grants(self.key, msg.payload, sender_box))
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
        state = SenderState() if new_chat else self._sender_state(members)
        grants: list[MsgV1] = []
        late = missing_grants(
            self.chat_id, self.key.user_id, state.sent, _member_at(members), recipients,
            lambda user, key_id, hlc: (user, key_id, hlc) in state.granted,
        )  # fmt: skip
        grants += self._grant_messages(late, now)
        epoch = state.current
        stamp = now()
        if needs_new_epoch(epoch, recipients, stamp):
            epoch = new_epoch(recipients, stamp)
            grants += self._grant_messages(epoch_grants(epoch), now)
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
        self, grants: dict[bytes, list[Grant]], now: Callable[[], Hlc]
    ) -> list[MsgV1]:
        box_keys = {user: self.box_key(user) or b"" for user in grants}
        return [
            MsgV1.create(self.key.signing_key, self.chat_id, now(), payload, kind=MessageKind.KEYS)
            for payload in seal_grants_split(self.key, grants, box_keys)
        ]

    def _sender_state(self, members: list[Member]) -> SenderState:
        me = self.key.user_id
        own = [(m.hlc, m.payload) for m in self.grants_messages() if m.sender == me]
        epochs_only = SenderState.read(self.key, own, [])
        # only messages after an add that some epoch of ours left out can owe a late grant
        behind = [
            m.added_at
            for m in members
            for epoch in epochs_only.epochs.values()
            if m.user_id not in epoch.recipients and m.added_at >= epoch.started
        ]
        if not behind:
            return epochs_only
        return SenderState.read(self.key, own, self._own_sealed_since(min(behind)))

    def _own_sealed_since(self, since: Hlc) -> list[tuple[Hlc, bytes]]:
        """This user's sealed messages stamped at or after ``since``, newest first."""
        out: list[tuple[Hlc, bytes]] = []
        cursor = None
        while True:
            page = self.client.history(
                self.chat_id, cursor=cursor, limit=MAX_PAGE_LIMIT, raw=True
            )  # backward: newest first
            for item in page.messages:
                msg = item.msg
                if msg.hlc < since:
                    return out
                if msg.sender == self.key.user_id and msg.kind in SEALED_KINDS:
                    out.append((msg.hlc, msg.payload))
            if (cursor := page.next_cursor) is None:
                return out


def box_key_of_signer(author_key: bytes) -> bytes:
    """The x25519 key of the ed25519 key that signed a message (``UserKey.box_key``)."""
    return bytes(VerifyKey(author_key).to_curve25519_public_key())


def _member_at(members: list[Member]) -> Callable[[bytes, Hlc], bool]:
    """Whether a user was a member at a stamp, as far as the active members tell: added at or
    before it (a member removed since is no longer owed anything)."""
    added = {m.user_id: m.added_at for m in members}
    return lambda user, hlc: user in added and added[user] <= hlc
