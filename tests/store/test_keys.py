"""Key builders and parsers: lengths, round trips, byte order, buckets, prefixes, cursors."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from store import Hlc, InvalidInput
from store import keys as k

from store_support import hlcs

chat_ids = st.binary(min_size=32, max_size=32)
user_ids = st.binary(min_size=20, max_size=20)
ids32 = st.binary(min_size=32, max_size=32)
u32s = st.integers(0, k.U32_MAX)
u64s = st.integers(0, k.U64_MAX)

CHAT = bytes(range(32))
USER = bytes(range(100, 120))
ID32 = bytes(range(200, 232))


# --- lengths ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "length"),
    [
        (k.key_messages(CHAT, 123, 4), 44),
        (k.key_seen_msg(ID32), 32),
        (k.key_chats_meta(CHAT), 32),
        (k.key_user_inbox(USER, 5, CHAT), 60),
        (k.key_members(CHAT, USER), 52),
        (k.key_receipt(CHAT, USER, bytes(8), 7), 64),
        (k.key_identity(USER), 20),
        (k.key_seen_member(ID32), 32),
        (k.key_seen_identity(ID32), 32),
    ],
    ids=[
        "messages",
        "seen_msg",
        "chats_meta",
        "user_inbox",
        "members",
        "receipts",
        "identity",
        "seen_member",
        "seen_identity",
    ],
)
def test_key_lengths(key: bytes, length: int) -> None:
    assert len(key) == length


def test_length_constants() -> None:
    assert k.MESSAGES_KEY_LEN == 44
    assert k.USER_INBOX_KEY_LEN == 60
    assert k.MEMBERS_KEY_LEN == 52
    assert k.RECEIPTS_KEY_LEN == 64
    assert k.MEMBER_OPS_KEY_LEN == 92 == len(k.key_member_ops(CHAT, USER, 1, ID32))
    assert k.NUM_BUCKETS == 65_536


def test_key_layouts_are_big_endian_concatenations() -> None:
    assert k.key_messages(CHAT, 0x0102, 0x03) == CHAT + bytes(6) + b"\x01\x02" + bytes(3) + b"\x03"
    assert k.key_user_inbox(USER, 1, CHAT) == USER + bytes(7) + b"\x01" + CHAT
    assert k.key_members(CHAT, USER) == CHAT + USER
    assert (
        k.key_receipt(CHAT, USER, b"\x09" * 8, 7) == CHAT + USER + b"\x09" * 8 + bytes(3) + b"\x07"
    )
    assert k.key_identity(USER) == USER
    assert k.key_seen_msg(ID32) == k.key_seen_member(ID32) == k.key_seen_identity(ID32) == ID32
    assert k.key_by_ref(CHAT, ID32, bytes(32)) == CHAT + ID32 + bytes(32)
    assert len(k.key_by_ref(CHAT, ID32, bytes(32))) == k.BY_REF_KEY_LEN == 96


# --- round trips --------------------------------------------------------------------------


@given(chat_ids, u64s, u32s)
def test_messages_key_round_trip(chat: bytes, hlc: int, seq: int) -> None:
    assert k.parse_key_messages(k.key_messages(chat, hlc, seq)) == (chat, hlc, seq)


@given(chat_ids, user_ids, u64s, u32s)
def test_seq_of_reads_the_seq_every_seq_ending_key_ends_with(
    chat: bytes, user: bytes, hlc: int, seq: int
) -> None:
    messages_key = k.key_messages(chat, hlc, seq)
    for key in (
        messages_key,
        k.key_hidden(chat, seq),
        k.key_receipt(chat, user, hlc.to_bytes(8, "big"), seq),
        k.key_messages(chat, k.U64_MAX, 0) + messages_key,  # a referred row: target | referrer
    ):
        assert k.seq_of(key) == seq


@given(user_ids, u64s, chat_ids)
def test_user_inbox_key_round_trip(user: bytes, rev: int, chat: bytes) -> None:
    assert k.parse_key_user_inbox(k.key_user_inbox(user, rev, chat)) == (user, rev, chat)


@given(chat_ids, user_ids)
def test_members_key_round_trip(chat: bytes, user: bytes) -> None:
    assert k.parse_key_members(k.key_members(chat, user)) == (chat, user)


@given(ids32, user_ids, chat_ids)
def test_single_id_keys_are_the_id(record_id: bytes, user: bytes, chat: bytes) -> None:
    assert k.key_seen_msg(record_id) == record_id
    assert k.key_seen_member(record_id) == record_id
    assert k.key_seen_identity(record_id) == record_id
    assert k.key_chats_meta(chat) == chat
    assert k.key_identity(user) == user


def test_builders_accept_bytearray_and_memoryview() -> None:
    assert k.key_members(bytearray(CHAT), memoryview(USER)) == CHAT + USER
    assert type(k.key_identity(bytearray(USER))) is bytes


# --- wrong lengths ------------------------------------------------------------------------

Builder = Callable[[bytes], Any]

# (builder with one id slot open, that slot's expected length)
ID_SLOTS: list[tuple[str, Builder, int]] = [
    ("messages.chat", lambda b: k.key_messages(b, 1, 1), 32),
    ("seen_msg", k.key_seen_msg, 32),
    ("chats_meta", k.key_chats_meta, 32),
    ("user_inbox.user", lambda b: k.key_user_inbox(b, 1, CHAT), 20),
    ("user_inbox.chat", lambda b: k.key_user_inbox(USER, 1, b), 32),
    ("members.chat", lambda b: k.key_members(b, USER), 32),
    ("members.user", lambda b: k.key_members(CHAT, b), 20),
    ("receipts.chat", lambda b: k.key_receipt(b, USER, bytes(8), 1), 32),
    ("receipts.user", lambda b: k.key_receipt(CHAT, b, bytes(8), 1), 20),
    ("receipts.position", lambda b: k.key_receipt(CHAT, USER, b, 1), 8),
    ("identity", k.key_identity, 20),
    ("seen_member", k.key_seen_member, 32),
    ("seen_identity", k.key_seen_identity, 32),
    ("bucket_of", k.bucket_of, 32),
    ("parse_messages", k.parse_key_messages, 44),
    ("parse_user_inbox", k.parse_key_user_inbox, 60),
    ("parse_members", k.parse_key_members, 52),
]


@pytest.mark.parametrize(
    ("builder", "length"), [(b, n) for _, b, n in ID_SLOTS], ids=[name for name, _, _ in ID_SLOTS]
)
@pytest.mark.parametrize(
    "wrong_size",
    [lambda n: n - 1, lambda n: n + 1, lambda n: 0, lambda n: 2 * n],
    ids=["short", "long", "empty", "double"],
)
def test_wrong_length_ids_raise_value_error(
    builder: Builder, length: int, wrong_size: Callable[[int], int]
) -> None:
    assert builder(b"\x07" * length) is not None  # the right length works
    with pytest.raises(ValueError, match="bytes"):
        builder(b"\x07" * wrong_size(length))


@pytest.mark.parametrize(
    ("builder", "length"), [(b, n) for _, b, n in ID_SLOTS], ids=[name for name, _, _ in ID_SLOTS]
)
def test_non_bytes_ids_raise_value_error(builder: Builder, length: int) -> None:
    with pytest.raises(ValueError, match="must be bytes"):
        builder("x" * length)  # type: ignore[arg-type]


@given(st.binary().filter(lambda b: len(b) != 32))
def test_any_wrong_length_chat_id_raises(chat: bytes) -> None:
    with pytest.raises(ValueError):
        k.key_messages(chat, 0, 0)
    with pytest.raises(ValueError):
        k.key_members(chat, USER)


@pytest.mark.parametrize(
    "call",
    [
        lambda: k.key_messages(CHAT, -1, 0),
        lambda: k.key_messages(CHAT, k.U64_MAX + 1, 0),
        lambda: k.key_messages(CHAT, 0, -1),
        lambda: k.key_messages(CHAT, 0, k.U32_MAX + 1),
        lambda: k.key_user_inbox(USER, -1, CHAT),
        lambda: k.key_user_inbox(USER, k.U64_MAX + 1, CHAT),
        lambda: k.rev_ts(-1),
        lambda: k.rev_ts(k.U64_MAX + 1),
    ],
)
def test_out_of_range_integers_raise_value_error(call: Callable[[], Any]) -> None:
    with pytest.raises(ValueError, match="range"):
        call()


# The widths are the layout's (seed 002), written out rather than taken from k.U32_MAX and
# k.U64_MAX: a test that derives its bounds from the constants cannot catch a wrong constant.
@pytest.mark.parametrize(
    ("build", "bits", "length"),
    [
        (lambda n: k.key_messages(CHAT, 0, n), 32, 44),
        (lambda n: k.key_messages(CHAT, n, 0), 64, 44),
        (lambda n: k.key_hidden(CHAT, n), 32, 36),
        (lambda n: k.key_user_inbox(USER, n, CHAT), 64, 60),
        (lambda n: k.key_member_ops(CHAT, USER, n, ID32), 64, 92),
    ],
    ids=["messages.seq", "messages.hlc", "hidden.seq", "user_inbox.rev_ts", "member_ops.hlc"],
)
def test_integer_fields_hold_their_whole_width_and_no_more(
    build: Callable[[int], bytes], bits: int, length: int
) -> None:
    width = bits // 8
    top, zero = build((1 << bits) - 1), build(0)
    assert len(top) == len(zero) == length  # the layout's widths (seed 002)
    assert top.count(b"\xff" * width) == 1
    start = top.index(b"\xff" * width)
    assert zero[start : start + width] == bytes(width)
    assert top[:start] + top[start + width :] == zero[:start] + zero[start + width :]
    for outside in (-1, 1 << bits):
        with pytest.raises(ValueError, match="range"):
            build(outside)


def test_parsers_read_every_byte_of_each_field() -> None:
    # No zero byte in the integers: a field read from one byte too far differs.
    hlc = int.from_bytes(bytes(range(1, 9)), "big")
    seq = int.from_bytes(bytes(range(9, 13)), "big")
    assert k.parse_key_messages(CHAT + hlc.to_bytes(8, "big") + seq.to_bytes(4, "big")) == (
        CHAT,
        hlc,
        seq,
    )
    assert k.parse_key_user_inbox(USER + hlc.to_bytes(8, "big") + CHAT) == (USER, hlc, CHAT)


@given(hlcs, u32s)
def test_a_seen_value_gives_the_physical_ms_of_its_stamp(hlc: Hlc, seq: int) -> None:
    # seen_msg values are the message's messages-CF key (RETENTION.md): GC reads the age there
    value = k.key_messages(CHAT, hlc.pack(), seq)
    assert k.extract_hlc_physical_from_seen_value(value) == hlc.physical_ms
    assert k.extract_hlc_physical_from_seen_value(b"") == 0  # legacy: the first GC clears it
    assert k.extract_hlc_physical_from_seen_value(value[:-1]) is None


# --- order --------------------------------------------------------------------------------


@given(st.lists(st.tuples(hlcs, u32s), max_size=40))
def test_message_key_order_is_hlc_then_seq(entries: list[tuple[Hlc, int]]) -> None:
    by_value = sorted(entries, key=lambda e: (e[0], e[1]))
    by_key = sorted(entries, key=lambda e: k.key_messages(CHAT, e[0].pack(), e[1]))
    assert [k.key_messages(CHAT, h.pack(), s) for h, s in by_value] == [
        k.key_messages(CHAT, h.pack(), s) for h, s in by_key
    ]


@given(chat_ids, chat_ids, hlcs, hlcs, u32s, u32s)
def test_message_keys_group_by_chat(
    chat_a: bytes, chat_b: bytes, h1: Hlc, h2: Hlc, s1: int, s2: int
) -> None:
    key_a = k.key_messages(chat_a, h1.pack(), s1)
    key_b = k.key_messages(chat_b, h2.pack(), s2)
    if chat_a != chat_b:
        assert (key_a < key_b) == (chat_a < chat_b)
    else:
        assert (key_a < key_b) == ((h1, s1) < (h2, s2))


@given(u64s, u64s)
def test_rev_ts_sorts_newer_first(a: int, b: int) -> None:
    key_a = k.key_user_inbox(USER, k.rev_ts(a), CHAT)
    key_b = k.key_user_inbox(USER, k.rev_ts(b), CHAT)
    assert (key_a < key_b) == (a > b)
    assert k.rev_ts(a) == k.U64_MAX - a
    assert k.rev_ts(k.rev_ts(a)) == a


def test_rev_ts_extremes() -> None:
    assert k.rev_ts(0) == k.U64_MAX
    assert k.rev_ts(k.U64_MAX) == 0


# --- buckets and prefixes -----------------------------------------------------------------


@given(ids32)
def test_bucket_of_is_the_first_two_bytes(record_id: bytes) -> None:
    bucket = k.bucket_of(record_id)
    assert 0 <= bucket < k.NUM_BUCKETS
    assert bucket == record_id[0] * 256 + record_id[1]
    assert record_id.startswith(k.bucket_prefix(bucket))


@given(st.integers(0, k.NUM_BUCKETS - 1))
def test_bucket_prefix_round_trip(bucket: int) -> None:
    prefix = k.bucket_prefix(bucket)
    assert len(prefix) == 2
    assert k.bucket_of(prefix + bytes(30)) == bucket


@pytest.mark.parametrize("bucket", [-1, k.NUM_BUCKETS, 1 << 20])
def test_bucket_prefix_out_of_range(bucket: int) -> None:
    with pytest.raises(ValueError, match=r"bucket out of range 0\.\.65535"):
        k.bucket_prefix(bucket)


@given(st.binary(min_size=1, max_size=8), st.binary(max_size=10))
def test_prefix_end_bounds_exactly_the_prefixed_keys(prefix: bytes, key: bytes) -> None:
    end = k.prefix_end(prefix)
    if end is None:  # all 0xff: every key from the prefix on starts with it
        assert prefix == b"\xff" * len(prefix)
        assert (key >= prefix) == key.startswith(prefix)
        return
    assert end > prefix
    assert not end.startswith(prefix)
    inside = prefix <= key < end
    assert inside == key.startswith(prefix)


messages_keys = st.builds(k.key_messages, chat_ids, u64s, u32s)


@given(messages_keys, messages_keys, messages_keys)
@example(CHAT + bytes(12), b"\xff" * 44, CHAT + bytes(11) + b"\x01")  # the greatest referrer
def test_referred_end_bounds_exactly_the_rows_of_its_target(
    target: bytes, referrer: bytes, other: bytes
) -> None:
    """A referred row is [target's key][referrer's key]: every one of the target's sorts from
    the target's key up to referred_end, every other target's outside."""
    end = k.referred_end(target)
    assert target < target + referrer < end
    assert (target <= other + referrer < end) == (other == target)


def test_prefix_end_examples() -> None:
    assert k.prefix_end(b"\x00\x01") == b"\x00\x02"
    assert k.prefix_end(b"\x00\xff") == b"\x01"
    assert k.prefix_end(b"a\xff\xff") == b"b"
    assert k.prefix_end(b"\xff\xff") is None
    assert k.prefix_end(b"") is None


# --- cursors ------------------------------------------------------------------------------


@given(st.binary(max_size=80))
def test_cursor_round_trip(key: bytes) -> None:
    cursor = k.encode_cursor(key)
    assert isinstance(cursor, str)
    assert "+" not in cursor and "/" not in cursor  # URL-safe alphabet
    assert k.decode_cursor(cursor, len(key), b"") == key
    assert k.decode_cursor(cursor, len(key), key[:3]) == key


@given(st.binary(max_size=80), st.text(max_size=80))
def test_cursors_are_base64s_urlsafe_pair(key: bytes, text: str) -> None:
    """encode_cursor / decode_cursor call binascii: base64's urlsafe pair's bytes and errors."""
    assert k.encode_cursor(key) == base64.urlsafe_b64encode(key).decode("ascii")
    try:
        want: bytes | None = base64.urlsafe_b64decode(text.encode("ascii"))
    except (binascii.Error, ValueError):
        want = None
    try:
        got: bytes | None = k.decode_cursor(text, len(want) if want is not None else 0, b"")
    except InvalidInput:
        got = None
    assert got == want


@pytest.mark.parametrize(
    "cursor",
    [
        "!!!",  # not base64 at all
        "abc",  # bad padding
        "é",  # not ASCII
        k.encode_cursor(CHAT + bytes(11)),  # one byte short
        k.encode_cursor(CHAT + bytes(13)),  # one byte long
        k.encode_cursor(b"\x01" * 32 + bytes(12)),  # another prefix
        "",
    ],
)
def test_bad_cursors_raise_invalid_input(cursor: str) -> None:
    with pytest.raises(InvalidInput) as info:
        k.decode_cursor(cursor, 44, CHAT)
    assert info.value.reason == "bad_cursor"


@given(st.text(max_size=30))
def test_any_text_cursor_is_a_key_or_invalid_input(cursor: str) -> None:
    try:
        key = k.decode_cursor(cursor, 4, b"")
    except InvalidInput as exc:
        assert exc.reason == "bad_cursor"
    else:
        assert len(key) == 4
