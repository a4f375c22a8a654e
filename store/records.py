"""Records and their canonical CBOR codecs; record ids with BLAKE3.

Every record is a CBOR array whose first element is a version number. Arrays
are encoded with cbor2's canonical mode (shortest integers, definite lengths),
and a decoder re-encodes what it read and insists on the same bytes: one value
has exactly one encoding, so a content-addressed id cannot be changed by
re-encoding the same message.

Decoders take untrusted bytes and raise only ``DecodeError`` (with a
``reason``: truncated, malformed, wrong_type, unknown_version, oversize,
non_canonical, ...) — never a bare cbor2, KeyError or IndexError.

Replicated records (shipped by sync, identical on every replica):
  MsgV1         a signed chat message; id = BLAKE3(canonical bytes)
  MemberRecord  (chat, user, MemberInfo); id = BLAKE3(chat|user|role|added_at|removed_at)
  IdentityRecord (user, hlc, blob);        id = BLAKE3(user|hlc|blob)
Local records (derived per replica, never shipped): ChatMeta, InboxEntry.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from functools import cached_property
from typing import Any

import blake3
import cbor2
from nacl.signing import SigningKey

from store import signing
from store.errors import BadSignature, DecodeError, TooLarge, shown
from store.hlc import HLC_ZERO, LOGICAL_BITS, MAX_LOGICAL, MAX_PACKED, Hlc
from store.keys import CHAT_ID_LEN, MSG_ID_LEN, USER_ID_LEN, check_len

DEFAULT_MAX_PAYLOAD = 256 * 1024  # RFC-0005's per-message payload cap
MAX_IDENTITY_BLOB = 1024
MAX_PREVIEW_CHARS = 80
# Room for every field of a record around its payload or blob.
RECORD_OVERHEAD = 512

MSG_DOMAIN = b"chatsync/msg/v1\x00"


class OversizeRecord(DecodeError, TooLarge):
    """Bytes longer than the record kind allows; rejected before parsing."""

    reason = "oversize"


class MessageKind(IntEnum):
    """Message types (dm3 vocabulary, and KEYS). All but NEW and KEYS refer to another message
    by id."""

    NEW = 0
    EDIT = 1
    REPLY = 2
    REACTION = 3
    READ_RECEIPT = 4
    DELETE = 5
    KEYS = 6  # a group's key grants (client/group_e2e.py): sealed per recipient, refers to none


# the kinds that refer to no message (every other kind names its target in ``ref``)
STANDALONE = frozenset({MessageKind.NEW, MessageKind.KEYS})


class ChatKind(IntEnum):
    DM = 0
    GROUP = 1
    CHANNEL = 2


DM_CHAT_DOMAIN = b"chatsync/dm-chat/v1\x00"


def dm_chat_id(user_a: bytes, user_b: bytes) -> bytes:
    """The chat id of the direct-message chat between two users (order does not matter)."""
    low, high = sorted(
        (check_len(user_a, USER_ID_LEN, "user_id"), check_len(user_b, USER_ID_LEN, "user_id"))
    )
    return blake3_id(DM_CHAT_DOMAIN, low, high)


def is_dm_chat(chat_id: bytes, members: list[bytes] | tuple[bytes, ...]) -> bool:
    """True if ``chat_id`` is the DM chat of exactly these two members."""
    return len(members) == 2 and dm_chat_id(members[0], members[1]) == chat_id


class Role(IntEnum):
    PARTICIPANT = 0
    ADMIN = 1


def canonical_cbor(value: Any) -> bytes:
    return cbor2.dumps(value, canonical=True)


# --- hand-built canonical CBOR for the hot fixed-shape records ----------------------------
# cbor2 walks any value; a record written on every put (ChatMeta) has a fixed shape, so its
# bytes can be joined from shortest-form heads directly. Only exact ``int``/``bytes`` values
# take this path (a bool is an int to Python but not to CBOR); anything else goes to cbor2,
# and tests/store/test_fast_codecs.py checks both give the same bytes.

_U64_LIMIT = 1 << 64
_SMALL_HEADS = tuple(tuple(bytes([major | n]) for n in range(24)) for major in range(0, 256, 32))


def _head(major: int, n: int) -> bytes:
    """The canonical (shortest) head of CBOR major type ``major`` (shifted: 0x00, 0x40, ...)."""
    if n < 24:
        return _SMALL_HEADS[major >> 5][n]
    if n < 0x100:
        return bytes((major | 24, n))
    if n < 0x10000:
        return ((major | 25) << 16 | n).to_bytes(3, "big")
    if n < 0x100000000:
        return ((major | 26) << 32 | n).to_bytes(5, "big")
    return ((major | 27) << 64 | n).to_bytes(9, "big")


def _uint(n: int) -> bytes:
    """An unsigned integer below 2**64, canonically (``_head`` of major type 0, inlined)."""
    if n < 24:
        return _SMALL_HEADS[0][n]
    if n < 0x100:
        return bytes((24, n))
    if n < 0x10000:
        return (0x190000 | n).to_bytes(3, "big")
    if n < 0x100000000:
        return (0x1A00000000 | n).to_bytes(5, "big")
    return (0x1B << 64 | n).to_bytes(9, "big")


def _bstr(b: bytes) -> bytes:
    return _head(0x40, len(b)) + b


def _member_array(members: tuple[bytes, ...]) -> bytes | None:
    """ChatMeta.members as a CBOR array of byte strings (None: a member is not ``bytes``)."""
    parts = [_head(0x80, len(members))]
    for member in members:
        if type(member) is not bytes:
            return None
        parts.append(b"\x54" + member if len(member) == USER_ID_LEN else _bstr(member))
    return b"".join(parts)


def blake3_id(*parts: bytes) -> bytes:
    hasher = blake3.blake3()
    for part in parts:
        hasher.update(part)
    return hasher.digest()


# --- decoding helpers ---------------------------------------------------------------------


def load_array(data: Any, *, what: str, version: int, fields: int, max_bytes: int) -> list[Any]:
    """Parse ``data`` as a versioned CBOR array of ``fields`` items, or raise DecodeError."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DecodeError(f"{what}: expected bytes, got {type(data).__name__}", reason="wrong_type")
    if len(data) > max_bytes:
        raise OversizeRecord(f"{what}: {len(data)} bytes exceeds the limit of {max_bytes}")
    if len(data) == 0:
        raise DecodeError(f"{what}: empty input", reason="truncated")
    try:
        value = cbor2.loads(bytes(data))
    except cbor2.CBORDecodeEOF as exc:
        raise DecodeError(f"{what}: truncated CBOR ({exc})", reason="truncated") from None
    except Exception as exc:  # cbor2 raises many types on garbage; all mean the same here
        raise DecodeError(f"{what}: malformed CBOR ({exc})", reason="malformed") from None
    if not isinstance(value, list) or not value:
        raise DecodeError(f"{what}: expected a non-empty CBOR array", reason="wrong_type")
    if type(value[0]) is not int:
        raise DecodeError(f"{what}: version must be an integer", reason="wrong_type")
    if value[0] != version:
        raise DecodeError(f"{what}: unknown version {shown(value[0])}", reason="unknown_version")
    if len(value) != fields:
        raise DecodeError(
            f"{what}: expected {fields} fields, got {len(value)}", reason="wrong_type"
        )
    return value


def ensure_canonical(value: list[Any], data: bytes, what: str) -> None:
    if canonical_cbor(value) != bytes(data):
        raise DecodeError(f"{what}: not canonically encoded", reason="non_canonical")


def field_uint(value: Any, what: str, bits: int = 64) -> int:
    if type(value) is not int or not 0 <= value < (1 << bits):
        raise DecodeError(f"{what} must be an unsigned {bits}-bit integer", reason="wrong_type")
    return value


def field_bytes(
    value: Any, what: str, *, length: int | None = None, max_len: int | None = None
) -> bytes:
    if type(value) is not bytes:
        raise DecodeError(f"{what} must be a byte string", reason="wrong_type")
    if length is not None and len(value) != length:
        raise DecodeError(f"{what} must be {length} bytes, got {len(value)}", reason="wrong_length")
    if max_len is not None and len(value) > max_len:
        raise OversizeRecord(f"{what} is {len(value)} bytes, over the limit of {max_len}")
    return value


def field_hlc(value: Any, what: str) -> Hlc:
    return Hlc.unpack(field_uint(value, what))


def field_enum(value: Any, enum: type[IntEnum], what: str) -> int:
    number = field_uint(value, what, bits=8)
    try:
        return enum(number)
    except ValueError:
        raise DecodeError(f"{what}: unknown value {number}", reason="unknown_kind") from None


# --- MsgV1 --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MsgV1:
    """A chat message as its author signed it. The node stores ``payload`` without reading it."""

    chat_id: bytes
    sender: bytes  # user id = BLAKE3(author_key)[:20]
    hlc: Hlc
    kind: MessageKind
    payload: bytes
    ref: bytes | None  # the message an EDIT/REPLY/REACTION/... refers to
    author_key: bytes
    sig: bytes

    VERSION = 1

    def __post_init__(self) -> None:
        check_len(self.chat_id, CHAT_ID_LEN, "chat_id")
        check_len(self.sender, USER_ID_LEN, "sender")
        check_len(self.author_key, signing.PUBLIC_KEY_LEN, "author_key")
        check_len(self.sig, signing.SIGNATURE_LEN, "sig")
        if (self.kind in STANDALONE) != (self.ref is None):
            raise ValueError("ref is required for every kind but NEW and KEYS, forbidden for them")
        if self.ref is not None:
            check_len(self.ref, MSG_ID_LEN, "ref")

    def _body(self) -> list[Any]:
        return [
            self.VERSION,
            self.chat_id,
            self.sender,
            self.hlc.pack(),
            int(self.kind),
            self.payload,
            self.ref,
            self.author_key,
        ]

    def signed_body(self) -> bytes:
        # ``encoded`` is this body's array plus the signature (64 bytes behind a 2-byte head):
        # the body's own encoding is the same bytes under a one-shorter array head.
        return b"\x88" + self.encoded[1:-66]

    @cached_property
    def encoded(self) -> bytes:
        return self._encode_fast() or self.encode_reference()

    def encode_reference(self) -> bytes:
        """``encoded`` through cbor2: any field values (the fast path's reference in tests)."""
        return canonical_cbor([*self._body(), self.sig])

    def _encode_fast(self) -> bytes | None:
        """The canonical bytes joined by hand (None unless every byte field is exactly bytes;
        their lengths are checked on construction)."""
        chat_id, sender, payload, ref = self.chat_id, self.sender, self.payload, self.ref
        author_key, sig = self.author_key, self.sig
        if not (
            type(chat_id) is bytes
            and type(sender) is bytes
            and type(payload) is bytes
            and (ref is None or type(ref) is bytes)
            and type(author_key) is bytes
            and type(sig) is bytes
        ):
            return None
        return b"".join(
            (
                b"\x89\x01\x58\x20",  # array(9), version 1, bytes(32): the chat id
                chat_id,
                b"\x54",  # bytes(20)
                sender,
                _uint(self.hlc.pack()),
                _SMALL_HEADS[0][self.kind],  # every MessageKind is below 24
                _head(0x40, len(payload)),
                payload,
                b"\xf6" if ref is None else b"\x58\x20" + ref,  # null or bytes(32)
                b"\x58\x20",
                author_key,
                b"\x58\x40",  # bytes(64)
                sig,
            )
        )

    @cached_property
    def msg_id(self) -> bytes:
        return blake3_id(self.encoded)

    @classmethod
    def create(
        cls,
        key: SigningKey,
        chat_id: bytes,
        hlc: Hlc,
        payload: bytes,
        *,
        kind: MessageKind = MessageKind.NEW,
        ref: bytes | None = None,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
    ) -> MsgV1:
        check_payload_size(payload, max_payload)
        author_key = signing.public_key(key)
        unsigned = cls(
            chat_id,
            signing.user_id_from_key(author_key),
            hlc,
            kind,
            payload,
            ref,
            author_key,
            bytes(signing.SIGNATURE_LEN),
        )
        sig = signing.sign(key, MSG_DOMAIN, unsigned.signed_body())
        return cls(chat_id, unsigned.sender, hlc, kind, payload, ref, author_key, sig)

    def verify(self) -> None:
        """Raise BadSignature unless the author's key signed this message and owns ``sender``."""
        check_signature(*self.signature_parts())

    def signature_parts(self) -> SignatureParts:
        """What ``verify`` checks, as bytes: for a check in another process."""
        return (self.sender, self.author_key, self.signed_body(), self.sig)


# A message's sender, author key, signed body and signature (MsgV1.signature_parts)
SignatureParts = tuple[bytes, bytes, bytes, bytes]


def check_signature(sender: bytes, author_key: bytes, signed_body: bytes, sig: bytes) -> None:
    """Raise BadSignature unless ``author_key`` owns ``sender`` and signed ``signed_body``."""
    if signing.user_id_from_key(author_key) != sender:
        raise BadSignature("sender is not the id of author_key")
    signing.verify(author_key, MSG_DOMAIN, signed_body, sig)


# MsgV1.encoded: array head, version, chat id (bytes(32)), then the sender behind a one-byte
# head, then the stamp as a uint whose head byte says how long it is, then the kind.
_SENDER_AT = 4 + CHAT_ID_LEN + 1
STAMP_AT = _SENDER_AT + USER_ID_LEN  # in a stored message's ``MsgV1.encoded``: the stamp's head
_UINT_LENGTH = {24: 2, 25: 3, 26: 5, 27: 9}  # a uint's head byte -> bytes of head and value
# the stamp's head byte -> where the kind byte is: ``kind_of`` without a call, for scans
KIND_AT = tuple(STAMP_AT + _UINT_LENGTH.get(head, 1) for head in range(256))


def sender_and_kind(encoded: bytes) -> tuple[bytes, int]:
    """The sender and kind byte of a stored message's ``MsgV1.encoded``, read in place: for
    scans over this replica's own rows that need no more than these (no decode)."""
    return encoded[_SENDER_AT:STAMP_AT], kind_of(encoded)


def kind_of(encoded: bytes) -> int:
    """The kind byte of a stored message's ``MsgV1.encoded``, read in place."""
    return encoded[KIND_AT[encoded[STAMP_AT]]]


def check_payload_size(payload: bytes, max_payload: int) -> None:
    if len(payload) > max_payload:
        raise TooLarge(f"payload is {len(payload)} bytes, over the limit of {max_payload}")


_MESSAGE_KINDS = {kind.value: kind for kind in MessageKind}
_new = object.__new__
_set_physical = Hlc.__dict__["physical_ms"].__set__  # Hlc's slots, set without __init__
_set_logical = Hlc.__dict__["logical"].__set__


def _hlc_of(packed: int) -> Hlc:
    """``Hlc.unpack(packed)`` for a packed stamp known to be a u64: skips the range checks."""
    hlc = _new(Hlc)
    _set_physical(hlc, packed >> LOGICAL_BITS)
    _set_logical(hlc, packed & MAX_LOGICAL)
    return hlc


class StoredMsg(MsgV1):
    """A message of this replica's own rows, decoded when a field is first read.

    A history page makes one per row (``stored_msg``: one object and its ``encoded``, no
    decode); the page's reader pays for the fields it reads, once per message: ``kind``,
    ``sender``, ``chat_id``, ``hlc`` and ``payload`` are read in place, all five when the
    first of them is asked (what a page's fold reads), the first other field decodes the
    whole message (``decode_msg``, trusted). Equal to the ``MsgV1`` of the same bytes, and hashes
    like it. Only for bytes this replica wrote (``MsgV1.encoded`` of a checked message).

    ``encoded`` is a slot (``set_stored``), not an entry of ``__dict__``: a page's message
    whose fields nobody reads never has its dict made (a tenth of a history page's time was
    the dicts' making and freeing). The decoded fields still go to ``__dict__``.
    """

    __slots__ = ("encoded",)

    def __getattr__(self, name: str) -> Any:  # called only for what __dict__ does not hold
        try:
            data = _stored_bytes(self)
        except AttributeError:  # (made by __init__, not from a row: encode its fields)
            if name != "encoded":
                raise AttributeError(name) from None
            data = self._encode_fast() or self.encode_reference()
            set_stored(self, data)
            return data
        if name not in _MSG_FIELDS:
            raise AttributeError(name)
        fields = self.__dict__
        if name in _IN_PLACE and (placed := _read_in_place(data)) is not None:
            fields.update(placed)
            return placed[name]
        # max_payload: the row's own length (it was checked against the limit when stored)
        fields.update(decode_msg(data, max_payload=len(data), trusted=True).__dict__)
        return fields[name]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MsgV1):
            return self.encoded == other.encoded  # canonical: equal bytes, equal fields
        return NotImplemented

    def __hash__(self) -> int:
        return MsgV1.__hash__(self)


_stored_bytes = StoredMsg.__dict__["encoded"].__get__  # (AttributeError: not set)
set_stored = StoredMsg.__dict__["encoded"].__set__  # set_stored(msg, row): its bytes
_MSG_FIELDS = frozenset(MsgV1.__dataclass_fields__)
_IN_PLACE = frozenset(("kind", "sender", "chat_id", "hlc", "payload"))  # (_read_in_place)
_MSG_HEAD = b"\x89\x01\x58\x20"  # array(9), version 1, bytes(32): the chat id
_PAYLOAD_LENGTH = {0x58: 1, 0x59: 2, 0x5A: 4}  # a long bytes head -> bytes of its length


# the shortest MsgV1.encoded: stamp and kind below 24, empty payload, no ref, key, signature
_MIN_ENCODED = STAMP_AT + 3 + 1 + 2 + signing.PUBLIC_KEY_LEN + 2 + signing.SIGNATURE_LEN
_TAIL_MIN = 1 + 2 + signing.PUBLIC_KEY_LEN + 2 + signing.SIGNATURE_LEN  # no ref, key, signature


def _read_in_place(data: bytes) -> dict[str, Any] | None:
    """The fields a page's fold reads (``kind``, ``sender``, ``chat_id``, ``hlc``,
    ``payload``) of a stored message's bytes, each read at its place in the canonical
    layout — all at once: one call per message, not one per field (the folded page read
    ~11 fields of each changed message, a call each). None: bytes not laid out so (decode
    them)."""
    if type(data) is not bytes or len(data) < _MIN_ENCODED or data[:4] != _MSG_HEAD:
        return None
    head = data[STAMP_AT]
    kind_at = KIND_AT[head]
    if head < 24:
        hlc = _hlc_of(head)
    elif head in _UINT_LENGTH:
        hlc = _hlc_of(int.from_bytes(data[STAMP_AT + 1 : kind_at], "big"))
    else:
        return None
    kind = _MESSAGE_KINDS.get(data[kind_at])
    payload = _payload_of(data, kind_at + 1)
    if kind is None or payload is None:
        return None
    return {
        "sender": data[_SENDER_AT:STAMP_AT],
        "chat_id": data[4 : _SENDER_AT - 1],
        "kind": kind,
        "hlc": hlc,
        "payload": payload,
    }


def _payload_of(data: bytes, at: int) -> bytes | None:
    """The payload whose head is at ``at`` (None: a head this does not read, or a length
    that leaves no room for the fields after it)."""
    head = data[at]
    if 0x40 <= head < 0x58:
        start, length = at + 1, head - 0x40
    else:
        size = _PAYLOAD_LENGTH.get(head)
        if size is None:
            return None
        start = at + 1 + size
        length = int.from_bytes(data[at + 1 : start], "big")
    if start + length + _TAIL_MIN > len(data):
        return None
    return data[start : start + length]


def stored_msg(data: bytes) -> StoredMsg:
    """A ``StoredMsg`` of a row this replica wrote: no field decoded yet."""
    msg = _new(StoredMsg)
    set_stored(msg, data)
    return msg


def placed(msg: MsgV1) -> MsgV1:
    """``msg`` with the fields a fold reads (``_IN_PLACE``) read now, if it is a ``StoredMsg``
    that has not read them: a folded page reads them all, and the attribute miss that makes
    ``__getattr__`` read them costs as much as reading them (~1 us a message)."""
    fields = msg.__dict__
    if (
        type(msg) is StoredMsg
        and "kind" not in fields
        and (read := _read_in_place(msg.encoded)) is not None
    ):
        fields.update(read)
    return msg


def decode_msg(
    data: bytes, *, max_payload: int = DEFAULT_MAX_PAYLOAD, trusted: bool = False
) -> MsgV1:
    """The MsgV1 in ``data``, or DecodeError.

    Every field is checked inline (``_decode_msg_trusted``), then the bytes must equal the
    hand-joined canonical encoding of those fields; anything else goes through the full
    decode (cbor2, the field checks and their errors), so the answer is the full decode's
    for every input. ``trusted``: the bytes come from this replica's own RocksDB, where only
    ``MsgV1.encoded`` of checked messages is ever written (canonical by construction): the
    canonical comparison is skipped, so a non-canonical encoding (or trailing bytes) would be
    accepted there and refused here. Bytes from anywhere else — sync, gossip, HTTP — are
    never trusted.
    """
    msg = _decode_msg_trusted(data, max_payload)
    if msg is not None and (trusted or msg._encode_fast() == data):
        return msg  # (untrusted: canonical, so exactly what the full decode gives)
    return _decode_msg_full(data, max_payload)


def _decode_msg_full(data: bytes, max_payload: int) -> MsgV1:
    """decode_msg through cbor2 and the field checks, with their errors (the reference)."""
    what = "MsgV1"
    v = load_array(data, what=what, version=1, fields=9, max_bytes=max_payload + RECORD_OVERHEAD)
    ref = v[6]
    fields = (
        field_bytes(v[1], "chat_id", length=CHAT_ID_LEN),
        field_bytes(v[2], "sender", length=USER_ID_LEN),
        field_hlc(v[3], "hlc"),
        MessageKind(field_enum(v[4], MessageKind, "kind")),
        field_bytes(v[5], "payload", max_len=max_payload),
        None if ref is None else field_bytes(ref, "ref", length=MSG_ID_LEN),
        field_bytes(v[7], "author_key", length=signing.PUBLIC_KEY_LEN),
        field_bytes(v[8], "sig", length=signing.SIGNATURE_LEN),
    )
    ensure_canonical(v, data, what)
    try:
        msg = MsgV1(*fields)
    except ValueError as exc:
        raise DecodeError(f"{what}: {exc}", reason="invalid_field") from None
    msg.__dict__["encoded"] = bytes(data)  # canonical, so identical to a re-encode
    return msg


def _decode_msg_trusted(data: bytes, max_payload: int) -> MsgV1 | None:
    """decode_msg without the canonical check; None if any check fails (decode it fully)."""
    if type(data) is not bytes or len(data) > max_payload + RECORD_OVERHEAD:
        return None
    try:
        v = cbor2.loads(data)
    except Exception:
        return None
    if type(v) is not list or len(v) != 9:
        return None
    version, chat_id, sender, hlc, kind, payload, ref, author_key, sig = v
    if not (
        type(version) is int
        and version == 1
        and type(chat_id) is bytes
        and len(chat_id) == CHAT_ID_LEN
        and type(sender) is bytes
        and len(sender) == USER_ID_LEN
        and type(hlc) is int
        and 0 <= hlc <= MAX_PACKED
        and type(kind) is int
        and kind in _MESSAGE_KINDS
        and type(payload) is bytes
        and len(payload) <= max_payload
        and (ref is None if kind in STANDALONE else type(ref) is bytes and len(ref) == MSG_ID_LEN)
        and type(author_key) is bytes
        and len(author_key) == signing.PUBLIC_KEY_LEN
        and type(sig) is bytes
        and len(sig) == signing.SIGNATURE_LEN
    ):
        return None
    # What MsgV1(...) would set (its checks are the ones above), plus the cached encoding.
    msg = _new(MsgV1)
    msg.__dict__.update(
        {
            "chat_id": chat_id,
            "sender": sender,
            "hlc": _hlc_of(hlc),
            "kind": _MESSAGE_KINDS[kind],
            "payload": payload,
            "ref": ref,
            "author_key": author_key,
            "sig": sig,
            "encoded": data,
        }
    )
    return msg


# --- members ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemberInfo:
    """CRDT state of one (chat, user). Active iff removed_at is None or < added_at."""

    role: Role
    added_at: Hlc
    removed_at: Hlc | None = None
    # The signed MembershipOps that set added_at/role and removed_at (encoded), so a row
    # received by sync can be authenticated (store.ops.verify_member_record). None: unsigned
    # (tests, admin tooling); a node only accepts signed rows from peers.
    add_proof: bytes | None = None
    remove_proof: bytes | None = None

    def __post_init__(self) -> None:
        # "Never removed" has one form, None: the record id and the merge both count None as
        # ZERO, so a ZERO stamp here would be a second, differently-active spelling of it.
        if self.removed_at == HLC_ZERO:
            raise ValueError("removed_at must be None or a stamp after HLC ZERO")

    @property
    def active(self) -> bool:
        return self.removed_at is None or self.removed_at < self.added_at

    def fields(self) -> list[Any]:
        removed = None if self.removed_at is None else self.removed_at.pack()
        return [int(self.role), self.added_at.pack(), removed, self.add_proof, self.remove_proof]

    def encode(self) -> bytes:
        return canonical_cbor([1, *self.fields()])


MAX_PROOF = 512  # an encoded MembershipOp is ~270 bytes


def _member_info(v: list[Any]) -> MemberInfo:
    """MemberInfo from its five encoded fields (role, added_at, removed_at, proofs)."""
    add_proof = None if v[3] is None else field_bytes(v[3], "add_proof", max_len=MAX_PROOF)
    remove_proof = None if v[4] is None else field_bytes(v[4], "remove_proof", max_len=MAX_PROOF)
    return MemberInfo(
        Role(field_enum(v[0], Role, "role")), field_hlc(v[1], "added_at"), _removed_at(v[2]),
        add_proof, remove_proof,
    )  # fmt: skip


def _removed_at(value: Any) -> Hlc | None:
    if value is None:
        return None
    stamp = field_hlc(value, "removed_at")
    if stamp == HLC_ZERO:
        raise DecodeError("removed_at ZERO must be encoded as null", reason="non_canonical")
    return stamp


def decode_member_info(data: bytes) -> MemberInfo:
    v = load_array(data, what="MemberInfo", version=1, fields=6, max_bytes=64 + 2 * MAX_PROOF)
    info = _member_info(v[1:])
    ensure_canonical(v, data, "MemberInfo")
    return info


def compute_member_record_id(
    chat_id: bytes,
    user_id: bytes,
    role: int,
    added_at: Hlc,
    removed_at: Hlc | None,
    add_proof: bytes | None = None,
    remove_proof: bytes | None = None,
) -> bytes:
    """Seed 002: BLAKE3(chat|user|role|added_at_be|removed_at_or_zero_be). None counts as ZERO.

    A signed row appends BLAKE3 of each proof: two rows with equal stamps but different
    signed ops are different versions, so sync exchanges them and the merge picks one.
    """
    removed = removed_at if removed_at is not None else HLC_ZERO
    parts = [
        check_len(chat_id, CHAT_ID_LEN, "chat_id"),
        check_len(user_id, USER_ID_LEN, "user_id"),
        bytes([int(role)]),
        added_at.to_bytes(),
        removed.to_bytes(),
    ]
    if add_proof is not None or remove_proof is not None:
        parts += [blake3_id(add_proof or b""), blake3_id(remove_proof or b"")]
    return blake3_id(*parts)


def member_record_id(chat_id: bytes, user_id: bytes, info: MemberInfo) -> bytes:
    return compute_member_record_id(
        chat_id,
        user_id,
        info.role,
        info.added_at,
        info.removed_at,
        info.add_proof,
        info.remove_proof,
    )


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """A member row as sync ships it."""

    chat_id: bytes
    user_id: bytes
    info: MemberInfo

    def __post_init__(self) -> None:
        check_len(self.chat_id, CHAT_ID_LEN, "chat_id")
        check_len(self.user_id, USER_ID_LEN, "user_id")

    @property
    def record_id(self) -> bytes:
        return member_record_id(self.chat_id, self.user_id, self.info)

    def encode(self) -> bytes:
        return canonical_cbor([1, self.chat_id, self.user_id, *self.info.fields()])


def decode_member_record(data: bytes) -> MemberRecord:
    v = load_array(data, what="MemberRecord", version=1, fields=8, max_bytes=160 + 2 * MAX_PROOF)
    record = MemberRecord(
        field_bytes(v[1], "chat_id", length=CHAT_ID_LEN),
        field_bytes(v[2], "user_id", length=USER_ID_LEN),
        _member_info(v[3:]),
    )
    ensure_canonical(v, data, "MemberRecord")
    return record


# --- identity -----------------------------------------------------------------------------


def check_identity_blob(blob: bytes) -> None:
    if len(blob) > MAX_IDENTITY_BLOB:
        raise TooLarge(f"identity blob is {len(blob)} bytes, over the limit of {MAX_IDENTITY_BLOB}")


def encode_identity_value(hlc: Hlc, blob: bytes) -> bytes:
    """CF identity value: [hlc_packed:8][blob]."""
    check_identity_blob(blob)
    return hlc.to_bytes() + blob


def decode_identity_value(data: bytes) -> tuple[Hlc, bytes]:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DecodeError(
            f"identity value: expected bytes, got {type(data).__name__}", reason="wrong_type"
        )
    if len(data) < 8:
        raise DecodeError("identity value shorter than its 8-byte HLC prefix", reason="truncated")
    if len(data) > 8 + MAX_IDENTITY_BLOB:
        raise OversizeRecord(f"identity value is {len(data)} bytes")
    return Hlc.from_bytes(bytes(data[:8])), bytes(data[8:])


def compute_identity_record_id(user_id: bytes, hlc: Hlc, blob: bytes) -> bytes:
    """Seed 002: BLAKE3(user|hlc_packed_be|blob)."""
    return blake3_id(check_len(user_id, USER_ID_LEN, "user_id"), hlc.to_bytes(), blob)


@dataclass(frozen=True, slots=True)
class IdentityRecord:
    user_id: bytes
    hlc: Hlc
    blob: bytes

    def __post_init__(self) -> None:
        check_len(self.user_id, USER_ID_LEN, "user_id")
        check_identity_blob(self.blob)

    @property
    def record_id(self) -> bytes:
        return compute_identity_record_id(self.user_id, self.hlc, self.blob)

    def encode(self) -> bytes:
        return canonical_cbor([1, self.user_id, self.hlc.pack(), self.blob])


def decode_identity_record(data: bytes) -> IdentityRecord:
    v = load_array(
        data, what="IdentityRecord", version=1, fields=4, max_bytes=MAX_IDENTITY_BLOB + 64
    )
    record = IdentityRecord(
        field_bytes(v[1], "user_id", length=USER_ID_LEN),
        field_hlc(v[2], "hlc"),
        field_bytes(v[3], "blob", max_len=MAX_IDENTITY_BLOB),
    )
    ensure_canonical(v, data, "IdentityRecord")
    return record


# --- local records ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChatMeta:
    """Per-chat aggregate kept by each replica (seed 002). ``last_seq`` is local."""

    last_ts: int = 0  # physical ms of the newest message: sorts the inbox
    last_seq: int = 0  # local per-chat sequence counter (differs between replicas)
    last_msg_id: bytes = bytes(MSG_ID_LEN)
    members: tuple[bytes, ...] = ()  # active members, sorted
    last_msg_ts: int = 0  # packed HLC of the newest message
    last_announced_ms: int = 0  # reserved for the node's gossip announcements
    identity: bytes | None = None  # reserved for DM chats (opaque, max 128 B)
    membership_hash: bytes = bytes(32)  # XOR of the active members' ids

    def encode(self) -> bytes:
        last_ts, last_seq, last_msg_ts = self.last_ts, self.last_seq, self.last_msg_ts
        last_msg_id, members, identity = self.last_msg_id, self.members, self.identity
        announced, membership_hash = self.last_announced_ms, self.membership_hash
        if not (  # the shape every ChatMeta the store makes has; else cbor2 encodes it
            type(last_ts) is int
            and type(last_seq) is int
            and type(last_msg_ts) is int
            and type(announced) is int
            and 0 <= last_ts < _U64_LIMIT
            and 0 <= last_seq < _U64_LIMIT
            and 0 <= last_msg_ts < _U64_LIMIT
            and 0 <= announced < _U64_LIMIT
            and type(last_msg_id) is bytes
            and type(membership_hash) is bytes
            and (identity is None or type(identity) is bytes)
            and type(members) is tuple
        ):
            return self.encode_reference()
        member_bytes = _member_array(members) if members else b"\x80"  # b"\x80": empty array
        if member_bytes is None:
            return self.encode_reference()
        return b"".join(
            (
                b"\x89\x01",  # array(9), version 1
                _uint(last_ts),
                _uint(last_seq),
                b"\x58\x20" + last_msg_id if len(last_msg_id) == 32 else _bstr(last_msg_id),
                member_bytes,
                _uint(last_msg_ts),
                _uint(announced),
                b"\xf6" if identity is None else _bstr(identity),  # null
                b"\x58\x20" + membership_hash
                if len(membership_hash) == 32
                else _bstr(membership_hash),
            )
        )

    def encode_reference(self) -> bytes:
        """``encode`` through cbor2: any field values (the fast path's reference in tests)."""
        return canonical_cbor(
            [
                1,
                self.last_ts,
                self.last_seq,
                self.last_msg_id,
                list(self.members),
                self.last_msg_ts,
                self.last_announced_ms,
                self.identity,
                self.membership_hash,
            ]
        )


_CHAT_META_SLOTS = tuple(  # ChatMeta's slots in field order, set without __init__
    ChatMeta.__dict__[name].__set__
    for name in (
        "last_ts", "last_seq", "last_msg_id", "members",
        "last_msg_ts", "last_announced_ms", "identity", "membership_hash",
    )
)  # fmt: skip


def make_chat_meta(
    last_ts: int,
    last_seq: int,
    last_msg_id: bytes,
    members: tuple[bytes, ...],
    last_msg_ts: int,
    last_announced_ms: int,
    identity: bytes | None,
    membership_hash: bytes,
) -> ChatMeta:
    """``ChatMeta(...)`` with every field given, built through its slots.

    ChatMeta has no __post_init__, so this is the same object; a frozen dataclass's
    __init__ sets each field with object.__setattr__, which costs twice as much, and
    this runs on every put (merge.meta_after_messages).
    """
    meta = _new(ChatMeta)
    s0, s1, s2, s3, s4, s5, s6, s7 = _CHAT_META_SLOTS
    s0(meta, last_ts)
    s1(meta, last_seq)
    s2(meta, last_msg_id)
    s3(meta, members)
    s4(meta, last_msg_ts)
    s5(meta, last_announced_ms)
    s6(meta, identity)
    s7(meta, membership_hash)
    return meta


def decode_chat_meta(data: bytes) -> ChatMeta:
    v = load_array(data, what="ChatMeta", version=1, fields=9, max_bytes=1 << 24)
    if not isinstance(v[4], list):
        raise DecodeError("ChatMeta.members must be an array", reason="wrong_type")
    meta = ChatMeta(
        last_ts=field_uint(v[1], "last_ts"),
        last_seq=field_uint(v[2], "last_seq", bits=32),
        last_msg_id=field_bytes(v[3], "last_msg_id", length=MSG_ID_LEN),
        members=tuple(field_bytes(m, "member", length=USER_ID_LEN) for m in v[4]),
        last_msg_ts=field_uint(v[5], "last_msg_ts"),
        last_announced_ms=field_uint(v[6], "last_announced_ms"),
        identity=None if v[7] is None else field_bytes(v[7], "identity", max_len=128),
        membership_hash=field_bytes(v[8], "membership_hash", length=32),
    )
    ensure_canonical(v, data, "ChatMeta")
    return meta


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """One chat in a user's chat list (CF user_inbox)."""

    chat_id: bytes
    kind: ChatKind
    last_ts: int
    last_msg_id: bytes
    last_sender: bytes
    last_seq: int
    last_text_preview: str = ""

    def __post_init__(self) -> None:
        check_len(self.chat_id, CHAT_ID_LEN, "chat_id")
        check_len(self.last_msg_id, MSG_ID_LEN, "last_msg_id")
        check_len(self.last_sender, USER_ID_LEN, "last_sender")
        if len(self.last_text_preview) > MAX_PREVIEW_CHARS:
            object.__setattr__(
                self, "last_text_preview", self.last_text_preview[:MAX_PREVIEW_CHARS]
            )

    def encode(self) -> bytes:
        return canonical_cbor(
            [
                1,
                self.chat_id,
                int(self.kind),
                self.last_ts,
                self.last_msg_id,
                self.last_sender,
                self.last_text_preview,
                self.last_seq,
            ]
        )


_CHAT_KINDS = {kind.value: kind for kind in ChatKind}
_INBOX_SLOTS = tuple(  # InboxEntry's slots, set without __init__ (trusted decode)
    InboxEntry.__dict__[name].__set__
    for name in ("chat_id", "kind", "last_ts", "last_msg_id", "last_sender", "last_seq")
)
_set_inbox_preview = InboxEntry.__dict__["last_text_preview"].__set__


def decode_inbox_entry(data: bytes, *, trusted: bool = False) -> InboxEntry:
    """The InboxEntry in ``data``, or DecodeError. ``trusted``: as for ``decode_msg``."""
    if trusted:
        entry = _decode_inbox_entry_trusted(data)
        if entry is not None:
            return entry
    v = load_array(data, what="InboxEntry", version=1, fields=8, max_bytes=1024)
    if type(v[6]) is not str or len(v[6]) > MAX_PREVIEW_CHARS:
        raise DecodeError(
            "InboxEntry.last_text_preview must be a short string", reason="wrong_type"
        )
    entry = InboxEntry(
        chat_id=field_bytes(v[1], "chat_id", length=CHAT_ID_LEN),
        kind=ChatKind(field_enum(v[2], ChatKind, "kind")),
        last_ts=field_uint(v[3], "last_ts"),
        last_msg_id=field_bytes(v[4], "last_msg_id", length=MSG_ID_LEN),
        last_sender=field_bytes(v[5], "last_sender", length=USER_ID_LEN),
        last_seq=field_uint(v[7], "last_seq", bits=32),
        last_text_preview=v[6],
    )
    ensure_canonical(v, data, "InboxEntry")
    return entry


def _decode_inbox_entry_trusted(data: bytes) -> InboxEntry | None:
    """decode_inbox_entry without the canonical check; None if any check fails."""
    if type(data) is not bytes or len(data) > 1024:
        return None
    try:
        v = cbor2.loads(data)
    except Exception:
        return None
    if type(v) is not list or len(v) != 8:
        return None
    version, chat_id, kind, last_ts, last_msg_id, last_sender, preview, last_seq = v
    if not (
        type(version) is int
        and version == 1
        and type(chat_id) is bytes
        and len(chat_id) == CHAT_ID_LEN
        and type(kind) is int
        and kind in _CHAT_KINDS
        and type(last_ts) is int
        and 0 <= last_ts <= MAX_PACKED
        and type(last_msg_id) is bytes
        and len(last_msg_id) == MSG_ID_LEN
        and type(last_sender) is bytes
        and len(last_sender) == USER_ID_LEN
        and type(preview) is str
        and len(preview) <= MAX_PREVIEW_CHARS
        and type(last_seq) is int
        and 0 <= last_seq <= 0xFFFFFFFF
    ):
        return None
    # What InboxEntry(...) would hold (its checks are the ones above), without its __init__.
    entry = _new(InboxEntry)
    set_chat_id, set_kind, set_last_ts, set_msg_id, set_sender, set_seq = _INBOX_SLOTS
    set_chat_id(entry, chat_id)
    set_kind(entry, _CHAT_KINDS[kind])
    set_last_ts(entry, last_ts)
    set_msg_id(entry, last_msg_id)
    set_sender(entry, last_sender)
    set_seq(entry, last_seq)
    _set_inbox_preview(entry, preview)
    return entry
