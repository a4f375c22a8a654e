"""Bad input: each kind raises its own exception, and nothing at all is written.

Every test starts from a populated database, makes the bad call, and compares every key and
value of every column family before and after (plus the public counts: for_each_msg_id,
get_chat_meta), so a half-written batch cannot hide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import (
    BadSignature,
    ChatDb,
    ChatKind,
    ClockDriftError,
    DecodeError,
    Hlc,
    InboxEntry,
    InvalidInput,
    MemberInfo,
    MessageKind,
    MsgV1,
    OversizeRecord,
    Role,
    TooLarge,
)
from store.hlc import HLC_ZERO
from store.records import (
    DEFAULT_MAX_PAYLOAD,
    MAX_IDENTITY_BLOB,
    canonical_cbor,
    decode_identity_record,
    decode_member_record,
    decode_msg,
)
from store.signing import public_key, user_id_from_key

from store_support import CHATS, KEYS, USERS, dump_all, fresh_db, make_msg, msg_ids, receipt_of

CHAT, CHAT2, _ = CHATS
ALICE, BOB = USERS[:2]
NOW = 1_767_225_600_000


def entry(chat: bytes, last_ts: int) -> InboxEntry:
    return InboxEntry(chat, ChatKind.GROUP, last_ts, b"\x01" * 32, ALICE, 3, "hello")


@pytest.fixture
def full_db(db: ChatDb) -> Iterator[ChatDb]:
    """Something of every kind already stored."""
    db.put_messages([make_msg(CHAT, Hlc(NOW - i)) for i in range(3)])
    db.add_member_synced(CHAT, ALICE, Role.ADMIN, Hlc(NOW))
    db.remove_member_synced(CHAT, BOB, Hlc(NOW))
    db.put_identity(ALICE, Hlc(NOW), b"alice-key")
    db.upsert_inbox_for_members(CHAT, [ALICE, BOB], entry(CHAT, NOW))
    db.upsert_inbox_for_members(CHAT2, [ALICE], entry(CHAT2, NOW - 5))
    read = make_msg(CHAT, Hlc(NOW - 1))
    db.put_messages([receipt_of(read, Hlc(NOW))])
    yield db


def assert_rejected(
    db: ChatDb, call: Callable[[], Any], exc: type[BaseException], reason: str | None = None
) -> BaseException:
    """``call`` raises ``exc`` (with ``reason``) and leaves every column family as it was."""
    before = dump_all(db)
    ids = sorted(msg_ids(db))
    metas = [db.get_chat_meta(c) for c in CHATS]
    with pytest.raises(exc) as info:
        call()
    if reason is not None:
        assert isinstance(info.value, InvalidInput)
        assert info.value.reason == reason
    assert dump_all(db) == before
    assert sorted(msg_ids(db)) == ids
    assert [db.get_chat_meta(c) for c in CHATS] == metas
    return info.value


def ingest(db: ChatDb, raw: bytes, now_ms: int | None = NOW) -> None:
    """What the ingress does with a message from a peer: decode, verify, store."""
    msg = decode_msg(raw, max_payload=db.config.max_payload)
    msg.verify()
    db.put_message(msg, now_ms=now_ms)


# --- wrong-length ids ---------------------------------------------------------------------

SHORT_CHAT, LONG_CHAT, SHORT_USER = CHAT[:31], CHAT + b"\x00", ALICE[:19]

WRONG_ID_CALLS: dict[str, Callable[[ChatDb], Any]] = {
    "range": lambda db: db.range(SHORT_CHAT),
    "add_member.chat": lambda db: db.add_member_synced(SHORT_CHAT, ALICE, Role.ADMIN, Hlc(NOW + 1)),
    "add_member.user": lambda db: db.add_member_synced(CHAT, SHORT_USER, Role.ADMIN, Hlc(NOW + 1)),
    "remove_member": lambda db: db.remove_member_synced(LONG_CHAT, ALICE, Hlc(NOW + 1)),
    "apply_member_record": lambda db: db.apply_member_record_synced(
        CHAT, ALICE + b"\x00", MemberInfo(Role.ADMIN, Hlc(NOW + 1))
    ),
    "apply_member_states.second": lambda db: db.apply_member_states(
        [
            (CHAT, BOB, MemberInfo(Role.ADMIN, Hlc(NOW + 5))),  # valid, must not land
            (CHAT, SHORT_USER, MemberInfo(Role.ADMIN, Hlc(NOW + 5))),
        ]
    ),
    "get_member_info": lambda db: db.get_member_info(SHORT_CHAT, ALICE),
    "list_members": lambda db: db.list_members(SHORT_CHAT),
    "put_identity": lambda db: db.put_identity(SHORT_USER, Hlc(NOW + 1), b"x"),
    "get_identity": lambda db: db.get_identity(SHORT_USER),
    "read_position.user": lambda db: db.read_position(CHAT, SHORT_USER),
    "read_position.chat": lambda db: db.read_position(LONG_CHAT, ALICE),
    "unread_count.chat": lambda db: db.unread_count(LONG_CHAT, ALICE, None),
    "upsert_inbox.second_user": lambda db: db.upsert_inbox_for_members(
        CHAT, [BOB, SHORT_USER], entry(CHAT, NOW + 10)
    ),
    "upsert_inbox.chat": lambda db: db.upsert_inbox_for_members(
        SHORT_CHAT, [ALICE], entry(CHAT, NOW + 10)
    ),
    "delete_inbox.user": lambda db: db.delete_user_inbox_entry(SHORT_USER, CHAT),
    # a 31-byte suffix of a stored chat id must not delete that chat's entry
    "delete_inbox.chat_suffix": lambda db: db.delete_user_inbox_entry(ALICE, CHAT[1:]),
    "delete_inbox.chat_empty": lambda db: db.delete_user_inbox_entry(ALICE, b""),
    "list_user_chats": lambda db: db.list_user_chats(SHORT_USER),
    "range_delete": lambda db: db.range_delete_old_messages(SHORT_CHAT, NOW),
    "bucket": lambda db: db.get_bucket_msg_ids(1 << 16),
    "member_bucket": lambda db: db.get_bucket_member_ids(-1),
}


@pytest.mark.parametrize("call", WRONG_ID_CALLS.values(), ids=WRONG_ID_CALLS.keys())
def test_wrong_length_ids_raise_value_error_and_write_nothing(
    full_db: ChatDb, call: Callable[[ChatDb], Any]
) -> None:
    error = assert_rejected(full_db, lambda: call(full_db), ValueError)
    assert not isinstance(error, InvalidInput)  # local misuse, not outside input


@pytest.mark.parametrize(
    "change",
    [
        {"chat_id": SHORT_CHAT},
        {"sender": SHORT_USER},
        {"author_key": b"\x00" * 31},
        {"sig": b"\x00" * 65},
        {"ref": b"\x00" * 31, "kind": MessageKind.EDIT},
    ],
)
def test_a_message_with_wrong_length_ids_cannot_exist(change: dict[str, Any]) -> None:
    msg = make_msg(CHAT, Hlc(1))
    fields = {**msg.__dict__, **change}
    fields.pop("encoded", None)
    fields.pop("msg_id", None)
    with pytest.raises(ValueError):
        MsgV1(**fields)


# --- garbage, truncated or tampered bytes -------------------------------------------------

GOOD = make_msg(CHAT, Hlc(NOW + 1), b"fresh")


@pytest.mark.parametrize(
    ("raw", "exc", "reason"),
    [
        (b"", DecodeError, "truncated"),
        (GOOD.encoded[:-1], DecodeError, "truncated"),
        (GOOD.encoded[:40], DecodeError, "truncated"),
        (b"\xff\x00garbage", DecodeError, "malformed"),
        (b"\x01", DecodeError, "wrong_type"),
        (GOOD.encoded + b"\x00", DecodeError, "non_canonical"),
        (b"\x9f" + GOOD.encoded[1:] + b"\xff", DecodeError, "non_canonical"),
        (b"\x89\x02" + GOOD.encoded[2:], DecodeError, "unknown_version"),
        (GOOD.encoded[:-1] + bytes([GOOD.encoded[-1] ^ 1]), BadSignature, "bad_signature"),
    ],
    ids=[
        "empty",
        "cut_1",
        "cut_40",
        "garbage",
        "int",
        "trailing",
        "indefinite",
        "version",
        "bad_sig",
    ],
)
def test_bad_message_bytes_are_rejected_before_any_write(
    full_db: ChatDb, raw: bytes, exc: type[InvalidInput], reason: str
) -> None:
    assert_rejected(full_db, lambda: ingest(full_db, raw), exc, reason)
    ingest(full_db, GOOD.encoded)  # the intact bytes go in
    assert full_db.get_message(GOOD.msg_id) == GOOD


@settings(max_examples=25)
@given(st.binary(max_size=200))
def test_random_bytes_never_reach_the_store(raw: bytes) -> None:
    with fresh_db() as db:
        db.put_message(make_msg(CHAT, Hlc(NOW)))
        with pytest.raises(InvalidInput):
            ingest(db, raw)
        assert len(msg_ids(db)) == 1


def test_bad_member_and_identity_records_are_rejected(full_db: ChatDb) -> None:
    def apply_member(raw: bytes) -> None:
        record = decode_member_record(raw)
        full_db.apply_member_record_synced(record.chat_id, record.user_id, record.info)

    def apply_identity(raw: bytes) -> None:
        record = decode_identity_record(raw)
        full_db.put_identities([record])

    zero_removal = canonical_cbor([1, CHAT, ALICE, 1, Hlc(NOW + 9).pack(), 0, None, None])
    assert_rejected(full_db, lambda: apply_member(zero_removal), DecodeError, "non_canonical")
    assert_rejected(full_db, lambda: apply_member(b"\x86\x01"), DecodeError, "truncated")
    assert_rejected(full_db, lambda: apply_identity(b"\xa0"), DecodeError, "wrong_type")
    big = canonical_cbor([1, ALICE, Hlc(NOW + 9).pack(), b"\x00" * (MAX_IDENTITY_BLOB + 1)])
    assert_rejected(full_db, lambda: apply_identity(big), OversizeRecord, "oversize")


def test_corrupt_stored_member_row_raises_and_writes_nothing(full_db: ChatDb) -> None:
    batch = full_db.new_batch()
    batch.put(CHAT + USERS[2], b"\xff\xff", full_db.rocks.handle["members"])
    full_db.write(batch)
    assert_rejected(
        full_db,
        lambda: full_db.apply_member_states(
            [
                (CHAT2, ALICE, MemberInfo(Role.ADMIN, Hlc(NOW + 1))),
                (CHAT, USERS[2], MemberInfo(Role.ADMIN, Hlc(NOW + 1))),
            ]
        ),
        DecodeError,
    )


@pytest.mark.parametrize("extra", [b"", b"\x00\x00"])
def test_a_history_page_refuses_a_row_of_another_key_length(full_db: ChatDb, extra: bytes) -> None:
    """A key in ``messages`` that is no messages key (one byte short, or a byte long beside
    one short: the same total) is an error, never a page with a wrong seq."""
    handle = full_db.rocks.handle["messages"]
    value = make_msg(CHAT, Hlc(NOW)).encoded
    batch = full_db.new_batch()
    batch.put(CHAT + b"\xff" * 11, value, handle)  # sorts last: on the first page
    if extra:
        batch.put(CHAT + b"\xff" * 10 + b"\xfe" + extra, value, handle)
    full_db.write(batch)
    with pytest.raises(ValueError, match="messages key"):
        full_db.range(CHAT)


# --- size limits --------------------------------------------------------------------------


def _oversize(payload_len: int) -> MsgV1:
    """A message over the limit: built field by field, since create() refuses it."""
    key = public_key(KEYS[0])
    return MsgV1(
        CHAT,
        user_id_from_key(key),
        Hlc(NOW + 1),
        MessageKind.NEW,
        b"\x00" * payload_len,
        None,
        key,
        bytes(64),
    )


def test_payload_over_256_kib_is_rejected(full_db: ChatDb) -> None:
    big = _oversize(DEFAULT_MAX_PAYLOAD + 1)
    assert_rejected(full_db, lambda: full_db.put_message(big), TooLarge, "too_large")
    ok = make_msg(CHAT2, Hlc(NOW))
    assert_rejected(full_db, lambda: full_db.put_messages([ok, big]), TooLarge)
    assert_rejected(full_db, lambda: ingest(full_db, big.encoded), OversizeRecord, "oversize")
    at_limit = make_msg(CHAT2, Hlc(NOW), b"\x00" * DEFAULT_MAX_PAYLOAD)
    assert not full_db.put_message(at_limit).duplicate


def test_configured_smaller_max_payload() -> None:
    with fresh_db(max_payload=1_000) as db:
        db.put_message(make_msg(CHAT, Hlc(NOW), b"\x00" * 1_000))
        over = make_msg(CHAT, Hlc(NOW + 1), b"\x00" * 1_001)  # fine by the default limit
        assert_rejected(db, lambda: db.put_message(over), TooLarge, "too_large")
        assert_rejected(db, lambda: db.put_messages([make_msg(CHAT2, Hlc(1)), over]), TooLarge)
        assert_rejected(db, lambda: ingest(db, over.encoded), OversizeRecord, "oversize")
        assert db.range(CHAT).items[0].msg.payload == b"\x00" * 1_000


def test_identity_blob_over_1024_bytes_is_rejected(full_db: ChatDb) -> None:
    blob = b"\x00" * (MAX_IDENTITY_BLOB + 1)
    assert_rejected(
        full_db, lambda: full_db.put_identity(ALICE, Hlc(NOW + 1), blob), TooLarge, "too_large"
    )
    assert_rejected(full_db, lambda: full_db.put_identity(BOB, Hlc(NOW + 1), blob), TooLarge)
    assert full_db.get_identity(ALICE) == (Hlc(NOW), b"alice-key")
    full_db.put_identity(BOB, Hlc(NOW + 1), blob[:-1])
    assert full_db.get_identity(BOB) == (Hlc(NOW + 1), blob[:-1])


# --- clocks -------------------------------------------------------------------------------


def test_hlc_too_far_ahead_is_rejected(full_db: ChatDb) -> None:
    ahead = make_msg(CHAT, Hlc(NOW + 120_001))
    assert_rejected(
        full_db, lambda: full_db.put_message(ahead, now_ms=NOW), ClockDriftError, "clock_drift"
    )
    ok = make_msg(CHAT2, Hlc(NOW))
    assert_rejected(full_db, lambda: full_db.put_messages([ok, ahead], now_ms=NOW), ClockDriftError)
    assert_rejected(full_db, lambda: ingest(full_db, ahead.encoded, NOW), ClockDriftError)
    # exactly the max offset ahead is accepted, and so is anything once local time catches up
    assert not full_db.put_message(make_msg(CHAT, Hlc(NOW + 120_000)), now_ms=NOW).duplicate
    assert not full_db.put_message(ahead, now_ms=NOW + 1).duplicate


def test_configured_max_offset() -> None:
    with fresh_db(max_offset_ms=10) as db:
        ahead = make_msg(CHAT, Hlc(NOW + 11))
        assert_rejected(db, lambda: db.put_message(ahead, now_ms=NOW), ClockDriftError)
        assert not db.put_message(make_msg(CHAT, Hlc(NOW + 10)), now_ms=NOW).duplicate
        # without now_ms there is no drift check (the caller has none to give)
        assert not db.put_message(ahead).duplicate


def test_remove_at_hlc_zero_is_rejected(full_db: ChatDb) -> None:
    assert_rejected(
        full_db, lambda: full_db.remove_member_synced(CHAT, ALICE, HLC_ZERO), ValueError
    )


# --- other out-of-range input -------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "reason"),
    [
        (lambda db: db.range(CHAT, limit=0), "bad_limit"),
        (lambda db: db.range(CHAT, limit=201), "bad_limit"),
        (lambda db: db.range(CHAT, "%%%"), "bad_cursor"),
        (lambda db: db.list_user_chats(ALICE, limit=0), "bad_limit"),
        (lambda db: db.list_user_chats(ALICE, "AAAA"), "bad_cursor"),
    ],
)
def test_bad_page_requests(full_db: ChatDb, call: Callable[[ChatDb], Any], reason: str) -> None:
    assert_rejected(full_db, lambda: call(full_db), InvalidInput, reason)
