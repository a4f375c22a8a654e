"""The store's fast paths against their reference spellings (store performance work, issue 2).

Each fast path — hand-joined ChatMeta and MsgV1 CBOR, the MsgV1 decode, the trusted decoders for rows read back from our
own RocksDB, slot-built result objects, the one-message put, the write loop's inlined keys —
must give exactly what the plain code gives, for arbitrary valid values; hostile bytes must
get the same answer too, except that a trusted decode does not insist on canonical bytes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import ChatKind, ChatMeta, DecodeError, Direction, Hlc, InboxEntry, MessageKind, MsgV1
from store.inbox import ChatListItem
from store.merge import meta_after_messages
from store.messages import PutResult, StoredMessage, _put_result
from store.records import (
    DEFAULT_MAX_PAYLOAD,
    STAMP_AT,
    STANDALONE,
    StoredMsg,
    _decode_msg_full,
    canonical_cbor,
    decode_chat_meta,
    decode_inbox_entry,
    decode_msg,
    make_chat_meta,
    placed,
    stored_msg,
)

from store_support import (
    AUTHOR_IDS,
    CHATS,
    USERS,
    dump_logged,
    fresh_db,
    make_msg,
    messages,
    receipt_of,
    small_hlcs,
)

MSG_FIELDS = frozenset(f.name for f in dataclasses.fields(MsgV1))

bin20 = st.binary(min_size=20, max_size=20)
bin32 = st.binary(min_size=32, max_size=32)
u32s = st.integers(0, (1 << 32) - 1)
u64s = st.integers(0, (1 << 64) - 1)
# Integers around every CBOR head size boundary, where a hand encoder goes wrong first.
BOUNDARIES = [0, 23, 24, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32, (1 << 64) - 1]
edgy_u64s = st.sampled_from(BOUNDARIES) | u64s
any_bytes = st.binary(max_size=300)  # lengths across the 1- and 2-byte length heads

# --- ChatMeta: hand-joined canonical CBOR ---------------------------------------------------

valid_chat_metas = st.builds(
    ChatMeta,
    last_ts=edgy_u64s,
    last_seq=st.sampled_from(BOUNDARIES[:8]) | u32s,
    last_msg_id=bin32,
    members=st.lists(bin20, max_size=30).map(tuple),
    last_msg_ts=edgy_u64s,
    last_announced_ms=edgy_u64s,
    identity=st.none() | st.binary(max_size=128),
    membership_hash=bin32,
)
# Any bytes lengths and any member count: the encoder must still agree with cbor2.
loose_chat_metas = st.builds(
    ChatMeta,
    last_ts=edgy_u64s,
    last_seq=edgy_u64s,
    last_msg_id=any_bytes,
    members=st.lists(any_bytes, max_size=30).map(tuple),
    last_msg_ts=edgy_u64s,
    last_announced_ms=edgy_u64s,
    identity=st.none() | any_bytes,
    membership_hash=any_bytes,
)
# Values the fast path must hand to cbor2: bools, negatives, big ints, lists, bytearrays.
odd_ints = st.sampled_from([True, False, -1, -(1 << 70), 1 << 64, 1 << 80]) | edgy_u64s
odd_bytes = any_bytes | any_bytes.map(bytearray)
odd_chat_metas = st.builds(
    ChatMeta,
    last_ts=odd_ints,
    last_seq=odd_ints,
    last_msg_id=odd_bytes,
    members=st.lists(odd_bytes, max_size=4).map(tuple) | st.lists(bin20, max_size=4),
    last_msg_ts=odd_ints,
    last_announced_ms=odd_ints,
    identity=st.none() | odd_bytes,
    membership_hash=odd_bytes,
)


@given(valid_chat_metas | loose_chat_metas | odd_chat_metas)
def test_chat_meta_encode_is_cbor2_canonical(meta: ChatMeta) -> None:
    fields = [1, meta.last_ts, meta.last_seq, meta.last_msg_id, list(meta.members)]
    fields += [meta.last_msg_ts, meta.last_announced_ms, meta.identity, meta.membership_hash]
    assert meta.encode() == meta.encode_reference() == canonical_cbor(fields)


@given(valid_chat_metas)
def test_chat_meta_fast_encoding_round_trips(meta: ChatMeta) -> None:
    assert decode_chat_meta(meta.encode()) == meta


@pytest.mark.parametrize("n", BOUNDARIES)
def test_chat_meta_encode_at_every_head_boundary(n: int) -> None:
    meta = ChatMeta(n, n & 0xFFFFFFFF, bytes(32), (), n, n, None, bytes(32))
    assert meta.encode() == cbor2.dumps(
        [1, n, n & 0xFFFFFFFF, bytes(32), [], n, n, None, bytes(32)], canonical=True
    )


# --- ChatMeta: the per-batch fold without dataclasses.replace --------------------------------


def meta_after_messages_reference(
    meta: ChatMeta, last_seq: int, newest_hlc: int, newest_id: bytes
) -> ChatMeta:
    """The fold as it was written with dataclasses.replace."""
    if (newest_hlc, newest_id) > (meta.last_msg_ts, meta.last_msg_id):
        return dataclasses.replace(
            meta,
            last_seq=last_seq,
            last_ts=newest_hlc >> 16,
            last_msg_id=newest_id,
            last_msg_ts=newest_hlc,
        )
    return dataclasses.replace(meta, last_seq=last_seq)


@given(
    valid_chat_metas,
    u32s,
    st.sampled_from([0, 1 << 16]) | u64s,
    bin32 | st.sampled_from([bytes(32), b"\xff" * 32]),
    st.booleans(),
)
def test_meta_after_messages_equals_replace(
    meta: ChatMeta, seq: int, hlc: int, msg_id: bytes, tie: bool
) -> None:
    if tie:  # same HLC as the stored newest: the id decides
        hlc = meta.last_msg_ts
    got = meta_after_messages(meta, seq, hlc, msg_id)
    want = meta_after_messages_reference(meta, seq, hlc, msg_id)
    assert got == want
    assert got.encode() == want.encode()
    assert [type(getattr(got, f.name)) for f in dataclasses.fields(ChatMeta)] == [
        type(getattr(want, f.name)) for f in dataclasses.fields(ChatMeta)
    ]


@given(valid_chat_metas)
def test_make_chat_meta_equals_the_constructor(meta: ChatMeta) -> None:
    values = [getattr(meta, f.name) for f in dataclasses.fields(ChatMeta)]
    built = make_chat_meta(*values)
    assert built == ChatMeta(*values) == meta
    assert hash(built) == hash(meta)


# --- slot-built result objects ---------------------------------------------------------------


@given(bin32, u32s, st.booleans(), st.booleans())
def test_put_result_built_through_slots(msg_id: bytes, seq: int, dup: bool, exp: bool) -> None:
    built = _put_result(msg_id, seq, dup, exp)
    assert type(built) is PutResult
    assert built == PutResult(msg_id, seq, dup, exp)
    assert hash(built) == hash(PutResult(msg_id, seq, dup, exp))
    assert _put_result(msg_id, seq, dup) == PutResult(msg_id, seq, dup)
    assert (built.msg_id, built.seq, built.duplicate, built.expired) == (msg_id, seq, dup, exp)
    with pytest.raises(AttributeError):
        built.seq = 1  # type: ignore[misc]


# --- MsgV1: hand-joined canonical CBOR, the signed body sliced from it, the checked decode ----


# Every message kind (a ref for all but NEW), byte fields as bytes or bytearray, HLCs and
# payload lengths across the CBOR head boundaries.
def _msg(kind: MessageKind, wrap: Any, fields: tuple[Any, ...]) -> MsgV1:
    chat, sender, hlc, payload, ref, key, sig = fields
    ref = None if kind in STANDALONE else wrap(ref)
    return MsgV1(wrap(chat), wrap(sender), Hlc.unpack(hlc), kind, wrap(payload), ref, wrap(key),
                 wrap(sig))  # fmt: skip


any_msgs = st.builds(
    _msg,
    st.sampled_from(MessageKind),
    st.sampled_from([bytes, bytearray]),
    st.tuples(
        bin32,
        bin20,
        edgy_u64s,
        any_bytes | st.sampled_from([65535, 65536]).map(bytes),
        bin32,
        bin32,
        st.binary(min_size=64, max_size=64),
    ),
)


@given(any_msgs)
def test_msg_encoding_and_signed_body_are_cbor2_canonical(msg: MsgV1) -> None:
    assert msg.encoded == msg.encode_reference()
    assert msg.signed_body() == canonical_cbor(msg._body())
    if type(msg.payload) is bytes:
        assert msg._encode_fast() == msg.encode_reference()


@settings(max_examples=300)
@given(st.data())
def test_decode_msg_answers_what_the_full_decode_answers(data: st.DataObject) -> None:
    """On valid, mutated, truncated or extended bytes: the same message or the same error."""
    msg = data.draw(messages() | any_msgs.filter(lambda m: type(m.payload) is bytes))
    raw = msg.encoded if data.draw(st.booleans()) else data.draw(_mutations(msg.encoded))
    assert _outcome(decode_msg, raw) == _outcome(
        lambda d: _decode_msg_full(d, DEFAULT_MAX_PAYLOAD), raw
    )


@pytest.mark.parametrize("cut", [1, 2, 66, 67])
def test_decode_msg_refuses_non_canonical_heads(cut: int) -> None:
    """The same fields behind a longer-than-needed head decode fully, and are refused."""
    msg = make_msg(CHATS[0], Hlc(5), b"x" * 10)
    data = msg.encoded
    padded = data[:2] + b"\x59\x00\x20" + data[4:]  # chat id's length in a 2-byte head
    assert _outcome(decode_msg, padded) == ("error", "non_canonical")
    assert _outcome(decode_msg, data + b"\x00" * cut)[0] == "error"


# --- trusted decodes: identical to the full decode on valid bytes -----------------------------


def same_msg(got: MsgV1, want: MsgV1) -> None:
    assert got == want
    assert got.msg_id == want.msg_id  # (caches msg_id on both, so the dicts can match)
    assert got.__dict__ == want.__dict__  # the cached encoding too
    assert {k: type(v) for k, v in got.__dict__.items()} == {
        k: type(v) for k, v in want.__dict__.items()
    }
    assert got.hlc.pack() == want.hlc.pack()


def same_stored(got: MsgV1, want: MsgV1) -> None:
    """A page's StoredMsg: each field, read first or after others, is the full decode's."""
    assert isinstance(got, StoredMsg)
    assert got == want and want == got and hash(got) == hash(want)
    for name in MsgV1.__dataclass_fields__:
        value = getattr(got, name)
        assert value == getattr(want, name) and type(value) is type(getattr(want, name)), name
    same_msg(got, want)


@settings(max_examples=200)
@given(messages(chats=(*CHATS, bytes(range(32)))), st.permutations(sorted(MSG_FIELDS)))
def test_stored_msg_fields_equal_full_decode(msg: MsgV1, order: list[str]) -> None:
    """Whichever field is read first (in place, or by the decode), every field is right."""
    got = stored_msg(msg.encoded)
    for name in order:
        assert getattr(got, name) == getattr(msg, name), name
    same_stored(got, msg)


@settings(max_examples=50)
@given(messages(), any_bytes)
def test_stored_msg_keeps_its_bytes_in_a_slot(msg: MsgV1, payload: bytes) -> None:
    """A page's StoredMsg makes no __dict__ entry until a field is read; one made by
    ``__init__`` (``dataclasses.replace``) encodes its own fields, as a MsgV1 does."""
    got = stored_msg(msg.encoded)
    assert got.encoded is msg.encoded and "encoded" not in got.__dict__
    assert got.__dict__ == {}
    assert got.kind == msg.kind and got.encoded is msg.encoded
    changed = dataclasses.replace(got, payload=payload)
    assert type(changed) is StoredMsg
    want = dataclasses.replace(msg, payload=payload)
    assert changed.encoded == want.encoded and changed == want and hash(changed) == hash(want)
    with pytest.raises(AttributeError):
        _ = got.no_such_field


@settings(max_examples=200)
@given(messages(chats=(*CHATS, bytes(range(32)))), st.permutations(sorted(MSG_FIELDS)))
def test_placed_stored_msg_fields_equal_full_decode(msg: MsgV1, order: list[str]) -> None:
    """A fold's fields read up front (``placed``) are the fields read when asked."""
    got = placed(stored_msg(msg.encoded))
    assert {"kind", "sender", "chat_id", "hlc", "payload"} <= set(got.__dict__)
    for name in order:
        assert getattr(got, name) == getattr(msg, name), name
    same_stored(got, msg)
    assert placed(msg) is msg and placed(got) is got  # a decoded message, a placed one: as is


@settings(max_examples=200)
@given(st.data())
def test_placed_on_malformed_bytes_leaves_the_fields_to_the_decode(data: st.DataObject) -> None:
    """Bytes not laid out as a message: ``placed`` reads nothing, and a field read raises
    DecodeError or reads, as without it."""
    raw = data.draw(_mutations(data.draw(messages()).encoded) | st.binary(max_size=400))
    got = placed(stored_msg(raw))
    for name in data.draw(st.permutations(sorted(MSG_FIELDS))):
        try:
            getattr(got, name)
        except DecodeError:
            continue


@pytest.mark.parametrize("size", [0, 23, 24, 255, 256, 65_535, 65_536])
def test_stored_msg_payload_at_head_boundaries(size: int) -> None:
    msg = make_msg(CHATS[1], Hlc(1 << 40, 3), b"p" * size)
    assert stored_msg(msg.encoded).payload == msg.payload
    same_stored(stored_msg(msg.encoded), msg)


@settings(max_examples=300)
@given(st.data())
def test_stored_msg_on_malformed_bytes_raises_decode_error_or_reads(data: st.DataObject) -> None:
    """Mutated, truncated, extended or oversized bytes: a field read gives a value or
    DecodeError, never another exception; a payload never runs past the row."""
    msg = data.draw(messages())
    raw = data.draw(_mutations(msg.encoded) | st.binary(max_size=400))
    if data.draw(st.booleans()):  # a payload head claiming more than the row holds
        raw = raw[: STAMP_AT + 2] + b"\x5a\xff\xff\xff\xff" + raw[STAMP_AT + 2 :]
    got = stored_msg(raw)
    for name in data.draw(st.permutations(sorted(MSG_FIELDS))):
        try:
            value = getattr(got, name)
        except DecodeError:
            continue
        if name == "payload":
            assert len(value) < len(raw)


@settings(max_examples=200)
@given(messages(chats=(*CHATS, bytes(range(32)))))
def test_trusted_decode_msg_equals_full_decode(msg: MsgV1) -> None:
    data = msg.encoded
    full = decode_msg(data)
    same_msg(decode_msg(data, trusted=True), full)
    same_msg(full, msg)


@pytest.mark.parametrize("hlc", [Hlc(0, 0), Hlc(0, 23), Hlc(0, 24), Hlc(1, 0), Hlc(1 << 47, 7)])
def test_trusted_decode_msg_at_hlc_head_boundaries(hlc: Hlc) -> None:
    msg = make_msg(CHATS[1], hlc, b"x" * 300)
    same_msg(decode_msg(msg.encoded, trusted=True), decode_msg(msg.encoded))


valid_inbox_entries = st.builds(
    InboxEntry,
    chat_id=bin32,
    kind=st.sampled_from(ChatKind),
    last_ts=edgy_u64s,
    last_msg_id=bin32,
    last_sender=bin20,
    last_seq=st.sampled_from(BOUNDARIES[:8]) | u32s,
    last_text_preview=st.text(max_size=100),
)


@given(valid_inbox_entries)
def test_trusted_decode_inbox_entry_equals_full_decode(entry: InboxEntry) -> None:
    data = entry.encode()
    got, want = decode_inbox_entry(data, trusted=True), decode_inbox_entry(data)
    assert got == want == entry
    assert [type(getattr(got, f.name)) for f in dataclasses.fields(InboxEntry)] == [
        type(getattr(want, f.name)) for f in dataclasses.fields(InboxEntry)
    ]


# --- trusted decodes on hostile bytes: the same answer, but for canonical form ---------------


def _outcome(decode: Any, data: bytes) -> tuple[str, Any]:
    try:
        return "ok", decode(data)
    except DecodeError as exc:
        return "error", exc.reason


def check_trusted_matches(decode: Any, data: bytes, canonical: Any) -> None:
    """decode(data, trusted=True) agrees with decode(data) unless only canonical form differs."""
    full = _outcome(decode, data)
    trusted = _outcome(lambda d: decode(d, trusted=True), data)
    if full[0] == "ok" or trusted[0] == "error":
        assert trusted == full
        return
    # Only a non-canonical encoding of valid fields may pass a trusted decode; the value it
    # gives is what the canonical bytes of those fields decode to.
    assert full == ("error", "non_canonical")
    assert decode(canonical(trusted[1])) == trusted[1]


def _mutations(data: bytes) -> st.SearchStrategy[bytes]:
    n = len(data)
    flip = st.tuples(st.integers(0, n - 1), st.integers(0, 255)).map(
        lambda p: data[: p[0]] + bytes([p[1]]) + data[p[0] + 1 :]
    )
    cut = st.integers(0, n - 1).map(lambda i: data[:i])
    grow = st.binary(min_size=1, max_size=8).map(lambda extra: data + extra)
    return flip | cut | grow


def _msg_canonical(msg: MsgV1) -> bytes:
    return MsgV1(*(getattr(msg, f.name) for f in dataclasses.fields(MsgV1))).encoded


@settings(max_examples=300)
@given(st.data())
def test_trusted_decode_msg_on_mutated_bytes(data: st.DataObject) -> None:
    msg = data.draw(messages())
    mutated = data.draw(_mutations(msg.encoded))
    check_trusted_matches(decode_msg, mutated, _msg_canonical)


# Field values of the wrong type or size, put into an otherwise valid canonical MsgV1 array.
WRONG_FIELDS: list[tuple[int, Any]] = [
    (0, 2), (0, True), (0, "1"),
    (1, bytes(31)), (1, "x" * 32), (1, None),
    (2, bytes(21)), (2, [bytes(20)]),
    (3, -1), (3, 1 << 64), (3, True), (3, 1.5), (3, b"\x00" * 8),
    (4, 7), (4, 255), (4, 256), (4, -1), (4, True), (4, None),
    (5, "text"), (5, None), (5, bytes(DEFAULT_MAX_PAYLOAD + 1)),
    (6, bytes(31)), (6, "r" * 32),
    (7, bytes(31)), (7, None),
    (8, bytes(63)), (8, bytes(65)), (8, "s"),
]  # fmt: skip


@pytest.mark.parametrize(("index", "value"), WRONG_FIELDS)
@pytest.mark.parametrize("kind", [0, 1])
def test_trusted_decode_msg_rejects_wrong_fields_like_the_full_decode(
    index: int, value: Any, kind: int
) -> None:
    ref = None if kind == 0 else bytes(32)
    fields: list[Any] = [1, CHATS[1], USERS[0], Hlc(5, 1).pack(), kind, b"p", ref]
    fields += [bytes(32), bytes(64)]
    fields[index] = value
    data = canonical_cbor(fields)
    check_trusted_matches(decode_msg, data, _msg_canonical)
    assert _outcome(decode_msg, data)[0] == "error"
    # and the ref rule: NEW without a ref, every other kind with one
    fields = [1, CHATS[1], USERS[0], 7, kind, b"p", bytes(32) if kind == 0 else None]
    data = canonical_cbor([*fields, bytes(32), bytes(64)])
    check_trusted_matches(decode_msg, data, _msg_canonical)
    assert _outcome(decode_msg, data)[0] == "error"


def test_trusted_decode_msg_refuses_what_is_not_a_message() -> None:
    for data in [b"", b"\x80", b"\xa0", canonical_cbor(list(range(9))), canonical_cbor([1] * 10)]:
        assert _outcome(lambda d: decode_msg(d, trusted=True), data) == _outcome(decode_msg, data)
    raw = bytearray(make_msg(CHATS[0], Hlc(9, 9)).encoded)
    same_msg(decode_msg(raw, trusted=True), decode_msg(raw))  # type: ignore[arg-type]


def test_trusted_decode_msg_honours_max_payload() -> None:
    data = make_msg(CHATS[0], Hlc(1), b"\x00" * 101).encoded
    assert decode_msg(data, max_payload=101, trusted=True).payload == b"\x00" * 101
    assert _outcome(lambda d: decode_msg(d, max_payload=100, trusted=True), data) == (
        "error",
        "oversize",
    )


def _inbox_canonical(entry: InboxEntry) -> bytes:
    return entry.encode()


@settings(max_examples=300)
@given(st.data())
def test_trusted_decode_inbox_entry_on_mutated_bytes(data: st.DataObject) -> None:
    entry = data.draw(valid_inbox_entries)
    mutated = data.draw(_mutations(entry.encode()))
    check_trusted_matches(decode_inbox_entry, mutated, _inbox_canonical)


WRONG_INBOX_FIELDS: list[tuple[int, Any]] = [
    (0, 2), (0, True), (1, bytes(31)), (1, "c"), (1, "c" * 32), (2, 3), (2, -1), (2, True),
    (2, 256), (3, -1), (3, 1 << 64), (3, False), (4, bytes(33)), (4, "m" * 32),
    (5, bytes(19)), (5, None), (5, "s" * 20),
    (6, b"bytes"), (6, "x" * 81), (6, None), (7, 1 << 32), (7, -1), (7, True),
]  # fmt: skip


@pytest.mark.parametrize(("index", "value"), WRONG_INBOX_FIELDS)
def test_trusted_decode_inbox_entry_rejects_wrong_fields(index: int, value: Any) -> None:
    fields: list[Any] = [1, CHATS[1], 1, 5, bytes(32), USERS[0], "hi", 3]
    fields[index] = value
    data = canonical_cbor(fields)
    check_trusted_matches(decode_inbox_entry, data, _inbox_canonical)
    assert _outcome(decode_inbox_entry, data)[0] == "error"


# --- the write paths: one message, batches, the inlined key --------------------------------

stamps = small_hlcs(max_physical=6, max_logical=3)
msg_lists = st.lists(messages(stamps=stamps), max_size=12)


def _put_each_via_batches(db: Any, msgs: list[MsgV1], sizes: list[int]) -> list[PutResult]:
    out: list[PutResult] = []
    i = 0
    for size in sizes:
        out += db.put_messages(msgs[i : i + size])
        i += size
    return out + db.put_messages(msgs[i:])


@settings(max_examples=40)
@given(
    msg_lists,
    st.lists(st.integers(0, 5), max_size=6),
    st.none() | st.integers(0, 4),
    st.integers(0, 3),
)
def test_put_message_and_batches_store_what_one_by_one_put_messages_does(
    msgs: list[MsgV1], sizes: list[int], expire: int | None, repeats: int
) -> None:
    """put_message(m), put_messages(batches) and put_messages([m]) per message: same everything."""
    msgs = msgs + msgs[:repeats]  # some duplicates, across and inside batches
    with fresh_db() as single, fresh_db() as batched, fresh_db() as reference:
        for db in (single, batched, reference):
            db.expire_before_ms = expire
        want = [r for m in msgs for r in reference.put_messages([m])]
        assert [single.put_message(m) for m in msgs] == want
        assert _put_each_via_batches(batched, msgs, sizes) == want
        state = dump_logged(reference)  # (the log's rows: one a write)
        assert dump_logged(single) == state
        assert dump_logged(batched) == state
        for chat in CHATS:  # the cached metas match what was written
            for db in (single, batched):
                assert db.load_meta(chat) == reference.load_meta(chat)
                assert db.get_chat_meta(chat) == reference.get_chat_meta(chat)


@pytest.mark.parametrize("kind", [MessageKind.EDIT, MessageKind.REACTION])
def test_a_reply_referred_to_before_it_arrived_is_marked_by_either_write_path(
    kind: MessageKind,
) -> None:
    """An edit or reaction that came before its target, a reply (content that itself refers):
    put_message writes the target's ``referred`` row as put_messages does."""
    first = make_msg(CHATS[0], Hlc(1))
    reply = make_msg(CHATS[0], Hlc(2), kind=MessageKind.REPLY, ref=first.msg_id)
    payload = b"\x01+1" if kind is MessageKind.REACTION else b"edited"
    early = make_msg(CHATS[0], Hlc(3), payload, kind=kind, ref=reply.msg_id)
    with fresh_db() as single, fresh_db() as batched:
        for db in (single, batched):
            db.put_messages([first, early])
        single.put_message(reply)
        batched.put_messages([reply])
        assert len(dict(single.iter_all("referred"))) == 1
        assert dump_logged(single) == dump_logged(batched)


@settings(max_examples=30)
@given(st.lists(messages(stamps=stamps), min_size=1, max_size=15), st.integers(1, 6))
def test_range_items_equal_plain_construction(msgs: list[MsgV1], limit: int) -> None:
    with fresh_db() as db:
        db.put_messages(msgs)
        for chat in CHATS:
            for direction in Direction:
                cursor: str | None = None
                while True:
                    page = db.range(chat, cursor, limit=limit, direction=direction)
                    for item in page.items:
                        assert item == StoredMessage(item.key, item.seq, item.msg)
                        same_stored(item.msg, decode_msg(item.msg.encoded))
                        assert item.seq == int.from_bytes(item.key[40:], "big")
                    if (cursor := page.next_cursor) is None:
                        break


def test_chat_list_items_equal_plain_construction() -> None:
    reader = AUTHOR_IDS[1]
    with fresh_db() as db:
        for i, chat in enumerate(CHATS):
            msgs = [make_msg(chat, Hlc(10 * i + j + 1)) for j in range(4)]
            db.put_messages(msgs)
            meta = db.load_meta(chat)
            entry = InboxEntry(chat, ChatKind.GROUP, meta.last_ts, meta.last_msg_id, USERS[0], 4)
            db.upsert_inbox_for_members(chat, [reader], entry)
            if i < 2:  # chat 0 read up to its third message, chat 1 up to its last
                read = msgs[2 + i]
                db.put_messages([receipt_of(read, Hlc(10 * i + 9), author=1)])
        page = db.list_user_chats(reader)
        assert [item.unread for item in page.items] == [4, 0, 1]
        for item in page.items:
            assert item == ChatListItem(item.entry, item.unread)
            assert item.entry == decode_inbox_entry(item.entry.encode())


# --- the fast paths' guards, one field at a time ---------------------------------------------
# A random meta rarely has exactly one odd field; here every other field is valid, so the
# fast path's guard alone decides whether cbor2 must encode it.

BASE_META = ChatMeta(5, 3, bytes(32), (USERS[0],), 7, 9, None, bytes(32))
ODD_FIELDS: list[tuple[str, Any]] = [
    *[(name, value) for name in ("last_ts", "last_seq", "last_msg_ts", "last_announced_ms")
      for value in (True, False, -1, 1 << 64, 1 << 70)],
    ("last_msg_id", bytearray(32)), ("last_msg_id", bytes(33)), ("last_msg_id", "i" * 32),
    ("membership_hash", bytearray(32)), ("membership_hash", bytes(33)),
    ("membership_hash", "h" * 32),
    ("identity", bytearray(3)), ("identity", "text"), ("identity", b""),
    ("members", [USERS[0]]), ("members", (bytearray(20),)), ("members", ("m" * 20,)),
    ("members", (bytes(21),)), ("members", (USERS[0], "m" * 20)),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value"), ODD_FIELDS)
def test_chat_meta_gives_each_odd_field_to_cbor2(name: str, value: Any) -> None:
    meta = dataclasses.replace(BASE_META, **{name: value})
    fields = [1, meta.last_ts, meta.last_seq, meta.last_msg_id, list(meta.members)]
    fields += [meta.last_msg_ts, meta.last_announced_ms, meta.identity, meta.membership_hash]
    assert meta.encode() == canonical_cbor(fields)


@pytest.mark.parametrize("n", [23, 24, 255, 256, 65535, 65536])
def test_chat_meta_byte_strings_and_arrays_at_every_head_boundary(n: int) -> None:
    metas = [dataclasses.replace(BASE_META, identity=bytes(n))]
    if n < 1000:  # members: 21 bytes each
        metas.append(dataclasses.replace(BASE_META, members=tuple([USERS[1]] * n)))
    for meta in metas:
        assert meta.encode() == meta.encode_reference()


@pytest.mark.parametrize("payload", ["text", bytearray(b"p" * 300), memoryview(b"p" * 24)])
def test_a_message_with_any_payload_encodes_as_cbor2_does(payload: Any) -> None:
    msg = dataclasses.replace(make_msg(CHATS[0], Hlc(3)), payload=payload)
    assert msg.encoded == msg.encode_reference()


# --- trusted decodes accept trailing bytes (docstring of decode_msg), and nothing oversize ----


@settings(max_examples=60)
@given(messages(chats=(*CHATS, bytes(range(32)))), st.binary(min_size=1, max_size=40))
def test_a_trusted_message_may_carry_trailing_bytes(msg: MsgV1, tail: bytes) -> None:
    # tight max_payload: the bound below is the one the guard checks. (The fields only: the
    # trusted decode keeps the bytes it was given as ``encoded``; our RocksDB holds no tails.)
    data = msg.encoded + tail
    assert decode_msg(data, max_payload=len(msg.payload), trusted=True) == msg
    with pytest.raises(DecodeError, match="not canonically encoded"):
        decode_msg(data, max_payload=len(msg.payload))


@pytest.mark.parametrize("hlc", [Hlc(0, 0), Hlc((1 << 48) - 1, (1 << 16) - 1)])
def test_a_trusted_message_at_the_edges_of_its_fields_and_size(hlc: Hlc) -> None:
    msg = make_msg(CHATS[0], hlc, b"\x07" * 100)
    limit = 612  # the bytes a record of a 100-byte payload may take: 512 around the payload
    padded = msg.encoded + bytes(limit - len(msg.encoded))
    assert decode_msg(padded, max_payload=100, trusted=True) == msg
    with pytest.raises(DecodeError) as info:
        decode_msg(padded + b"\x00", max_payload=100, trusted=True)
    assert info.value.reason == "oversize"
    # the full decode (a bytearray skips the fast path) takes the same bound
    same_msg(decode_msg(bytearray(msg.encoded), max_payload=100), msg)  # type: ignore[arg-type]


@given(valid_inbox_entries, st.binary(min_size=1, max_size=40))
def test_a_trusted_inbox_entry_may_carry_trailing_bytes(entry: InboxEntry, tail: bytes) -> None:
    data = entry.encode() + tail
    assert decode_inbox_entry(data, trusted=True) == entry
    with pytest.raises(DecodeError, match="not canonically encoded"):
        decode_inbox_entry(data)


def test_a_trusted_inbox_entry_is_never_oversize() -> None:
    entry = InboxEntry(CHATS[1], ChatKind.GROUP, 5, bytes(32), USERS[0], 3, "hi")
    data = entry.encode()
    padded = data + bytes(1024 - len(data))  # exactly the limit: taken
    assert decode_inbox_entry(padded, trusted=True) == entry
    for longer in (padded + b"\x00", padded * 2):
        with pytest.raises(DecodeError) as info:
            decode_inbox_entry(longer, trusted=True)
        assert info.value.reason == "oversize"


@pytest.mark.parametrize("size", [7, 9])
def test_a_trusted_inbox_entry_of_the_wrong_arity_is_a_decode_error(size: int) -> None:
    fields: list[Any] = [1, CHATS[1], 1, 5, bytes(32), USERS[0], "hi", 3, 0][:size]
    data = canonical_cbor(fields)
    assert _outcome(lambda d: decode_inbox_entry(d, trusted=True), data) == (
        "error",
        "wrong_type",
    )


def test_a_trusted_inbox_entry_with_the_longest_preview() -> None:
    entry = InboxEntry(CHATS[1], ChatKind.DM, 5, bytes(32), USERS[0], 3, "é" * 80)
    assert decode_inbox_entry(entry.encode() + b"\x00", trusted=True) == entry
