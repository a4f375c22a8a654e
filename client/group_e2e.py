"""End-to-end encryption of group messages by sender keys that follow the membership. Pure.

The node never reads a payload; this is the client's side (SECURITY.md, "Group encryption").

* **Epoch keys.** Each sender encrypts under a key of its own, an *epoch key* (32 random
  bytes, named by a 16-byte id derived from it). Every message gets its own key, derived
  from the epoch key and the message's place (chat, sender, HLC) with BLAKE3's key
  derivation, and is sealed with XChaCha20-Poly1305 (libsodium, through pynacl) with that
  place as associated data: a ciphertext moved into another message does not open.
* **Grants.** A sender hands keys out in *grants*, sealed per recipient with NaCl ``Box``
  (their x25519 key from their verified identity): an epoch grant (the epoch key: every
  message of that epoch) or a message grant (one message's key: the epoch key stays hidden).
  Grants travel as ordinary signed messages of the chat, so sync and gossip carry them,
  retention ages them out and erasure erases them like any message.
* **Rotation follows the membership.** A sender's epoch names its recipients: the chat's
  active members as the sender saw them. Before each message the sender compares them with
  the members it sees now; any difference — an add or a removal — starts a new epoch whose
  key goes to the members now. So once a removal reaches a sender, its later messages are
  sealed under a key the removed member never got; a member added later gets no key of an
  earlier epoch, so reads from their add on. Epochs also end after ``EPOCH_MESSAGES``
  messages or ``EPOCH_MS``, which bounds what one leaked epoch key opens.
* **Concurrent adds.** A sender that learns of an add stamped before some of its messages
  (the add was concurrent: it arrived later) gives the added member message grants for
  exactly those messages (``missing_grants``): whatever the arrival order, once every op
  has arrived, every member reads every message sent while they were a member.
* **Hand-overs.** A sender removed before it learnt of such an add can no longer grant (a
  removed member's messages are refused). One member who reads the message — the active
  member with the lowest id among its epoch's recipients — hands its key over instead
  (``handover_grants``). Every grants message names, in clear, the removals its sender had
  seen (membership the node holds anyway), and a sender starts a new epoch when that list
  changes: so a hand-over never reaches a member whose removal the sender had seen.
* **Hidden grants count.** A grants message stamped while its sender was, unknown to it,
  removed is hidden like any such message, yet it boxes the keys of valid messages (its
  sender's before the removal or after a re-add) to the recipients the sender saw: readers
  take keys from hidden grants as from shown ones, so a sender removed twice before it
  learns still leaves its messages readable. It gives no one more than a shown grant would.

A sender's state is not kept anywhere but in the chat: its own grants include itself, so
its epochs are read back from the replicated messages (``Keyring``).
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import blake3
from nacl.bindings import (
    crypto_aead_xchacha20poly1305_ietf_decrypt,
    crypto_aead_xchacha20poly1305_ietf_encrypt,
)
from nacl.exceptions import CryptoError
from nacl.public import Box, PublicKey

from client.e2e import E2eError, UserKey
from store.access import MemberHistory
from store.errors import DecodeError
from store.hlc import Hlc
from store.keys import USER_ID_LEN
from store.ops import BOX_KEY_LEN
from store.records import canonical_cbor, ensure_canonical, field_bytes, load_array

KEY_LEN = 32
KEY_ID_LEN = 16
NONCE_LEN = 24
GROUP_MESSAGE_VERSION = 2  # a DM envelope's is 1: the two never open as each other
GRANTS_VERSION = 4
MAX_RECIPIENTS = 1_000  # per grants message: ~100 bytes each, well under a payload's limit
MAX_REMOVED = 1_000  # removals a grants message names: the newest (40 bytes each)
MAX_GRANTS = 1_000  # per recipient in one message
MAX_GROUP_PAYLOAD = 512 * 1024  # above any node's payload limit: the node's is the one that counts
EPOCH_MESSAGES = 1_000
EPOCH_MS = 7 * 24 * 3600 * 1000

_KEY_ID_CONTEXT = "chatsync 2026-11 group epoch key id"
_MESSAGE_KEY_CONTEXT = "chatsync 2026-11 group message key"


class Undecryptable(E2eError):
    """No key for this message has reached the reader (yet, or ever)."""


def key_id_of(epoch_key: bytes) -> bytes:
    return blake3.blake3(epoch_key, derive_key_context=_KEY_ID_CONTEXT).digest()[:KEY_ID_LEN]


def _place(chat_id: bytes, sender: bytes, hlc: Hlc) -> bytes:
    return chat_id + sender + hlc.to_bytes()


def message_key(epoch_key: bytes, chat_id: bytes, sender: bytes, hlc: Hlc) -> bytes:
    """The key of one message: a one-way function of the epoch key and the message's place."""
    material = epoch_key + _place(chat_id, sender, hlc)
    return blake3.blake3(material, derive_key_context=_MESSAGE_KEY_CONTEXT).digest()


# --- message payloads --------------------------------------------------------------------------


def seal_group(
    msg_key: bytes, key_id: bytes, chat_id: bytes, sender: bytes, hlc: Hlc, plaintext: bytes
) -> bytes:
    """A group message's payload: ``[2, key_id, nonce, ciphertext]`` in canonical CBOR."""
    nonce = os.urandom(NONCE_LEN)
    aad = _place(chat_id, sender, hlc) + key_id
    sealed = crypto_aead_xchacha20poly1305_ietf_encrypt(plaintext, aad, nonce, msg_key)
    return canonical_cbor([GROUP_MESSAGE_VERSION, key_id, nonce, sealed])


@dataclass(frozen=True)
class GroupEnvelope:
    key_id: bytes
    nonce: bytes
    sealed: bytes


def decode_group(payload: bytes) -> GroupEnvelope:
    try:
        v = load_array(
            payload, what="group message", version=GROUP_MESSAGE_VERSION, fields=4,
            max_bytes=MAX_GROUP_PAYLOAD,
        )  # fmt: skip
        env = GroupEnvelope(
            field_bytes(v[1], "key_id", length=KEY_ID_LEN),
            field_bytes(v[2], "nonce", length=NONCE_LEN),
            field_bytes(v[3], "sealed"),
        )
        ensure_canonical(v, payload, "group message")
    except DecodeError as exc:
        raise E2eError(f"not a group message: {exc}") from None
    return env


def is_group_sealed(payload: bytes) -> bool:
    """Whether ``payload`` has the shape of a sealed group message (cheap: no decryption)."""
    try:
        decode_group(payload)
    except E2eError:
        return False
    return True


def open_group(msg_key: bytes, chat_id: bytes, sender: bytes, hlc: Hlc, payload: bytes) -> bytes:
    env = decode_group(payload)
    aad = _place(chat_id, sender, hlc) + env.key_id
    try:
        return bytes(
            crypto_aead_xchacha20poly1305_ietf_decrypt(env.sealed, aad, env.nonce, msg_key)
        )
    except CryptoError:
        raise E2eError(
            "group message does not decrypt (tampered, or not this message's key)"
        ) from None


# --- reactions ----------------------------------------------------------------------------------

REACTION_NONCE_LEN = NONCE_LEN
MAX_SEALED_REACTION = 24  # bytes of reaction text: nonce + text + tag fit a 64-byte reaction key
_REACTION_KEY_CONTEXT = "chatsync 2026-11 group reaction key"


def _reaction_key(target_key: bytes) -> bytes:
    return blake3.blake3(target_key, derive_key_context=_REACTION_KEY_CONTEXT).digest()


def seal_reaction(target_key: bytes, reaction: bytes) -> bytes:
    """A reaction's key, sealed so that the node cannot read it but groups equal reactions:
    deterministic (the nonce is a keyed hash of the reaction) under a key derived from the
    target message's — whoever reads the message reads its reactions."""
    if not 1 <= len(reaction) <= MAX_SEALED_REACTION:
        raise ValueError(f"a sealed reaction is 1..{MAX_SEALED_REACTION} bytes of text")
    key = _reaction_key(target_key)
    nonce = blake3.blake3(reaction, key=key).digest()[:REACTION_NONCE_LEN]
    return nonce + crypto_aead_xchacha20poly1305_ietf_encrypt(reaction, None, nonce, key)


def open_reaction(target_key: bytes, sealed: bytes) -> bytes:
    key = _reaction_key(target_key)
    nonce, body = sealed[:REACTION_NONCE_LEN], sealed[REACTION_NONCE_LEN:]
    try:
        reaction = bytes(crypto_aead_xchacha20poly1305_ietf_decrypt(body, None, nonce, key))
    except CryptoError:
        raise E2eError("not a reaction sealed for this message") from None
    if blake3.blake3(reaction, key=key).digest()[:REACTION_NONCE_LEN] != nonce:
        raise E2eError("a sealed reaction whose nonce is not its own: two keys for one reaction")
    return reaction


# --- grants ------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Grant:
    """A key handed to a recipient: an epoch's key (``hlc`` None) or one message's."""

    key_id: bytes
    hlc: Hlc | None
    key: bytes

    def row(self) -> list[object]:
        return [self.key_id, None if self.hlc is None else self.hlc.pack(), self.key]


Removed = frozenset[tuple[bytes, Hlc]]  # (user, their latest removal) as a sender saw it
NO_REMOVALS: Removed = frozenset()
LATEST = Hlc.unpack((1 << 64) - 1)  # after every stamp: a member's state now


class Membership:
    """A chat's member ops as one member holds them ((user, stamp, is_add)): who is in now,
    who was at a stamp and by which add, whom it saw removed. ``always``: members without
    ops of their own (a model's creator)."""

    def __init__(self, ops: Iterable[tuple[bytes, Hlc, bool]], always: Iterable[bytes] = ()):
        stamps: dict[bytes, list[tuple[Hlc, bool]]] = {}
        for user, hlc, is_add in ops:
            stamps.setdefault(user, []).append((hlc, is_add))
        self.histories = {user: MemberHistory.of(pairs) for user, pairs in stamps.items()}
        self.always = frozenset(always)

    def active(self) -> frozenset[bytes]:
        now = {u for u, h in self.histories.items() if h.active_at(LATEST)}
        return frozenset(now | self.always)

    def deciding_add(self, user: bytes, hlc: Hlc) -> Hlc | None:
        """The add that makes ``user`` a member at ``hlc`` (None: no member then)."""
        if user in self.always:
            return Hlc(0)
        history = self.histories.get(user)
        if history is None or not history.active_at(hlc):
            return None
        return history.adds[bisect_right(history.adds, hlc) - 1]

    def removals(self) -> Removed:
        """The users removed now, each with their latest removal; the newest ``MAX_REMOVED``."""
        gone = [
            (user, h.removes[-1])
            for user, h in self.histories.items()
            if h.removes and user not in self.always and not h.active_at(LATEST)
        ]
        gone.sort(key=lambda pair: (pair[1], pair[0]), reverse=True)
        return frozenset(gone[:MAX_REMOVED])


def seal_grants(
    sender: UserKey,
    grants: dict[bytes, list[Grant]],
    box_keys: dict[bytes, bytes],
    removed: Removed = NO_REMOVALS,
) -> bytes:
    """A grants message's payload: ``[4, sender_box_key, removed, [[recipient, box_key,
    boxed], ...]]``, each recipient's grants boxed to the box key their identity publishes
    (``box_keys``); ``removed``: ``[user, packed stamp]`` per removal the sender had seen."""
    if not 1 <= len(grants) <= MAX_RECIPIENTS:
        raise ValueError(f"a grants message names 1..{MAX_RECIPIENTS} recipients")
    if len(removed) > MAX_REMOVED:
        raise ValueError(f"a grants message names at most {MAX_REMOVED} removals")
    rows = []
    sender_box = sender.box_private  # derived from the ed25519 key on every read: once here
    for recipient in sorted(grants):
        given = sorted(grants[recipient], key=lambda g: (g.key_id, g.hlc is not None, g.hlc))
        if not 1 <= len(given) <= MAX_GRANTS:
            raise ValueError(f"1..{MAX_GRANTS} grants per recipient")
        box = Box(sender_box, PublicKey(box_keys[recipient]))
        boxed = bytes(box.encrypt(canonical_cbor([1, [g.row() for g in given]])))
        rows.append([recipient, box_keys[recipient], boxed])
    gone = [[user, hlc.pack()] for user, hlc in sorted(removed)]
    return canonical_cbor([GRANTS_VERSION, sender.box_key, gone, rows])


def open_grants(reader: UserKey, payload: bytes, sender_box_key: bytes) -> list[Grant]:
    """The grants addressed to ``reader`` in a grants message (none: not a recipient).

    ``sender_box_key``: the box key the message's sender published (their verified
    identity); the message's signature binds the payload to that sender.
    """
    box_key, _, rows = _decode_grants(payload)
    if box_key != sender_box_key:
        raise E2eError("the grants' sender key is not the key the sender published")
    mine = [row for row in rows if type(row) is list and len(row) == 3 and row[0] == reader.user_id]
    if not mine:
        return []
    _, sealed_to, boxed = mine[0]
    if sealed_to != reader.box_key or type(boxed) is not bytes:
        raise E2eError("grants: this recipient's entry is not sealed to its box key")
    try:
        plain = bytes(Box(reader.box_private, PublicKey(box_key)).decrypt(boxed))
    except CryptoError:
        raise E2eError("grants do not decrypt (tampered, or not for this key)") from None
    return _decode_grant_rows(plain)


@dataclass(frozen=True)
class Notice:
    """What a grants message tells every member in clear: whom it grants to, and the removals
    its sender had seen (the membership the node holds anyway)."""

    recipients: frozenset[bytes]
    removed: dict[bytes, Hlc]


def read_notice(payload: bytes) -> Notice:
    _, removed, rows = _decode_grants(payload)
    recipients = frozenset(row[0] for row in rows if type(row) is list and row and type(row[0]) is bytes)  # fmt: skip
    return Notice(recipients, removed)


def _decode_grants(payload: bytes) -> tuple[bytes, dict[bytes, Hlc], list[Any]]:
    """A grants message's sender box key, the removals it names and its recipients' rows
    (shape checked, not opened)."""
    try:
        v = load_array(
            payload, what="grants", version=GRANTS_VERSION, fields=4, max_bytes=MAX_GROUP_PAYLOAD
        )
        box_key = field_bytes(v[1], "sender_box_key", length=BOX_KEY_LEN)
        removed = _decode_removed(v[2])
        rows = v[3]
        if type(rows) is not list or not 1 <= len(rows) <= MAX_RECIPIENTS:
            raise DecodeError(f"grants: 1..{MAX_RECIPIENTS} recipients")
        ensure_canonical(v, payload, "grants")
    except DecodeError as exc:
        raise E2eError(f"not a grants message: {exc}") from None
    return box_key, removed, rows


def _decode_removed(value: object) -> dict[bytes, Hlc]:
    if type(value) is not list or len(value) > MAX_REMOVED:
        raise DecodeError(f"grants: at most {MAX_REMOVED} removals")
    out: dict[bytes, Hlc] = {}
    for row in value:
        if type(row) is not list or len(row) != 2:
            raise DecodeError("a removal is [user, packed stamp]")
        user = field_bytes(row[0], "removed user", length=USER_ID_LEN)
        if type(row[1]) is not int or not 0 <= row[1] < 1 << 64 or user in out:
            raise DecodeError("a removal's stamp is a packed u64, once per user")
        out[user] = Hlc.unpack(row[1])
    return out


def _decode_grant_rows(plain: bytes) -> list[Grant]:
    try:
        v = load_array(plain, what="grant rows", version=1, fields=2, max_bytes=MAX_GROUP_PAYLOAD)[
            1
        ]
        if type(v) is not list or not 1 <= len(v) <= MAX_GRANTS:
            raise DecodeError(f"1..{MAX_GRANTS} grants")
        grants = []
        for row in v:
            if type(row) is not list or len(row) != 3:
                raise DecodeError("a grant is [key_id, hlc or null, key]")
            hlc = row[1]
            if hlc is not None and (type(hlc) is not int or not 0 <= hlc < 1 << 64):
                raise DecodeError("a grant's hlc is a packed u64")
            grants.append(
                Grant(
                    field_bytes(row[0], "key_id", length=KEY_ID_LEN),
                    None if hlc is None else Hlc.unpack(hlc),
                    field_bytes(row[2], "key", length=KEY_LEN),
                )
            )
    except (DecodeError, ValueError) as exc:
        raise E2eError(f"grants: {exc}") from None
    return grants


# --- what a reader holds -----------------------------------------------------------------------


@dataclass
class Keyring:
    """The keys one reader got for one chat. An epoch key opens only its own sender's messages
    (only that sender grants it: a member cannot stand in for another's epoch). A message key
    may come from any member — the one who adds someone hands over what the group shows new
    members — so each message keeps every candidate: a wrong one fails to open, nothing else."""

    chat_id: bytes
    epochs: dict[tuple[bytes, bytes], bytes] = field(default_factory=dict)  # (sender, id) -> key
    messages: dict[tuple[bytes, Hlc], list[bytes]] = field(default_factory=dict)  # (id, hlc)
    notices: dict[tuple[bytes, bytes], Notice] = field(default_factory=dict)  # an epoch's

    def learn(self, sender: bytes, grants: Iterable[Grant], notice: Notice | None = None) -> None:
        """``notice``: the grants message's, kept beside the epochs it grants (hand-overs)."""
        for g in grants:
            if g.hlc is None:
                if key_id_of(g.key) != g.key_id:
                    continue  # a key that is not what it claims: worthless, and not kept
                self.epochs[(sender, g.key_id)] = g.key
                if notice is not None:
                    self.notices[(sender, g.key_id)] = notice
            else:
                candidates = self.messages.setdefault((g.key_id, g.hlc), [])
                if g.key not in candidates:
                    candidates.append(g.key)

    def keys_for(self, sender: bytes, hlc: Hlc, key_id: bytes) -> list[bytes]:
        """The keys that may open ``sender``'s message at ``hlc`` sealed under ``key_id``."""
        epoch = self.epochs.get((sender, key_id))
        derived = [] if epoch is None else [message_key(epoch, self.chat_id, sender, hlc)]
        return derived + self.messages.get((key_id, hlc), [])

    def open_with_key(self, sender: bytes, hlc: Hlc, payload: bytes) -> tuple[bytes, bytes]:
        """(the text, the key that opened it); Undecryptable if no key reached this reader."""
        env = decode_group(payload)
        keys = self.keys_for(sender, hlc, env.key_id)
        if not keys:
            raise Undecryptable("no key for this message has reached this member")
        error: E2eError | None = None
        for key in keys:
            try:
                return open_group(key, self.chat_id, sender, hlc, payload), key
            except E2eError as exc:
                error = exc
        assert error is not None
        raise error

    def open(self, sender: bytes, hlc: Hlc, payload: bytes) -> bytes:
        return self.open_with_key(sender, hlc, payload)[0]


# --- what a sender does ------------------------------------------------------------------------


@dataclass(frozen=True)
class Epoch:
    key: bytes
    recipients: frozenset[bytes]
    started: Hlc
    sent: int = 0  # messages sealed under it
    removed: Removed = NO_REMOVALS  # the removals its sender had seen when it started it

    @property
    def key_id(self) -> bytes:
        return key_id_of(self.key)


def needs_new_epoch(
    epoch: Epoch | None, members: frozenset[bytes], now: Hlc, removed: Removed = NO_REMOVALS
) -> bool:
    """Whether a sender must start an epoch before sealing: it has none, the members or the
    removals it sees changed (an add or a removal), or the epoch is used up."""
    return (
        epoch is None
        or epoch.recipients != members
        or epoch.removed != removed
        or epoch.sent >= EPOCH_MESSAGES
        or now.physical_ms - epoch.started.physical_ms >= EPOCH_MS
    )


def new_epoch(members: frozenset[bytes], now: Hlc, removed: Removed = NO_REMOVALS) -> Epoch:
    return Epoch(os.urandom(KEY_LEN), members, now, removed=removed)


def epoch_grants(epoch: Epoch) -> dict[bytes, list[Grant]]:
    """The epoch's key for each of its recipients (the sender among them)."""
    grant = Grant(epoch.key_id, None, epoch.key)
    return {member: [grant] for member in epoch.recipients}


def seal_epoch(sender: UserKey, epoch: Epoch, box_keys: dict[bytes, bytes]) -> list[bytes]:
    """The grants messages' payloads that hand ``epoch``'s key to each of its recipients."""
    return seal_grants_split(sender, epoch_grants(epoch), box_keys, epoch.removed)


def seal_grants_split(
    sender: UserKey,
    grants: dict[bytes, list[Grant]],
    box_keys: dict[bytes, bytes],
    removed: Removed = NO_REMOVALS,
) -> list[bytes]:
    """``grants`` as grants messages' payloads, ``MAX_RECIPIENTS`` recipients to a message (a
    large group's epoch takes several)."""
    recipients = sorted(grants)
    return [
        seal_grants(
            sender, {r: grants[r] for r in recipients[at : at + MAX_RECIPIENTS]}, box_keys, removed
        )
        for at in range(0, len(recipients), MAX_RECIPIENTS)
    ]


@dataclass(frozen=True)
class SentMessage:
    hlc: Hlc
    epoch: Epoch


def missing_grants(
    chat_id: bytes,
    sender: bytes,
    sent: Iterable[SentMessage],
    member_at: Callable[[bytes, Hlc], bool],
    members: Iterable[bytes],
    granted: Callable[[bytes, bytes, Hlc], bool],
) -> dict[bytes, list[Grant]]:
    """Message grants for members who were members at a message's stamp but are not among its
    epoch's recipients (an add the sender learnt of late), and have no grant for it yet."""
    out: dict[bytes, list[Grant]] = {}
    everyone = list(members)
    for message in sent:
        epoch = message.epoch
        for user in everyone:
            if user in epoch.recipients or not member_at(user, message.hlc):
                continue
            if granted(user, message.epoch.key_id, message.hlc):
                continue
            key = message_key(message.epoch.key, chat_id, sender, message.hlc)
            out.setdefault(user, []).append(Grant(message.epoch.key_id, message.hlc, key))
    return out


def handover_grants(
    ring: Keyring,
    me: bytes,
    messages: Iterable[tuple[bytes, Hlc, bytes]],
    members: Membership,
    handed: Callable[[bytes, bytes, Hlc], bool],
) -> dict[bytes, list[Grant]]:
    """Message grants ``me`` hands over for senders who can no longer grant their own.

    ``messages``: the chat's sealed messages (sender, stamp, payload); ``handed``: whether
    ``me`` already granted (user, key id, stamp). A message qualifies when its sender is no
    active member, ``me`` holds its epoch's key, and ``me`` has the lowest id among the
    epoch's recipients still active (one member hands over, not all). It goes to each user
    who was a member at its stamp and whom the epoch left out — unless its sender had seen a
    removal of theirs as recent as the add that made them one: then it left them out on
    purpose."""
    out: dict[bytes, list[Grant]] = {}
    active = members.active()
    for sender, hlc, payload in messages:
        if sender in active:
            continue  # still a member: it grants its own (missing_grants)
        try:
            key_id = decode_group(payload).key_id
        except E2eError:
            continue
        notice = ring.notices.get((sender, key_id))
        epoch_key = ring.epochs.get((sender, key_id))
        if notice is None or epoch_key is None:
            continue
        if min((u for u in notice.recipients if u in active), default=None) != me:
            continue
        for user in sorted(members.histories.keys() - notice.recipients):
            added_at = members.deciding_add(user, hlc)
            if added_at is None or handed(user, key_id, hlc):
                continue
            removal = notice.removed.get(user)
            if removal is not None and removal >= added_at:
                continue
            key = message_key(epoch_key, ring.chat_id, sender, hlc)
            out.setdefault(user, []).append(Grant(key_id, hlc, key))
    return out


def open_own_grants(sender: UserKey, payload: bytes) -> dict[bytes, list[Grant]]:
    """Every recipient's grants in a grants message ``sender`` sent (``Box`` is symmetric: the
    sender opens what it sealed for each recipient)."""
    _, _, rows = _decode_grants(payload)
    out: dict[bytes, list[Grant]] = {}
    sender_box = sender.box_private
    for row in rows:
        if type(row) is list and len(row) == 3 and type(row[0]) is bytes:
            _, sealed_to, boxed = row
            try:
                box = Box(sender_box, PublicKey(_box_key_of(sealed_to)))
                out[row[0]] = _decode_grant_rows(bytes(box.decrypt(boxed)))
            except (CryptoError, TypeError):
                raise E2eError("own grants do not decrypt: not sent by this key") from None
    return out


def _box_key_of(value: object) -> bytes:
    try:
        return field_bytes(value, "sender_box_key", length=BOX_KEY_LEN)
    except DecodeError as exc:
        raise E2eError(f"grants: {exc}") from None


@dataclass
class SenderState:
    """A sender's epochs, what it sealed and whom it granted what, read back from the chat:
    its own grants messages (it is always among the recipients) and its own group messages."""

    epochs: dict[bytes, Epoch] = field(default_factory=dict)  # key id -> epoch
    current: Epoch | None = None
    sent: list[SentMessage] = field(default_factory=list)
    granted: set[tuple[bytes, bytes, Hlc]] = field(default_factory=set)  # (user, key id, hlc)

    @classmethod
    def read(
        cls,
        me: UserKey,
        own_grants: Iterable[tuple[Hlc, bytes]],
        own_messages: Iterable[tuple[Hlc, bytes]],
    ) -> SenderState:
        """``own_grants``: shown and hidden alike (a reader takes keys from both)."""
        state = cls()
        latest: Hlc | None = None
        for hlc, payload in sorted(own_grants, key=lambda pair: pair[0]):
            removed = frozenset(read_notice(payload).removed.items())
            for user, grants in open_own_grants(me, payload).items():
                for g in grants:
                    if g.hlc is not None:
                        state.granted.add((user, g.key_id, g.hlc))
                        continue
                    epoch = state.epochs.get(g.key_id) or Epoch(
                        g.key, frozenset(), hlc, removed=removed
                    )
                    recipients = epoch.recipients | {user}
                    state.epochs[g.key_id] = replace(epoch, recipients=recipients)
                    if latest is None or hlc >= latest:
                        latest = hlc
                        state.current = state.epochs[g.key_id]
        counts: dict[bytes, int] = {}
        for hlc, payload in own_messages:
            try:
                key_id = decode_group(payload).key_id
            except E2eError:
                continue  # not sealed (an old plain message): nothing to grant
            if (used := state.epochs.get(key_id)) is not None:
                state.sent.append(SentMessage(hlc, used))
                counts[key_id] = counts.get(key_id, 0) + 1
        if state.current is not None:
            current = state.epochs[state.current.key_id]  # with every recipient gathered
            state.current = replace(current, sent=counts.get(current.key_id, 0))
        return state
