"""ChatDb on real RocksDB: messages, pagination, members, identity, inbox, sync and retention."""

from __future__ import annotations

import operator
from functools import reduce
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import (
    ChatDb,
    ChatKind,
    ChatMeta,
    Direction,
    Hlc,
    IdentityRecord,
    InboxEntry,
    InvalidInput,
    MemberInfo,
    MsgV1,
    Role,
)
from store.errors import StoreLocked
from store.events import seen_value
from store.hlc import HLC_ZERO
from store.keys import bucket_of, key_messages, parse_key_messages
from store.messages import extract_hlc_physical_from_seen_value
from store.ops import member_op_id
from store.records import (
    compute_identity_record_id,
    compute_member_record_id,
    decode_identity_record,
    decode_msg,
)

from store_support import (
    AUTHOR_IDS,
    BIG,
    CHATS,
    USERS,
    dump_all,
    fold_members,
    fresh_db,
    group_op,
    identity_record_ids,
    make_msg,
    member_ops,
    member_record_ids,
    member_rows,
    msg_ids,
    op_state,
    receipt_of,
    small_config,
    small_hlcs,
)

CHAT, CHAT2, CHAT_FF = CHATS
DB_EXAMPLES = settings(max_examples=25)


def stored_order(db: ChatDb, chat: bytes) -> list[bytes]:
    """Every msg id of ``chat`` in key order, read by a full FORWARD walk."""
    out: list[bytes] = []
    cursor = None
    while True:
        page = db.range(chat, cursor, limit=200, direction=Direction.FORWARD)
        out += [item.msg.msg_id for item in page.items]
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor


# --- opening -------------------------------------------------------------------------------


def test_a_database_open_elsewhere_is_store_locked(tmp_path: Path) -> None:
    """RocksDB's LOCK file held (here by this process; another process's is the same status
    text's other form, tests/node/test_cli_refusals.py): ``StoreLocked``, RocksDB's text kept."""
    path = str(tmp_path / "db")
    with ChatDb(small_config(path)) as first:
        with pytest.raises(StoreLocked, match="LOCK"):
            ChatDb(small_config(path))
        assert first.last_position == 0  # the first still reads
    ChatDb(small_config(path)).close()  # free again once closed


# --- put_message --------------------------------------------------------------------------


def test_put_message_stores_and_indexes(db: ChatDb) -> None:
    msg = make_msg(CHAT, Hlc(1_000, 3), b"hi")
    result = db.put_message(msg)
    assert (result.msg_id, result.seq, result.duplicate) == (msg.msg_id, 1, False)
    assert db.has_message(msg.msg_id)
    assert db.get_message(msg.msg_id) == msg
    assert db.get_message(msg.msg_id).encoded == msg.encoded  # type: ignore[union-attr]
    key = key_messages(CHAT, msg.hlc.pack(), 1)
    assert dict(db.iter_all("messages")) == {key: msg.encoded}
    assert dict(db.iter_all("seen_msg")) == {msg.msg_id: seen_value(key, 1)}  # its event: 1
    meta = db.get_chat_meta(CHAT)
    assert meta == ChatMeta(
        last_ts=1_000, last_seq=1, last_msg_id=msg.msg_id, last_msg_ts=msg.hlc.pack()
    )
    assert db.get_message(b"\x00" * 32) is None
    assert not db.has_message(b"\x00" * 32)


def test_put_message_is_idempotent(db: ChatDb) -> None:
    msg = make_msg(CHAT, Hlc(5))
    first = db.put_message(msg)
    before = dump_all(db)
    again = db.put_message(msg)
    assert again.duplicate and again.seq == 0 and again.msg_id == first.msg_id
    assert dump_all(db) == before  # nothing rewritten, seq unchanged
    # an equal message decoded from its bytes is the same message
    assert db.put_message(decode_msg(msg.encoded)).duplicate
    assert dump_all(db) == before
    assert db.get_chat_meta(CHAT).last_seq == 1  # type: ignore[union-attr]


def test_put_messages_with_in_batch_duplicates(db: ChatDb) -> None:
    m1, m2, m3 = (make_msg(CHAT, Hlc(i)) for i in (3, 1, 2))
    results = db.put_messages([m1, m2, m1, m3, m2])
    assert [(r.msg_id, r.seq, r.duplicate) for r in results] == [
        (m1.msg_id, 1, False),
        (m2.msg_id, 2, False),
        (m1.msg_id, 0, True),
        (m3.msg_id, 3, False),
        (m2.msg_id, 0, True),
    ]
    assert sorted(msg_ids(db)) == sorted([m1.msg_id, m2.msg_id, m3.msg_id])
    assert len(dict(db.iter_all("messages"))) == 3
    assert db.get_chat_meta(CHAT).last_seq == 3  # type: ignore[union-attr]
    assert db.get_chat_meta(CHAT).last_msg_id == m1.msg_id  # type: ignore[union-attr]
    # the whole batch again: all duplicates, nothing written
    before = dump_all(db)
    assert all(r.duplicate for r in db.put_messages([m3, m2, m1]))
    assert dump_all(db) == before
    assert db.put_messages([]) == []


def test_seq_counts_per_chat(db: ChatDb) -> None:
    results = db.put_messages(
        [make_msg(CHAT, Hlc(1)), make_msg(CHAT2, Hlc(1)), make_msg(CHAT, Hlc(0))]
    )
    assert [r.seq for r in results] == [1, 1, 2]
    assert db.get_chat_meta(CHAT).last_seq == 2  # type: ignore[union-attr]
    assert db.get_chat_meta(CHAT2).last_seq == 1  # type: ignore[union-attr]
    assert db.get_chat_meta(CHAT_FF) is None
    chats: list[bytes] = []
    db.for_each_chat_id(chats.append)
    assert chats == [CHAT, CHAT2]


@DB_EXAMPLES
@given(
    st.lists(
        st.tuples(st.sampled_from(CHATS), small_hlcs(5, 2), st.binary(max_size=3)), max_size=25
    )
)
def test_chat_meta_follows_the_newest_message(entries: list[tuple[bytes, Hlc, bytes]]) -> None:
    msgs = [make_msg(chat, hlc, payload) for chat, hlc, payload in entries]
    with fresh_db() as db:
        for msg in msgs:
            db.put_message(msg)
        for chat in CHATS:
            mine = {m.msg_id: m for m in msgs if m.chat_id == chat}
            meta = db.get_chat_meta(chat)
            if not mine:
                assert meta is None
                continue
            assert meta is not None
            newest = max(mine.values(), key=lambda m: (m.hlc, m.msg_id))
            assert (meta.last_msg_id, meta.last_msg_ts, meta.last_ts) == (
                newest.msg_id,
                newest.hlc.pack(),
                newest.hlc.physical_ms,
            )
            assert meta.last_seq == len(mine)


# --- range --------------------------------------------------------------------------------


def walk(
    db: ChatDb, chat: bytes, limit: int, direction: Direction, between: Any = None
) -> list[bytes]:
    """All pages of ``range``; checks page sizes; calls ``between(page_no, last_key)``."""
    seen: list[bytes] = []
    cursor = None
    pages = 0
    while True:
        page = db.range(chat, cursor, limit=limit, direction=direction)
        assert len(page.items) <= limit
        seen += [item.msg.msg_id for item in page.items]
        pages += 1
        assert pages < 1_000
        if page.next_cursor is None:
            return seen
        assert len(page.items) == limit  # only the last page may be short
        cursor = page.next_cursor
        if between is not None:
            between(pages, page.items[-1].key)


ordered_msgs = st.lists(st.tuples(small_hlcs(6, 3), st.binary(max_size=2)), max_size=30)


@DB_EXAMPLES
@given(ordered_msgs, st.integers(1, 7), st.sampled_from(Direction))
def test_pagination_returns_every_message_once(
    entries: list[tuple[Hlc, bytes]], limit: int, direction: Direction
) -> None:
    with fresh_db() as db:
        # neighbouring chats on both sides of the walked one never leak in
        db.put_messages([make_msg(CHAT, Hlc(3)), make_msg(CHAT_FF, Hlc(3)), make_msg(CHAT, Hlc(9))])
        results = db.put_messages([make_msg(CHAT2, h, p) for h, p in entries])
        new = [(r.msg_id, r.seq) for r in results if not r.duplicate]
        stamp = {make_msg(CHAT2, h, p).msg_id: h for h, p in entries}
        expected = [mid for mid, seq in sorted(new, key=lambda e: (stamp[e[0]], e[1]))]
        if direction is Direction.BACKWARD:
            expected.reverse()
        assert walk(db, CHAT2, limit, direction) == expected


def test_range_items_carry_key_and_seq(db: ChatDb) -> None:
    msgs = [make_msg(CHAT, Hlc(10 - i)) for i in range(3)]
    db.put_messages(msgs)
    page = db.range(CHAT, direction=Direction.FORWARD)
    assert [item.msg for item in page.items] == msgs[::-1]
    assert [item.seq for item in page.items] == [3, 2, 1]
    for item in page.items:
        assert parse_key_messages(item.key) == (CHAT, item.msg.hlc.pack(), item.seq)
    assert page.next_cursor is None
    backward = db.range(CHAT)  # default: BACKWARD, newest first
    assert [item.msg for item in backward.items] == msgs


@DB_EXAMPLES
@given(
    ordered_msgs,
    st.lists(st.lists(st.tuples(small_hlcs(8, 3), st.binary(max_size=2)), max_size=4), max_size=8),
    st.integers(1, 5),
    st.sampled_from(Direction),
)
def test_pagination_with_inserts_between_pages(
    initial: list[tuple[Hlc, bytes]],
    inserts: list[list[tuple[Hlc, bytes]]],
    limit: int,
    direction: Direction,
) -> None:
    with fresh_db() as db:
        db.put_messages([make_msg(CHAT, h, p) for h, p in initial])
        before = set(msg_ids(db))
        ahead: set[bytes] = set()  # inserted on the side of the cursor the walk still goes to
        behind: set[bytes] = set()  # inserted where the walk has already been

        def insert(page_no: int, last_key: bytes) -> None:
            if page_no > len(inserts):
                return
            batch = [make_msg(CHAT, h, b"new" + p) for h, p in inserts[page_no - 1]]
            for result in db.put_messages(batch):
                if result.duplicate:
                    continue
                key = db.get("seen_msg", result.msg_id)
                assert key is not None
                forward = direction is Direction.FORWARD
                (ahead if (key > last_key) == forward else behind).add(result.msg_id)

        seen = walk(db, CHAT, limit, direction, insert)
        assert len(seen) == len(set(seen)), "no message twice"
        # every message that existed before paging, and every one inserted ahead of the
        # cursor, appears exactly once; those inserted behind it do not appear at all
        assert set(seen) == before | ahead
        assert not behind & set(seen)


def test_forward_walk_sees_messages_appended_after_the_cursor(db: ChatDb) -> None:
    db.put_messages([make_msg(CHAT, Hlc(i)) for i in range(4)])
    first = db.range(CHAT, limit=2, direction=Direction.FORWARD)
    newer = make_msg(CHAT, Hlc(100))
    older = make_msg(CHAT, Hlc(0, 0), b"late")
    db.put_messages([newer, older])
    rest = db.range(CHAT, first.next_cursor, limit=10, direction=Direction.FORWARD)
    ids = [i.msg.msg_id for i in rest.items]
    assert ids.count(newer.msg_id) == 1
    assert older.msg_id not in ids  # inserted behind the cursor: not in this walk
    assert rest.next_cursor is None


def test_limit_bounds(db: ChatDb) -> None:
    db.put_messages([make_msg(CHAT, Hlc(i)) for i in range(205)])
    for bad in (0, -1, 201, 10_000):
        with pytest.raises(InvalidInput) as info:
            db.range(CHAT, limit=bad)
        assert info.value.reason == "bad_limit"
    assert len(db.range(CHAT).items) == 50  # the default
    assert len(db.range(CHAT, limit=1).items) == 1
    full = db.range(CHAT, limit=200)
    assert len(full.items) == 200 and full.next_cursor is not None
    rest = db.range(CHAT, full.next_cursor, limit=200)
    assert len(rest.items) == 5 and rest.next_cursor is None


def test_bad_cursor_raises_invalid_input(db: ChatDb) -> None:
    db.put_messages([make_msg(CHAT, Hlc(i)) for i in range(3)])
    db.put_messages([make_msg(CHAT2, Hlc(i)) for i in range(3)])
    other_chat_cursor = db.range(CHAT2, limit=1).next_cursor
    assert other_chat_cursor is not None
    for cursor in ("not base64!", "QUJD", other_chat_cursor, "", "é"):
        for direction in Direction:
            with pytest.raises(InvalidInput) as info:
                db.range(CHAT, cursor, direction=direction)
            assert info.value.reason == "bad_cursor"


def test_range_of_an_empty_chat(db: ChatDb) -> None:
    for direction in Direction:
        page = db.range(CHAT, direction=direction)
        assert page.items == [] and page.next_cursor is None


def test_range_at_the_top_of_the_key_space(db: ChatDb) -> None:
    """A chat id of all 0xff bytes has no prefix_end; its range must still work."""
    msgs = [make_msg(CHAT_FF, Hlc(i)) for i in range(5)]
    db.put_messages(msgs)
    db.put_message(make_msg(CHAT2, Hlc(1)))
    assert walk(db, CHAT_FF, 2, Direction.FORWARD) == [m.msg_id for m in msgs]
    assert walk(db, CHAT_FF, 2, Direction.BACKWARD) == [m.msg_id for m in reversed(msgs)]


def test_range_with_wrong_length_chat_raises(db: ChatDb) -> None:
    with pytest.raises(ValueError):
        db.range(CHAT[:31])


# --- members ------------------------------------------------------------------------------

PAIRS = [(c, u) for c in CHATS[:2] for u in USERS[:2]]
pair_ops = st.tuples(st.sampled_from(PAIRS), member_ops)


def apply_op(db: ChatDb, chat: bytes, user: bytes, op: tuple[Any, ...]) -> Any:
    if op[0] == "add":
        return db.add_member_synced(chat, user, op[1], op[2])
    if op[0] == "remove":
        return db.remove_member_synced(chat, user, op[1])
    return db.apply_member_record_synced(chat, user, op[1])


def check_member_indexes(db: ChatDb) -> None:
    """seen_member indexes exactly the stored member ops (unsigned rows are not replicated);
    meta follows the rows."""
    rows = member_rows(db)
    stored = {member_op_id(value[1:]): key for key, value in db.iter_all("member_ops")}
    assert dict(db.iter_all("seen_member")) == stored
    ids = member_record_ids(db)
    assert sorted(ids) == sorted(stored)
    for record_id in ids:
        assert record_id in db.get_bucket_member_ids(bucket_of(record_id))
    encoded, more = db.get_member_records_batch(sorted(ids), BIG)
    assert not more
    assert {member_op_id(e) for e in encoded} == set(stored)
    for chat in {c for c, _ in rows}:
        active = sorted(u for (c, u), info in rows.items() if c == chat and info.active)
        meta = db.get_chat_meta(chat) or ChatMeta()
        assert list(meta.members) == active
        mask = reduce(operator.xor, (int.from_bytes(u, "big") for u in active), 0)
        assert meta.membership_hash == mask.to_bytes(32, "big")


@DB_EXAMPLES
@given(st.lists(pair_ops, max_size=25))
def test_member_state_equals_the_pure_merge(ops: list[tuple[tuple[bytes, bytes], Any]]) -> None:
    with fresh_db() as db:
        model: dict[tuple[bytes, bytes], MemberInfo | None] = {}
        for (chat, user), op in ops:
            before = model.get((chat, user))
            change = apply_op(db, chat, user, op)
            after = fold_members([s for s in (before, op_state(op)) if s is not None])
            assert after is not None
            model[(chat, user)] = after
            assert change.info == after
            assert change.old_id == (
                None
                if before is None
                else compute_member_record_id(
                    chat, user, before.role, before.added_at, before.removed_at
                )
            )
            assert change.new_id == compute_member_record_id(
                chat, user, after.role, after.added_at, after.removed_at
            )
            assert change.changed == (before != after)
        for (chat, user), expected in model.items():
            assert db.get_member_record(chat, user) == expected
            assert expected is not None
            assert db.get_member_info(chat, user) == (expected if expected.active else None)
            assert db.is_member(chat, user) == expected.active
        for chat in CHATS[:2]:
            active = sorted(u for (c, u), i in model.items() if c == chat and i and i.active)
            assert db.list_members(chat) == active
        check_member_indexes(db)


@DB_EXAMPLES
@given(st.lists(pair_ops, min_size=1, max_size=20), st.integers(1, 6))
def test_batched_member_states_equal_one_by_one(
    ops: list[tuple[tuple[bytes, bytes], Any]], chunk: int
) -> None:
    """apply_member_states with repeated keys in one batch keeps index and rows consistent."""
    with fresh_db() as one, fresh_db() as batched:
        for (chat, user), op in ops:
            apply_op(one, chat, user, op)
        for i in range(0, len(ops), chunk):
            changes = batched.apply_member_states(
                [(c, u, op_state(op)) for (c, u), op in ops[i : i + chunk]]
            )
            assert len(changes) == len(ops[i : i + chunk])
        assert member_rows(batched) == member_rows(one)
        assert dict(batched.iter_all("seen_member")) == dict(one.iter_all("seen_member"))
        check_member_indexes(batched)


def test_reads_hide_tombstones(db: ChatDb) -> None:
    alice, bob = USERS[:2]
    db.add_member_synced(CHAT, alice, Role.ADMIN, Hlc(10))
    db.add_member_synced(CHAT, bob, Role.PARTICIPANT, Hlc(10))
    assert db.list_members(CHAT) == sorted([alice, bob])
    removal = db.remove_member_synced(CHAT, alice, Hlc(11))
    assert removal.changed
    assert db.get_member_info(CHAT, alice) is None
    assert not db.is_member(CHAT, alice)
    assert db.list_members(CHAT) == [bob]
    assert db.list_members_with_info(CHAT) == [(bob, MemberInfo(Role.PARTICIPANT, Hlc(10)))]
    assert db.get_member_record(CHAT, alice) == MemberInfo(Role.ADMIN, Hlc(10), Hlc(11))
    # the tombstone row stays; unsigned rows are local (sync ships signed ops only)
    check_member_indexes(db)
    assert member_record_ids(db) == []
    # an older add does not resurrect; a newer one does
    assert not db.add_member_synced(CHAT, alice, Role.ADMIN, Hlc(9)).changed
    assert not db.is_member(CHAT, alice)
    db.add_member_synced(CHAT, alice, Role.PARTICIPANT, Hlc(12))
    assert db.get_member_info(CHAT, alice) == MemberInfo(Role.PARTICIPANT, Hlc(12), Hlc(11))
    assert db.list_members(CHAT) == sorted([alice, bob])
    check_member_indexes(db)


def test_remove_of_an_unknown_member_is_a_tombstone_placeholder(db: ChatDb) -> None:
    change = db.remove_member_synced(CHAT, USERS[0], Hlc(5))
    assert change.old_id is None and change.changed
    assert db.get_member_record(CHAT, USERS[0]) == MemberInfo(Role.PARTICIPANT, HLC_ZERO, Hlc(5))
    assert db.list_members(CHAT) == []
    assert member_record_ids(db) == []  # unsigned: not replicated
    # an add older than the remove stays hidden; the placeholder keeps the remove
    db.add_member_synced(CHAT, USERS[0], Role.ADMIN, Hlc(4))
    assert not db.is_member(CHAT, USERS[0])
    check_member_indexes(db)


def test_unchanged_member_write_writes_nothing(db: ChatDb) -> None:
    db.add_member_synced(CHAT, USERS[0], Role.ADMIN, Hlc(5))
    before = dump_all(db)
    for change in (
        db.add_member_synced(CHAT, USERS[0], Role.ADMIN, Hlc(5)),
        db.add_member_synced(CHAT, USERS[0], Role.PARTICIPANT, Hlc(5)),
        db.apply_member_record_synced(CHAT, USERS[0], MemberInfo(Role.ADMIN, Hlc(4))),
    ):
        assert not change.changed
    assert dump_all(db) == before


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 9), st.booleans()), max_size=8))
@DB_EXAMPLES
def test_member_records_batch_respects_max_bytes(ops: list[tuple[int, int, bool]]) -> None:
    with fresh_db() as db:
        db.apply_member_ops([group_op(user, hlc, remove=remove) for user, hlc, remove in ops])
        ids = sorted(member_record_ids(db))
        check_batches(ids, db.get_member_records_batch)


# --- identity -----------------------------------------------------------------------------


def test_identity_last_writer_wins(db: ChatDb) -> None:
    user = USERS[0]
    assert db.get_identity(user) is None
    first = db.put_identity(user, Hlc(10), b"b")
    assert first.old_id is None and first.changed
    assert db.get_identity(user) == (Hlc(10), b"b")
    older = db.put_identity(user, Hlc(9), b"zzz")
    assert not older.changed and older.new_id == first.new_id
    tie_smaller = db.put_identity(user, Hlc(10), b"a")
    assert not tie_smaller.changed
    assert db.get_identity(user) == (Hlc(10), b"b")
    same = db.put_identity(user, Hlc(10), b"b")
    assert not same.changed
    tie_greater = db.put_identity(user, Hlc(10), b"c")
    assert tie_greater.changed and tie_greater.old_id == first.new_id
    assert db.get_identity(user) == (Hlc(10), b"c")
    newer = db.put_identity(user, Hlc(11), b"")
    assert newer.changed
    assert db.get_identity(user) == (Hlc(11), b"")
    assert identity_record_ids(db) == [compute_identity_record_id(user, Hlc(11), b"")]


identity_puts = st.lists(
    st.tuples(st.sampled_from(USERS[:3]), small_hlcs(3, 1), st.binary(max_size=2)), max_size=20
)


@DB_EXAMPLES
@given(identity_puts, st.integers(1, 5))
def test_identity_store_equals_lww_model(puts: list[tuple[bytes, Hlc, bytes]], chunk: int) -> None:
    with fresh_db() as db:
        for i in range(0, len(puts), chunk):
            changes = db.put_identities([IdentityRecord(*p) for p in puts[i : i + chunk]])
            assert len(changes) == len(puts[i : i + chunk])
        winners: dict[bytes, tuple[Hlc, bytes]] = {}
        for user, hlc, blob in puts:
            winners[user] = max(winners.get(user, (hlc, blob)), (hlc, blob))
        for user in USERS[:3]:
            assert db.get_identity(user) == winners.get(user)
        expected_ids = {compute_identity_record_id(u, *w) for u, w in winners.items()}
        ids = identity_record_ids(db)
        assert len(ids) == len(expected_ids) and set(ids) == expected_ids
        assert dict(db.iter_all("seen_identity")) == {
            compute_identity_record_id(u, *w): u for u, w in winners.items()
        }
        for rid in expected_ids:
            assert rid in db.get_bucket_identity_ids(bucket_of(rid))
        encoded, more = db.get_identity_records_batch(sorted(ids), BIG)
        assert not more
        assert {r.user_id: (r.hlc, r.blob) for r in map(decode_identity_record, encoded)} == winners
        check_batches(sorted(ids), db.get_identity_records_batch)


# --- inbox ------------------------------------------------------------------


def entry_for(chat: bytes, last_ts: int, last_seq: int = 1) -> InboxEntry:
    return InboxEntry(chat, ChatKind.GROUP, last_ts, b"\x01" * 32, USERS[3], last_seq, "hi")


def all_chats(db: ChatDb, user: bytes, limit: int = 200) -> list[Any]:
    items: list[Any] = []
    cursor = None
    while True:
        page = db.list_user_chats(user, cursor, limit=limit)
        assert len(page.items) <= limit
        items += page.items
        if page.next_cursor is None:
            return items
        assert len(page.items) == limit
        cursor = page.next_cursor


def test_inbox_keeps_one_entry_per_chat_newest_first(db: ChatDb) -> None:
    alice, bob = USERS[:2]
    db.upsert_inbox_for_members(CHAT, [alice, bob], entry_for(CHAT, 100, 4))
    db.upsert_inbox_for_members(CHAT2, [alice], entry_for(CHAT2, 200, 2))
    assert [i.entry.chat_id for i in all_chats(db, alice)] == [CHAT2, CHAT]
    db.upsert_inbox_for_members(CHAT, [alice, bob, alice], entry_for(CHAT, 300, 9))
    items = all_chats(db, alice)
    assert [i.entry.chat_id for i in items] == [CHAT, CHAT2]
    assert items[0].entry == entry_for(CHAT, 300, 9)
    assert [i.entry.chat_id for i in all_chats(db, bob)] == [CHAT]
    assert len(dict(db.iter_all("user_inbox"))) == 3
    # an older last_ts moves the chat back down
    db.upsert_inbox_for_members(CHAT, [alice], entry_for(CHAT, 150, 9))
    assert [i.entry.chat_id for i in all_chats(db, alice)] == [CHAT2, CHAT]
    assert all_chats(db, USERS[2]) == []


def test_inbox_takes_user_ids_as_any_bytes_like(db: ChatDb) -> None:
    alice = USERS[0]
    db.upsert_inbox_for_members(CHAT, [bytearray(alice), alice], entry_for(CHAT, 100, 4))
    db.upsert_inbox_for_members(CHAT, [memoryview(alice)], entry_for(CHAT, 200, 5))
    assert [item.entry.last_ts for item in all_chats(db, alice)] == [200]


def test_delete_user_inbox_entry(db: ChatDb) -> None:
    alice, bob = USERS[:2]
    db.upsert_inbox_for_members(CHAT, [alice, bob], entry_for(CHAT, 100))
    db.upsert_inbox_for_members(CHAT2, [alice], entry_for(CHAT2, 50))
    assert db.delete_user_inbox_entry(alice, CHAT)
    assert [i.entry.chat_id for i in all_chats(db, alice)] == [CHAT2]
    assert [i.entry.chat_id for i in all_chats(db, bob)] == [CHAT]
    assert not db.delete_user_inbox_entry(alice, CHAT)
    assert not db.delete_user_inbox_entry(USERS[2], CHAT)
    assert db.delete_user_inbox_entry(alice, CHAT2)
    assert all_chats(db, alice) == []
    db.upsert_inbox_for_members(CHAT, [alice], entry_for(CHAT, 300))
    assert db.delete_user_inbox_entry(bytearray(alice), memoryview(CHAT))  # any bytes-like id
    assert all_chats(db, alice) == []
    db.upsert_inbox_for_members(CHAT, [alice], entry_for(CHAT, 400))  # no stale cached key
    assert [i.entry.last_ts for i in all_chats(db, alice)] == [400]


@DB_EXAMPLES
@given(
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 10)), max_size=25),
    st.integers(1, 6),
)
def test_chat_list_pagination(updates: list[tuple[int, int]], limit: int) -> None:
    """Random upserts over 8 chats: one entry per chat, newest first, every chat once."""
    chats = [bytes([0xC0, i]) + bytes(30) for i in range(8)]
    user = USERS[0]
    with fresh_db() as db:
        latest: dict[bytes, InboxEntry] = {}
        for i, (last_ts, last_seq) in enumerate(updates):
            chat = chats[i % len(chats)]
            latest[chat] = entry_for(chat, last_ts, last_seq)
            db.upsert_inbox_for_members(chat, [user], latest[chat])
        items = all_chats(db, user, limit)
        assert [i.entry for i in items] == sorted(
            latest.values(), key=lambda e: (-e.last_ts, e.chat_id)
        )


@DB_EXAMPLES
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 3), st.booleans(), st.booleans()),
        min_size=1,
        max_size=20,
    )
)
def test_refresh_inboxes_keeps_one_entry_per_user_and_chat(
    steps: list[tuple[int, int, bool, bool]],
) -> None:
    """Members' entries moved by each new message, with or without the last_ts hint, with
    the key cache forgotten now and then (a restart, an overflow): every (user, chat) that
    was ever written has exactly one entry, and this step's sender's points at the newest."""
    from store.signing import key_from_seed, public_key, user_id_from_key

    keys = [key_from_seed(bytes([0x50 + i]) * 32) for i in range(4)]
    users = [user_id_from_key(public_key(k)) for k in keys]
    chats = [bytes([0xD0, i]) + bytes(30) for i in range(3)]
    written: set[tuple[bytes, bytes]] = set()
    with fresh_db() as db:
        for chat in chats:
            for user in users:
                db.add_member_synced(chat, user, Role.PARTICIPANT, Hlc(1))
        for n, (c, u, hint, forget) in enumerate(steps):
            chat = chats[c]
            previous = {chat: db.load_meta(chat).last_ts} if hint else {}
            msg = MsgV1.create(keys[u], chat, Hlc(1_000 + n), b"m")
            db.put_messages([msg])
            if forget:
                db.inbox._inbox_keys.clear()
            db.refresh_inboxes([msg], previous)
            written.update((user, chat) for user in users)
            assert db.list_user_chats(users[u]).items[0].entry.last_msg_id == msg.msg_id
        for user in users:
            listed = [item.entry.chat_id for item in all_chats(db, user)]
            assert sorted(listed) == sorted(ch for us, ch in written if us == user)


def test_chat_list_bad_cursor_and_limit(db: ChatDb) -> None:
    db.upsert_inbox_for_members(CHAT, [USERS[0], USERS[1]], entry_for(CHAT, 1))
    db.upsert_inbox_for_members(CHAT2, [USERS[0], USERS[1]], entry_for(CHAT2, 2))
    other = db.list_user_chats(USERS[1], limit=1).next_cursor
    assert other is not None
    for cursor in ("%%%", other, "QUJD"):
        with pytest.raises(InvalidInput) as info:
            db.list_user_chats(USERS[0], cursor)
        assert info.value.reason == "bad_cursor"
    for limit in (0, 201):
        with pytest.raises(InvalidInput):
            db.list_user_chats(USERS[0], limit=limit)


# --- sync helpers -------------------------------------------------------------------------


def check_batches(ids: list[bytes], fetch: Any) -> None:
    """A ``*_batch`` helper: a prefix of the records within max_bytes (at least one)."""
    full, more = fetch(ids, BIG)
    assert not more and len(full) == len(ids)
    sizes = [len(r) for r in full]
    for max_bytes in {0, 1, *sizes, sum(sizes) // 2, sum(sizes), sum(sizes) + 1}:
        got, more = fetch(ids, max_bytes)
        assert got == full[: len(got)]
        if full:
            assert len(got) >= 1
        assert sum(map(len, got)) <= max_bytes or len(got) == 1
        assert more == (len(got) < len(full))
        if more:
            assert sum(map(len, got)) + len(full[len(got)]) > max_bytes


def test_bucket_msg_ids(db: ChatDb) -> None:
    msgs = [make_msg(CHATS[i % 2], Hlc(i)) for i in range(40)]
    db.put_messages(msgs)
    ids = {m.msg_id for m in msgs}
    buckets = {bucket_of(i) for i in ids}
    union: set[bytes] = set()
    for bucket in buckets:
        got = db.get_bucket_msg_ids(bucket)
        assert got == sorted(got)
        assert all(bucket_of(i) == bucket for i in got)
        union.update(got)
    assert union == ids
    empty = next(b for b in range(1 << 16) if b not in buckets)
    assert db.get_bucket_msg_ids(empty) == []
    pairs: list[tuple[bytes, int]] = []
    db.for_each_msg_id(lambda mid, physical: pairs.append((mid, physical)))
    assert sorted(pairs) == sorted((m.msg_id, m.hlc.physical_ms) for m in msgs)


def test_messages_cbor_batch(db: ChatDb) -> None:
    msgs = [make_msg(CHAT, Hlc(i), b"x" * (i * 7)) for i in range(12)]
    db.put_messages(msgs)
    ids = [m.msg_id for m in msgs]
    unknown = [b"\xee" * 32, b"\x00" * 32]
    got, more = db.get_messages_cbor_batch([unknown[0], *ids, unknown[1]], BIG)
    assert got == [m.encoded for m in msgs] and not more  # unknown ids skipped, order kept
    assert db.get_messages_cbor_batch(unknown, BIG) == ([], False)
    assert db.get_messages_cbor_batch([], 10) == ([], False)
    check_batches(ids, db.get_messages_cbor_batch)
    # a record larger than the whole budget still comes out alone
    assert db.get_messages_cbor_batch(ids[-1:], 1) == ([msgs[-1].encoded], False)


@given(st.lists(st.integers(0, 300), min_size=1, max_size=12), st.integers(0, 3_000))
@DB_EXAMPLES
def test_messages_cbor_batch_property(payload_sizes: list[int], max_bytes: int) -> None:
    with fresh_db() as db:
        msgs = [make_msg(CHAT, Hlc(i), b"p" * n) for i, n in enumerate(payload_sizes)]
        db.put_messages(msgs)
        got, more = db.get_messages_cbor_batch([m.msg_id for m in msgs], max_bytes)
        full = [m.encoded for m in msgs]
        assert got == full[: len(got)] and len(got) >= 1
        assert sum(map(len, got)) <= max_bytes or len(got) == 1
        assert more == (len(got) < len(full))


def test_filtered_sync_helpers(db: ChatDb) -> None:
    msgs = [make_msg(CHAT, Hlc(t, 5)) for t in (10, 20, 30)]
    db.put_messages(msgs)
    for msg in msgs:
        bucket = bucket_of(msg.msg_id)
        assert (msg.msg_id in db.get_bucket_msg_ids_filtered(bucket, 20)) == (
            msg.hlc.physical_ms > 20
        )
    got, more = db.get_messages_cbor_batch_filtered([m.msg_id for m in msgs], BIG, 20)
    assert got == [msgs[2].encoded] and not more


# --- retention ----------------------------------------------------------------------------


@DB_EXAMPLES
@given(
    st.lists(st.tuples(small_hlcs(6, 65_535), st.sampled_from(CHATS[:2])), max_size=25),
    st.integers(0, 7),
)
def test_range_delete_old_messages(entries: list[tuple[Hlc, bytes]], cutoff: int) -> None:
    with fresh_db() as db:
        msgs = [make_msg(chat, hlc) for hlc, chat in entries]
        db.put_messages(msgs)
        db.range_delete_old_messages(CHAT, cutoff)
        kept = {m.msg_id for m in msgs if m.chat_id != CHAT or m.hlc.physical_ms > cutoff}
        left = {item.msg.msg_id for chat in CHATS[:2] for item in db.range(chat, limit=200).items}
        assert left == kept
        for msg in msgs:
            assert (db.get_message(msg.msg_id) is not None) == (msg.msg_id in kept)
        # seen_msg is cleared separately (scan_seen_msg_aged + delete_seen_msg_batch)
        assert set(msg_ids(db)) == {m.msg_id for m in msgs}
        db.compact()
        assert {i.msg.msg_id for c in CHATS[:2] for i in db.range(c, limit=200).items} == kept


def test_range_delete_takes_any_logical_and_seq(db: ChatDb) -> None:
    edge = [make_msg(CHAT, Hlc(100, 65_535)), make_msg(CHAT, Hlc(100, 0)), make_msg(CHAT, Hlc(101))]
    db.put_messages(edge)
    db.put_message(make_msg(CHAT, Hlc(100, 65_535), b"another seq, same stamp"))
    db.range_delete_old_messages(CHAT, 100)
    assert [i.msg.msg_id for i in db.range(CHAT).items] == [edge[2].msg_id]


def test_scan_and_delete_seen_msg(db: ChatDb) -> None:
    msgs = [make_msg(CHAT, Hlc(t)) for t in (5, 10, 15, 20, 25)]
    db.put_messages(msgs)
    aged = db.scan_seen_msg_aged(15, 100)
    assert set(aged) == {m.msg_id for m in msgs[:3]}
    limited = db.scan_seen_msg_aged(15, 2)
    assert len(limited) == 2 and set(limited) <= set(aged)
    assert db.scan_seen_msg_aged(4, 100) == []
    db.delete_seen_msg_batch(aged)
    for msg in msgs:
        assert db.has_message(msg.msg_id) == (msg.hlc.physical_ms > 15)
    assert db.scan_seen_msg_aged(15, 100) == []
    db.delete_seen_msg_batch([])
    assert len(msg_ids(db)) == 2


@given(small_hlcs(1_000, 65_535), st.integers(0, 4))
def test_extract_hlc_physical_from_seen_value(hlc: Hlc, seq: int) -> None:
    key = key_messages(CHAT, hlc.pack(), seq)
    assert extract_hlc_physical_from_seen_value(key) == hlc.physical_ms


@pytest.mark.parametrize("length", [1, 8, 40, 43, 45, 60])
def test_extract_hlc_physical_wrong_length_is_none(length: int) -> None:
    assert extract_hlc_physical_from_seen_value(b"\x01" * length) is None


def test_extract_hlc_physical_empty_is_zero(db: ChatDb) -> None:
    assert extract_hlc_physical_from_seen_value(b"") == 0
    # a legacy empty seen_msg value is aged at any cutoff
    legacy = b"\x77" * 32
    batch = db.new_batch()
    batch.put(legacy, b"", db.rocks.handle["seen_msg"])
    db.write(batch)
    assert db.scan_seen_msg_aged(0, 10) == [legacy]
    assert db.get_message(legacy) is None


# --- persistence --------------------------------------------------------------------------


def _table_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.sst"))


def test_compression_is_applied_and_a_store_reopens_under_another(tmp_path: Path) -> None:
    msgs = [make_msg(CHAT, Hlc(i), b"compressible " * 40, author=i % 3) for i in range(2_000)]
    sizes = {}
    for name in ("none", "zstd", "lz4"):
        with ChatDb(small_config(str(tmp_path / name), compression=name)) as db:
            db.put_messages(msgs)
            db.flush()
            db.compact()
        sizes[name] = _table_bytes(tmp_path / name)
    assert sizes["zstd"] < sizes["none"] / 2 and sizes["lz4"] < sizes["none"] / 2, sizes
    # blocks name their compression: a Zstd store opens as LZ4, is written, opens as Zstd
    path = str(tmp_path / "zstd")
    with ChatDb(small_config(path, compression="lz4")) as db:
        before = dump_all(db)
        db.put_message(make_msg(CHAT2, Hlc(5), b"later"))
        db.flush()
        db.compact()
        after = dump_all(db)
    assert all(rows.items() <= after[cf].items() for cf, rows in before.items())
    with ChatDb(small_config(path, compression="zstd")) as db:
        assert dump_all(db) == after
        assert len(msg_ids(db)) == 2_001


def test_an_unknown_compression_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'brotli': one of lz4, none, zstd"):
        small_config(str(tmp_path / "db"), compression="brotli")


def test_data_persists_across_close_and_reopen(tmp_path: Path) -> None:
    config = small_config(str(tmp_path / "db"))
    msgs = [make_msg(CHAT, Hlc(i), author=1) for i in range(5)]
    receipt = receipt_of(msgs[1], Hlc(9))
    with ChatDb(config) as db:
        db.put_messages([*msgs, receipt])
        db.add_member_synced(CHAT, USERS[0], Role.ADMIN, Hlc(3))
        db.remove_member_synced(CHAT, USERS[1], Hlc(4))
        db.put_identity(USERS[0], Hlc(9), b"id")
        db.upsert_inbox_for_members(CHAT, [USERS[0]], entry_for(CHAT, 4, 5))
        before = dump_all(db)
        meta = db.get_chat_meta(CHAT)
    db.close()  # closing twice is harmless
    with ChatDb(config) as db:
        assert dump_all(db) == before
        assert db.get_chat_meta(CHAT) == meta
        assert db.put_message(msgs[0]).duplicate
        assert db.put_message(make_msg(CHAT, Hlc(50))).seq == 7  # the counter continues
        assert db.is_member(CHAT, USERS[0])
        assert db.get_identity(USERS[0]) == (Hlc(9), b"id")
        assert db.read_position(CHAT, AUTHOR_IDS[0]) == Hlc(1)
        assert db.unread_count(CHAT, AUTHOR_IDS[0], Hlc(1)) == 3  # author 1's at 2, 3, 4
        check_member_indexes(db)


def test_chatdb_accepts_a_path_argument(tmp_path: Path) -> None:
    with ChatDb(path=tmp_path / "p") as db:
        db.put_message(make_msg(CHAT, Hlc(1)))
        assert db.config.path == str(tmp_path / "p")
    assert (tmp_path / "p").is_dir()


def test_message_values_decode(db: ChatDb) -> None:
    msgs: list[MsgV1] = [make_msg(CHAT, Hlc(i), bytes([i])) for i in range(3)]
    db.put_messages(msgs)
    for key, value in db.iter_all("messages"):
        msg = decode_msg(value)
        assert parse_key_messages(key)[:2] == (msg.chat_id, msg.hlc.pack())


def test_refresh_inboxes_keeps_one_entry_per_member_with_or_without_the_fast_path(db) -> None:  # type: ignore[no-untyped-def]
    from store.signing import key_from_seed, public_key, user_id_from_key

    keys = [key_from_seed(bytes([0x70 + i]) * 32) for i in range(3)]
    users = [user_id_from_key(public_key(k)) for k in keys]
    chat = b"\x66" * 32
    for user in users[:2]:
        db.add_member_synced(chat, user, Role.PARTICIPANT, Hlc(1))
    for step in range(1, 6):
        previous = {chat: db.load_meta(chat).last_ts}
        msgs = [MsgV1.create(keys[step % 3], chat, Hlc(100 * step + i), b"m") for i in range(3)]
        db.put_messages(msgs)
        if step == 3:
            previous = {}  # no hint: the slow path must give the same result
        db.refresh_inboxes(msgs, previous)
        meta = db.load_meta(chat)
        for user in users[:2]:
            items = [i for i in db.list_user_chats(user).items if i.entry.chat_id == chat]
            assert len(items) == 1
            assert items[0].entry.last_msg_id == meta.last_msg_id
            assert items[0].entry.last_seq == meta.last_seq
