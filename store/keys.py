"""Key builders and parsers for every column family (seed 002, "Key Construction").

All integers are big-endian so that RocksDB's bytewise order is numeric order:
a chat's messages iterate oldest first, a user's inbox newest first
(``rev_ts = u64::MAX - last_ts``). Id lengths are fixed because the prefix
extractors depend on them; a wrong length is a programming error here
(``ValueError``), never a silently wrong key.
"""

from __future__ import annotations

import binascii

from store.errors import InvalidInput

USER_ID_LEN = 20
CHAT_ID_LEN = 32
MSG_ID_LEN = 32
RECORD_ID_LEN = 32
BUCKET_PREFIX_LEN = 2
NUM_BUCKETS = 1 << (8 * BUCKET_PREFIX_LEN)

U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1

MESSAGES_KEY_LEN = CHAT_ID_LEN + 8 + 4  # 44
USER_INBOX_KEY_LEN = USER_ID_LEN + 8 + CHAT_ID_LEN  # 60
MEMBERS_KEY_LEN = CHAT_ID_LEN + USER_ID_LEN  # 52
RECEIPTS_KEY_LEN = CHAT_ID_LEN + USER_ID_LEN + 8 + 4  # 64
MEMBER_OPS_KEY_LEN = CHAT_ID_LEN + USER_ID_LEN + 8 + RECORD_ID_LEN  # 92
BY_REF_KEY_LEN = CHAT_ID_LEN + MSG_ID_LEN + MSG_ID_LEN  # 96: deletes, refs


def check_len(value: bytes, expected: int, what: str) -> bytes:
    if type(value) is bytes and len(value) == expected:
        return value  # the common case, on every key built: skip the isinstance and the copy
    if not isinstance(value, bytes | bytearray | memoryview):
        raise ValueError(f"{what} must be bytes, got {type(value).__name__}")
    if len(value) != expected:
        raise ValueError(f"{what} must be {expected} bytes, got {len(value)}")
    return bytes(value)


def _u64(value: int, what: str) -> bytes:
    if not 0 <= value <= U64_MAX:
        raise ValueError(f"{what} out of u64 range: {value}")
    return value.to_bytes(8, "big")


def _u32(value: int, what: str) -> bytes:
    if not 0 <= value <= U32_MAX:
        raise ValueError(f"{what} out of u32 range: {value}")
    return value.to_bytes(4, "big")


# messages: [chat_id:32][hlc_packed:8][seq:4]
def key_messages(chat_id: bytes, hlc_packed: int, seq: int) -> bytes:
    if 0 <= hlc_packed <= U64_MAX and 0 <= seq <= U32_MAX:  # put_messages' hot path: inline
        chat = check_len(chat_id, CHAT_ID_LEN, "chat_id")
        return chat + hlc_packed.to_bytes(8, "big") + seq.to_bytes(4, "big")
    return check_len(chat_id, CHAT_ID_LEN, "chat_id") + _u64(hlc_packed, "hlc") + _u32(seq, "seq")


def seq_of(key: bytes) -> int:
    """The local seq a key ends with: a messages key, and the rows that end in one (hidden,
    receipts, referred)."""
    return int.from_bytes(key[-4:], "big")


def parse_key_messages(key: bytes) -> tuple[bytes, int, int]:
    check_len(key, MESSAGES_KEY_LEN, "messages key")
    return key[:32], int.from_bytes(key[32:40], "big"), int.from_bytes(key[40:44], "big")


# seen_msg: [msg_id:32]; seen_member / seen_identity: [record_id:32]
def key_seen_msg(msg_id: bytes) -> bytes:
    return check_len(msg_id, MSG_ID_LEN, "msg_id")


def key_seen_member(record_id: bytes) -> bytes:
    return check_len(record_id, RECORD_ID_LEN, "record_id")


def key_seen_identity(record_id: bytes) -> bytes:
    return check_len(record_id, RECORD_ID_LEN, "record_id")


# chats_meta: [chat_id:32]
def key_chats_meta(chat_id: bytes) -> bytes:
    return check_len(chat_id, CHAT_ID_LEN, "chat_id")


# user_inbox: [user:20][rev_ts:8][chat_id:32]
def rev_ts(last_ts: int) -> int:
    _u64(last_ts, "last_ts")
    return U64_MAX - last_ts


def key_user_inbox(user_id: bytes, rev: int, chat_id: bytes) -> bytes:
    return (
        check_len(user_id, USER_ID_LEN, "user_id")
        + _u64(rev, "rev_ts")
        + check_len(chat_id, CHAT_ID_LEN, "chat_id")
    )


def parse_key_user_inbox(key: bytes) -> tuple[bytes, int, bytes]:
    check_len(key, USER_INBOX_KEY_LEN, "user_inbox key")
    return key[:20], int.from_bytes(key[20:28], "big"), key[28:60]


# members: [chat_id:32][user:20]
def key_members(chat_id: bytes, user_id: bytes) -> bytes:
    return check_len(chat_id, CHAT_ID_LEN, "chat_id") + check_len(user_id, USER_ID_LEN, "user_id")


def parse_key_members(key: bytes) -> tuple[bytes, bytes]:
    check_len(key, MEMBERS_KEY_LEN, "members key")
    return key[:32], key[32:52]


# member_ops: [chat_id:32][user:20][hlc_packed:8][op_id:32] — one (chat, user)'s ops, oldest first
def key_member_ops(chat_id: bytes, user_id: bytes, hlc_packed: int, op_id: bytes) -> bytes:
    return (
        key_members(chat_id, user_id)
        + _u64(hlc_packed, "hlc")
        + check_len(op_id, RECORD_ID_LEN, "op_id")
    )


# hidden: [chat_id:32][seq:4] — a stored message its sender was not active to send
def key_hidden(chat_id: bytes, seq: int) -> bytes:
    return check_len(chat_id, CHAT_ID_LEN, "chat_id") + _u32(seq, "seq")


# deletes: [chat_id:32][ref:32][delete id:32] — a chat's DELETE messages by the id they name
# refs: [chat_id:32][ref:32][msg id:32] — held messages that refer to ``ref`` (-> their key)
def key_by_ref(chat_id: bytes, ref: bytes, msg_id: bytes) -> bytes:
    return (
        check_len(chat_id, CHAT_ID_LEN, "chat_id")
        + check_len(ref, MSG_ID_LEN, "ref")
        + check_len(msg_id, MSG_ID_LEN, "msg_id")
    )


# referred: [target's messages key:44][referrer's messages key:44] — a held edit or reaction
# of a held message (store.messages, read by store.views)
def referred_end(target_key: bytes) -> bytes:
    """A key past every referred row of ``target_key`` (and before the next target's)."""
    return check_len(target_key, MESSAGES_KEY_LEN, "messages key") + b"\xff" * (
        MESSAGES_KEY_LEN + 1
    )


# receipts: [chat_id:32][user:20][position:8][seq:4] -> the receipt's messages key (store.reads)
def key_receipt(chat_id: bytes, user_id: bytes, position: bytes, seq: int) -> bytes:
    return (
        check_len(chat_id, CHAT_ID_LEN, "chat_id")
        + check_len(user_id, USER_ID_LEN, "user_id")
        + check_len(position, 8, "position")
        + _u32(seq, "seq")
    )


# identity: [user_id:20]
def key_identity(user_id: bytes) -> bytes:
    return check_len(user_id, USER_ID_LEN, "user_id")


def bucket_of(record_id: bytes) -> int:
    """Merkle bucket of a record id: its first two bytes, big-endian (0..65535)."""
    return int.from_bytes(check_len(record_id, RECORD_ID_LEN, "record_id")[:2], "big")


def bucket_range_keys(start: int, end: int) -> tuple[bytes, bytes | None]:
    """The key range of buckets ``start <= b < end`` in a column family keyed by record id."""
    if not 0 <= start <= end <= NUM_BUCKETS:
        raise ValueError(f"bucket range {start}..{end} outside 0..{NUM_BUCKETS}")
    upper = None if end == NUM_BUCKETS else end.to_bytes(BUCKET_PREFIX_LEN, "big")
    return start.to_bytes(BUCKET_PREFIX_LEN, "big"), upper


def bucket_prefix(bucket: int) -> bytes:
    if not 0 <= bucket < NUM_BUCKETS:
        raise ValueError(f"bucket out of range 0..{NUM_BUCKETS - 1}: {bucket}")
    return bucket.to_bytes(BUCKET_PREFIX_LEN, "big")


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no such key)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


_TO_URLSAFE = bytes.maketrans(b"+/", b"-_")
_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")


def encode_cursor(key: bytes) -> str:
    """A pagination cursor: the last key of a page, URL-safe base64 (``base64``'s
    ``urlsafe_b64encode``, without its two Python calls: one per page)."""
    return binascii.b2a_base64(key, newline=False).translate(_TO_URLSAFE).decode("ascii")


def decode_cursor(cursor: str, key_len: int, prefix: bytes) -> bytes:
    """The key inside ``cursor``; InvalidInput unless it is ``key_len`` bytes under ``prefix``."""
    try:
        # = base64.urlsafe_b64decode, its non-alphabet bytes discarded as there
        key = binascii.a2b_base64(cursor.encode("ascii").translate(_FROM_URLSAFE))
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise InvalidInput("cursor is not valid base64", reason="bad_cursor") from None
    if len(key) != key_len or not key.startswith(prefix):
        raise InvalidInput("cursor does not belong to this listing", reason="bad_cursor")
    return key


def extract_hlc_physical_from_seen_value(value: bytes) -> int | None:
    """Physical ms of the packed HLC at bytes 32..40 of a seen_msg value.

    Empty (legacy) values count as 0 so the first GC pass clears them; any other
    length is not a seen_msg value and gives None.
    """
    if len(value) == 0:
        return 0
    if len(value) != MESSAGES_KEY_LEN and len(value) != MESSAGES_KEY_LEN + 8:
        return None  # (+ 8: a shown message's event position, store.events)
    return int.from_bytes(value[32:40], "big") >> 16
