"""The unread counters (store.unread) equal a recount at every point, and after a restart.

A counter is derived state kept in the WriteBatch of each write that changes what it
counts: messages shown (content, receipts), member adds and removals (entries written or
deleted), removals that hide messages stamped after them, deletes that erase, the
retention trim. Whatever the order and duplication of those ops, every counter row equals
``Receipts.recount`` and every chat list reads the recount.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import ChatDb, Hlc, MessageKind, MsgV1
from store.authz import new_group
from store.errors import DecodeError
from store.kinds import Claims
from store.ops import MembershipAction, MembershipOp
from store.records import Role
from store.retention import trim_chats
from store.unread_counter import (
    UNREAD_CAP,
    Reader,
    Tally,
    count_of,
    decode_tally,
    decode_total,
    encode_tally,
    encode_total,
    follow_tallies,
    unread_of,
)
from sync.replica import DbReplica

from store_support import AUTHOR_IDS, KEYS, fresh_db, receipt_of, small_config

GROUPS = [new_group(KEYS[c], b"unread-counter%02d" % c) for c in range(2)]  # chat c: KEYS[c]'s

Step = tuple[str, int, int, int, int]  # (what, user, chat, stamp, which earlier op or message)


def member_op(user: int, chat: int, stamp: int, *, remove: bool) -> MembershipOp:
    action = MembershipAction.REMOVE if remove else MembershipAction.ADD
    group = GROUPS[chat]
    return MembershipOp.create(
        KEYS[chat], group.chat_id(), AUTHOR_IDS[user], action, Hlc(stamp), Role.PARTICIPANT,
        proof=group,
    )  # fmt: skip


def ops_of(step: Step, posted: list[MsgV1], played: list[list[object]]) -> list[object]:
    what, user, chat, stamp, which = step
    chat_id = GROUPS[chat].chat_id()
    mine = [m for m in posted if m.chat_id == chat_id]
    if what in ("add", "remove"):
        return [member_op(user, chat, stamp, remove=what == "remove")]
    if what == "again" and played:  # an op delivered twice
        return played[which % len(played)]
    if what in ("receipt", "edit", "delete") and mine:
        target = mine[which % len(mine)]
        if what == "receipt":
            return [receipt_of(target, Hlc(stamp, 1), author=user)]
        if what == "delete":  # by its sender: erases it
            payload = Claims.of(target).encode()
            author = AUTHOR_IDS.index(target.sender)
            return [
                MsgV1.create(
                    KEYS[author], chat_id, Hlc(stamp, 2), payload, kind=MessageKind.DELETE,
                    ref=target.msg_id,
                )
            ]  # fmt: skip
        kind = MessageKind.EDIT if which % 2 else MessageKind.REACTION
        payload = b"\x01+1" if kind is MessageKind.REACTION else b"edited"
        return [
            MsgV1.create(KEYS[user], chat_id, Hlc(stamp), payload, kind=kind, ref=target.msg_id)
        ]
    kind = MessageKind.REPLY if what == "reply" and mine else MessageKind.NEW
    ref = mine[which % len(mine)].msg_id if kind is MessageKind.REPLY else None
    msg = MsgV1.create(KEYS[user], chat_id, Hlc(stamp), b"m%d" % stamp, kind=kind, ref=ref)
    posted.append(msg)
    return [msg]


def counter_rows(db: ChatDb) -> dict[bytes, tuple[int | None, int]]:
    """(chat | reader) -> (position, unread count), from the rows; every row checked against
    a recount of the chat (totals, senders' own counts)."""
    totals: dict[bytes, int] = {}
    tallies: dict[bytes, Tally] = {}
    for key, value in db.iter_all("unread"):
        if len(key) == 32:
            totals[key] = decode_total(value)
        else:
            tallies[key] = decode_tally(value)
    for chat, total in totals.items():
        owns = db.receipts.content_by_sender(chat)
        assert total == sum(owns.values()), chat.hex()
        for user, own in owns.items():
            assert tallies[chat + user].own == own, user.hex()
    out = {}
    for key, tally in tallies.items():
        assert key[:32] in totals, "a tally without its chat's total"
        if tally.reader is not None:
            out[key] = (tally.reader.position, unread_of(totals[key[:32]], tally))
    return out


def check_counters(db: ChatDb) -> int:
    """Every reader's count equals a recount, and every chat list reads the recount; how many
    readers there are."""
    rows = counter_rows(db)
    for key, counter in rows.items():
        assert counter == db.receipts.recount(key[:32], key[32:]), key.hex()
    for user in AUTHOR_IDS:
        for item in db.list_user_chats(user).items:
            position = db.read_position(item.entry.chat_id, user)
            assert item.unread == db.unread_count(item.entry.chat_id, user, position)
    return len(rows)


WHAT = ["post", "post", "post", "reply", "add", "add", "remove", "remove", "receipt", "receipt"]
WHAT += ["edit", "delete", "delete", "again", "flush", "trim"]
steps = st.lists(
    st.tuples(
        st.sampled_from(WHAT),
        st.integers(0, 2),
        st.integers(0, 1),
        st.integers(1, 60),
        st.integers(0, 50),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(steps, st.booleans(), st.booleans())
def test_every_counter_equals_a_recount_after_every_op(
    plan: list[Step], batched: bool, listed: bool
) -> None:
    """Any order and duplication of posts, receipts, edits, reactions, deletes, adds and
    removals (hiding what a removed sender stamped later), trims; applied one op at a time
    or two steps' ops in one batch; the chat lists written after every write (``listed``:
    the counters exist from the first entry) or when a step says so."""
    with fresh_db() as db:
        replica = DbReplica(db)
        replica.apply_ops([member_op(c, c, 0, remove=False) for c in range(2)])
        replica.apply_ops([member_op(u, c, 1, remove=False) for c in range(2) for u in range(3)])
        posted: list[MsgV1] = []
        played: list[list[object]] = []
        pending: list[object] = []
        for n, step in enumerate(plan):
            if step[0] == "flush":
                db.flush_chat_lists()
            elif step[0] == "trim":
                trim_chats(db, step[3] // 2)
            else:
                ops = ops_of(step, posted, played)
                played.append(ops)
                pending += ops
            if pending and (not batched or n % 2 or n == len(plan) - 1):
                replica.apply_ops(pending)  # type: ignore[arg-type]
                pending = []
                if listed:
                    db.flush_chat_lists()
            check_counters(db)


def test_the_counters_are_kept_written_and_used(tmp_path: Path) -> None:
    """Members added, posts, a receipt: each member has a counter row, equal after a
    restart, and the chat list reads it (no recount)."""
    chat = GROUPS[0].chat_id()
    posts = [MsgV1.create(KEYS[n % 3], chat, Hlc(10 + n), b"p%d" % n) for n in range(9)]
    with ChatDb(small_config(str(tmp_path))) as db:
        replica = DbReplica(db)
        replica.apply_ops([member_op(u, 0, 1, remove=False) for u in range(3)])
        replica.apply_ops(posts[:3])
        db.flush_chat_lists()  # the entries, and their counters
        replica.apply_ops([*posts[3:], receipt_of(posts[4], Hlc(30), author=1)])
        before = counter_rows(db)
        assert len(before) == 3 and check_counters(db) == 3
        by_user = {key[32:]: count for key, (_, count) in before.items()}
        assert [by_user[user] for user in AUTHOR_IDS] == [6, 3, 6]  # 1 read up to posts[4]
    with ChatDb(small_config(str(tmp_path))) as db:
        assert counter_rows(db) == before
        db.receipts.__dict__["unread_for"] = _no_recount  # the list must read the counters
        counts = [db.list_user_chats(user).items[0].unread for user in AUTHOR_IDS]
        assert counts == [6, 3, 6]


def _no_recount(chat_id: bytes, user_id: bytes) -> int:
    raise AssertionError("recounted")


def test_a_removed_member_loses_the_counter_with_the_entry() -> None:
    chat = GROUPS[0].chat_id()
    with fresh_db() as db:
        replica = DbReplica(db)
        replica.apply_ops([member_op(u, 0, 1, remove=False) for u in range(2)])
        replica.apply_ops([MsgV1.create(KEYS[0], chat, Hlc(5), b"hi")])
        db.flush_chat_lists()
        assert len(counter_rows(db)) == 2
        replica.apply_ops([member_op(1, 0, 9, remove=True)])
        assert list(counter_rows(db)) == [chat + AUTHOR_IDS[0]]
        assert decode_tally(db.get("unread", chat + AUTHOR_IDS[1]) or b"") == Tally(0, None)
        assert check_counters(db) == 1


def test_a_store_without_counters_is_recounted_when_read() -> None:
    """An earlier version's store has no counter rows: the list recounts, and the next
    entry written creates them."""
    chat = GROUPS[0].chat_id()
    with fresh_db() as db:
        replica = DbReplica(db)
        replica.apply_ops([member_op(u, 0, 1, remove=False) for u in range(2)])
        replica.apply_ops([MsgV1.create(KEYS[0], chat, Hlc(5), b"hi")])
        db.flush_chat_lists()
        batch = db.new_batch()
        for key, _ in db.iter_all("unread"):
            batch.delete(key, db.rocks.handle["unread"])
        db.rocks.write(batch)
        db.unread.forget()
        assert counter_rows(db) == {}
        assert [i.unread for i in db.list_user_chats(AUTHOR_IDS[1]).items] == [1]
        replica.apply_ops([MsgV1.create(KEYS[0], chat, Hlc(6), b"again")])
        db.flush_chat_lists()
        assert len(counter_rows(db)) == 2 and check_counters(db) == 2


def test_the_count_stops_at_the_cap_and_a_receipt_recounts() -> None:
    chat = GROUPS[0].chat_id()
    posts = [MsgV1.create(KEYS[0], chat, Hlc(10 + n), b"p") for n in range(UNREAD_CAP + 3)]
    with fresh_db() as db:
        replica = DbReplica(db)
        replica.apply_ops([member_op(u, 0, 1, remove=False) for u in range(2)])
        replica.apply_ops(posts[:1])
        db.flush_chat_lists()
        replica.apply_ops(posts[1:])
        assert counter_rows(db)[chat + AUTHOR_IDS[1]] == (None, UNREAD_CAP)
        replica.apply_ops([receipt_of(posts[9], Hlc(5000), author=1)])
        assert counter_rows(db)[chat + AUTHOR_IDS[1]] == (posts[9].hlc.pack(), UNREAD_CAP - 7)
        assert check_counters(db) == 2


# --- the pure fold and the row's bytes ---


def no_scan(user: bytes, position: int) -> tuple[int, int]:
    raise AssertionError("scanned")


def test_follow_adds_new_content_to_the_total_and_its_senders() -> None:
    alice, bob = b"a" * 20, b"b" * 20
    tallies = {alice: Tally(2, Reader(0, 0, None)), bob: Tally(1, Reader(3, 1, 15))}
    shown = [(10, alice, True, None), (20, alice, True, None), (30, bob, True, None)]
    total, changed = follow_tallies(3, tallies, shown, no_scan)
    assert total == 6
    # 10 is at or before bob's position (15): it came late, so it is below it
    assert changed == {alice: Tally(4, Reader(0, 0, None)), bob: Tally(2, Reader(4, 1, 15))}
    assert [unread_of(total, changed[u]) for u in (alice, bob)] == [2, 1]


def test_follow_recounts_a_reader_whose_position_moves() -> None:
    alice, bob = b"a" * 20, b"b" * 20
    tallies = {alice: Tally(1, Reader(2, 0, 10)), bob: Tally(4, None)}
    shown = [(40, alice, False, 25), (50, bob, True, None)]
    # on disk after 25: 2 messages, 1 of them alice's
    total, changed = follow_tallies(5, tallies, shown, lambda user, at: (2, 1))
    assert total == 6 and changed[bob] == Tally(5, None)
    assert changed[alice] == Tally(1, Reader(6 - 3, 1 - 1, 25))
    assert unread_of(total, changed[alice]) == 2  # bob's on disk after 25, and the new one


@pytest.mark.parametrize(
    "tally",
    [Tally(0, None), Tally(5, None), Tally(3, Reader(9, 3, None)), Tally(7, Reader(9, 2, 1 << 63))],
)
def test_a_tally_row_round_trips(tally: Tally) -> None:
    assert decode_tally(encode_tally(tally)) == tally
    assert decode_total(encode_total(12)) == 12


@pytest.mark.parametrize(
    "raw",
    [b"", b"\x00", b"\x00" * 7, b"\x00" * 9, b"\x00" * 16, b"\x00" * 23, b"\x00" * 33,
     b"\x00" * 1_000_000, b"\x00" * 8 + b"\x00" * 8 + b"\x00" * 7 + b"\x01"],
)  # fmt: skip
def test_a_malformed_or_oversized_tally_row_is_a_decode_error(raw: bytes) -> None:
    """Wrong lengths, and more of the reader's own messages below the position than exist."""
    with pytest.raises(DecodeError):
        decode_tally(raw)


@pytest.mark.parametrize("raw", [b"", b"\x00" * 7, b"\x00" * 9, b"\x00" * 1_000_000])
def test_a_malformed_or_oversized_total_row_is_a_decode_error(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_total(raw)


def _rows(size: int) -> st.SearchStrategy[bytes]:
    """Rows of a valid length whose fields are small (so they are often consistent)."""
    fields = st.lists(st.integers(0, 5), min_size=size // 8, max_size=size // 8)
    return fields.map(lambda ns: b"".join(n.to_bytes(8, "big") for n in ns))


@given(st.binary(max_size=40))
def test_any_bytes_decode_to_a_valid_tally_or_a_decode_error(raw: bytes) -> None:
    try:
        tally = decode_tally(raw)
    except DecodeError:
        return
    assert encode_tally(tally) == raw


@given(
    st.one_of(st.binary(max_size=40), st.sampled_from([8, 24, 32]).flatmap(_rows)),
    st.one_of(st.binary(max_size=12), _rows(8)),
)
def test_the_lists_read_decodes_as_the_rows_do(tally_raw: bytes, total_raw: bytes) -> None:
    """count_of (the chat list's read) = decode_total and decode_tally, then unread_of: the
    same answer or the same DecodeError, for any bytes."""
    try:
        tally, total = decode_tally(tally_raw), decode_total(total_raw)
    except DecodeError:
        with pytest.raises(DecodeError):
            count_of(total_raw, tally_raw)
        return
    want = None if tally.reader is None else unread_of(total, tally)
    assert count_of(total_raw, tally_raw) == want


def test_no_invalid_row_is_written() -> None:
    for bad in (Tally(-1, None), Tally(1, Reader(0, 2, None)), Tally(1 << 64, None)):
        with pytest.raises(ValueError):
            encode_tally(bad)
    with pytest.raises(ValueError):
        encode_total(-1)
