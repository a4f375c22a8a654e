"""The event log's rows (store/events.py): one row per write, holding its events, and a
shown message's position kept in its seen_msg value. Issue 39: a batch of messages writes
one events row and no event_at rows; the log reads as before, rows of earlier versions too.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from store import ChatDb, ChatDbConfig, Hlc, MsgV1
from store.events import (
    POSITION_LEN,
    SEGMENT,
    EventKind,
    read_segment,
    seen_position,
    seen_value,
)
from store.keys import MESSAGES_KEY_LEN, extract_hlc_physical_from_seen_value, key_messages

from store_support import CHATS, make_msg


def _open(path: Path) -> ChatDb:
    return ChatDb(ChatDbConfig(path=str(path), block_cache_mb=8, memtable_mb=8))


def _log(db: ChatDb, after: int = 0, limit: int = 10_000) -> list[tuple[int, EventKind, bytes]]:
    return list(db.events.events_after(after, limit))


def _batches(sizes: list[int]) -> list[list[MsgV1]]:
    stamp, out = 0, []
    for size in sizes:
        batch: list[MsgV1] = []
        for _ in range(size):
            stamp += 1
            batch.append(make_msg(CHATS[stamp % 2], Hlc(1_000 + stamp), b"m%d" % stamp))
        out.append(batch)
    return out


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 7), min_size=1, max_size=6), st.integers(1, 9))
def test_the_log_reads_every_position_once_from_anywhere(sizes: list[int], limit: int) -> None:
    """Batches of messages, one events row each: paged from any position with any limit,
    the log gives positions after it in order, each once, each message's key."""
    with tempfile.TemporaryDirectory() as tmp:
        db = _open(Path(tmp))
        try:
            keys = []
            for batch in _batches(sizes):
                db.put_messages(batch)
                keys += [(db.get("seen_msg", m.msg_id) or b"")[:MESSAGES_KEY_LEN] for m in batch]
            total = sum(sizes)
            assert db.last_position == total
            assert len(list(db.rocks.iter_all("events"))) == len(sizes)  # one row per write
            assert list(db.rocks.iter_all("event_at")) == []  # no longer written
            everything = _log(db)
            assert [(p, k) for p, k, _ in everything] == [
                (p, EventKind.MESSAGE) for p in range(1, total + 1)
            ]
            assert sorted(ref for _, _, ref in everything) == sorted(keys)
            for after in range(total + 1):
                page = _log(db, after, limit)
                assert page == everything[after : after + limit]
        finally:
            db.close()


def test_a_messages_position_is_in_its_seen_value_and_outlives_a_restart(
    tmp_path: Path,
) -> None:
    msgs = _batches([3, 2])
    with _open(tmp_path) as db:
        for batch in msgs:
            db.put_messages(batch)
        db.put_message(make_msg(CHATS[2], Hlc(5_000), b"one"))
        positions = {ref: p for p, _, ref in _log(db)}
    with _open(tmp_path) as db:  # reopened: the log and the positions as they were
        assert db.last_position == 6
        for m in [*msgs[0], *msgs[1], make_msg(CHATS[2], Hlc(5_000), b"one")]:
            seen = db.get("seen_msg", m.msg_id)
            assert seen is not None and len(seen) == MESSAGES_KEY_LEN + POSITION_LEN
            assert db.events.event_position(seen) == positions[seen[:MESSAGES_KEY_LEN]]
            assert extract_hlc_physical_from_seen_value(seen) == m.hlc.physical_ms
            assert db.get_message(m.msg_id) == m
        extra = make_msg(CHATS[0], Hlc(9_000), b"after")
        db.put_message(extra)  # continues after the reopened log's last position
        assert db.events.event_position(db.get("seen_msg", extra.msg_id) or b"") == 7


def test_rows_of_an_earlier_version_read_beside_new_ones(tmp_path: Path) -> None:
    """Before: events[position] = kind | key, one row an event, and event_at[key] = position."""
    old_key = key_messages(CHATS[0], Hlc(10).pack(), 1)
    with _open(tmp_path) as db:
        batch = db.new_batch()
        handle = db.rocks.handle
        for position, (kind, ref) in enumerate(
            [(EventKind.MESSAGE, old_key), (EventKind.DELETE, b"d" * 96)], 1
        ):
            at = position.to_bytes(POSITION_LEN, "big")
            batch.put(at, bytes([kind]) + ref, handle["events"])
        batch.put(old_key, (1).to_bytes(POSITION_LEN, "big"), handle["event_at"])
        db.rocks.write(batch)
    with _open(tmp_path) as db:
        assert db.last_position == 2  # the last row is one of the old ones
        db.put_messages(_batches([2])[0])
        assert [(p, k) for p, k, _ in _log(db)] == [
            (1, EventKind.MESSAGE), (2, EventKind.DELETE), (3, EventKind.MESSAGE),
            (4, EventKind.MESSAGE),
        ]  # fmt: skip
        assert _log(db, 1, 1) == [(2, EventKind.DELETE, b"d" * 96)]
        assert db.events.event_position(old_key) == 1  # a 44-byte seen value: event_at
        assert db.events.event_position(key_messages(CHATS[0], 11, 1)) is None
    with _open(tmp_path) as db:
        assert db.last_position == 4


def test_seen_values() -> None:
    key = key_messages(CHATS[1], Hlc(123_456, 7).pack(), 9)
    assert seen_position(seen_value(key, 77)) == 77
    assert seen_position(key) is None
    assert extract_hlc_physical_from_seen_value(seen_value(key, 1)) == 123_456
    assert extract_hlc_physical_from_seen_value(key + b"x") is None


@settings(max_examples=300)
@given(st.binary(max_size=600), st.integers(0, 1 << 40))
def test_read_segment_on_any_bytes_never_raises_and_stays_in_the_row(
    value: bytes, first: int
) -> None:
    """Malformed, truncated or oversized rows: the events that parse, never past the row."""
    for row in (value, SEGMENT + value):
        events = read_segment(first, row)
        assert [p for p, _, _ in events] == list(range(first, first + len(events)))
        assert sum(len(ref) + 1 for _, _, ref in events) <= len(row)


def test_read_segment_stops_at_a_length_past_the_row() -> None:
    good = bytes([EventKind.MEMBER, 3]) + b"abc"
    assert read_segment(5, SEGMENT + good + bytes([EventKind.DELETE, 200]) + b"xy") == [
        (5, EventKind.MEMBER, b"abc")
    ]
    assert read_segment(5, SEGMENT + bytes([9, 1]) + b"z") == []  # no such kind
    assert read_segment(5, b"") == []
