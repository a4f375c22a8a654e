"""This node's event log: what became readable here, in the order it was committed.

Each write that makes something readable — a shown message stored or shown after all, a
delete, a member op, a message hidden after it was shown — appends its events in the same
WriteBatch, so an event is on disk exactly when its record is. The events of one write
are one row: ``events[first position:8]`` -> ``SEGMENT`` | (kind:1, length:1, the record's
key in its column family) per event, at positions first, first + 1, ... (a row of an earlier
version, kind | key, holds one event). A shown message's position is also kept in its
``seen_msg`` value, after its messages key (``seen_position``; delivery state): so a
message costs the log no row of its own — a batch of a thousand messages writes one
events row, not two thousand rows (``events`` and, before, ``event_at``). Positions are
allocated and the batch written under one lock: positions become readable in order, so a
reader that has read up to position P has missed nothing at or below it.

The log is local, like the chat lists: another node numbers its own log. Clients page
it by position (``node/api/events.py`` wraps a position in a token); listeners are told
the newest position after each write (``add_listener``), from the writing thread.
"""

from __future__ import annotations

import struct
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import IntEnum
from itertools import repeat
from operator import concat
from typing import NamedTuple

from rocksdict import WriteBatch

from store.keys import MESSAGES_KEY_LEN
from store.rocks import Rocks

POSITION_LEN = 8
SEGMENT = b"\x00"  # an events row of this version: its events behind this byte (no kind is 0)


class EventKind(IntEnum):
    MESSAGE = 1  # a shown message (ref: its messages key)
    DELETE = 2  # a DELETE (ref: its deletes key)
    MEMBER = 3  # a member op (ref: its member_ops key)
    HIDDEN = 4  # a message shown before, hidden now (ref: its messages key)


# (kind, the record's key), and for a shown message (MESSAGE, its messages key, its id):
# its seen_msg row, written with the event, keeps the position
Event = tuple[EventKind, bytes] | tuple[EventKind, bytes, bytes]
_KINDS = {kind.value: kind for kind in EventKind}
# an event's head in a segment: kind, the key's length (every key is shorter than 256)
# (indexed by the kind's value: an IntEnum hashes through Python, indexes through C)
_HEADS = tuple(tuple(bytes((kind, n)) for n in range(256)) for kind in range(max(EventKind) + 1))
_SHOWN_HEAD = _HEADS[EventKind.MESSAGE][MESSAGES_KEY_LEN]
_ONE_SHOWN = tuple(SEGMENT + head for head in _HEADS[EventKind.MESSAGE])  # a row of one
_PACK_POSITION = struct.Struct(">Q").pack  # = position.to_bytes(POSITION_LEN, "big")
_SINK: deque[object] = deque(maxlen=0)
_consume = _SINK.extend  # runs an iterator to its end, keeping nothing


class ShownRun(NamedTuple):
    """Shown messages of one write, in order: their messages keys (each ``MESSAGES_KEY_LEN``
    long) and ids — the events ``(MESSAGE, key, id)``, as two lists (``EventLog.write_shown``)."""

    keys: list[bytes]
    ids: list[bytes]


def seen_value(messages_key: bytes, position: int) -> bytes:
    """A shown message's seen_msg value: its messages key, then its event position."""
    return messages_key + position.to_bytes(POSITION_LEN, "big")


def seen_position(value: bytes) -> int | None:
    """The event position in a seen_msg value (None: none there, ``seen_value``)."""
    if len(value) != MESSAGES_KEY_LEN + POSITION_LEN:
        return None
    return int.from_bytes(value[MESSAGES_KEY_LEN:], "big")


def read_segment(first: int, value: bytes) -> list[tuple[int, EventKind, bytes]]:
    """The events of one events row at position ``first``: (position, kind, key).

    Our own rows; a row that does not parse ends where it stops parsing (never raises).
    """
    if value[:1] != SEGMENT:  # a row of an earlier version: one event
        kind = _KINDS.get(value[0]) if value else None
        return [] if kind is None else [(first, kind, value[1:])]
    out: list[tuple[int, EventKind, bytes]] = []
    at, end = 1, len(value)
    while at + 2 <= end:
        kind = _KINDS.get(value[at])
        stop = at + 2 + value[at + 1]
        if kind is None or stop > end:
            break
        out.append((first + len(out), kind, value[at + 2 : stop]))
        at = stop
    return out


class EventLog:
    """The log and its position: every row store whose writes make something readable writes
    through ``write`` (given this log when it is built); the others write to ``Rocks``."""

    def __init__(self, rocks: Rocks) -> None:
        self._rocks = rocks
        self._handle = rocks.handle
        self._event_lock = threading.Lock()
        self._listeners: list[Callable[[int], None]] = []
        # the events of a one_write block, as the stores gave them
        self._deferred: list[Sequence[Event] | ShownRun] | None = None
        last = next(rocks.iter_range("events", b"", None, reverse=True), None)
        self._last_position = 0
        if last is not None:
            first = int.from_bytes(last[0], "big")
            self._last_position = first + max(len(read_segment(first, last[1])), 1) - 1

    @property
    def last_position(self) -> int:
        """The newest event's position (0: none yet)."""
        return self._last_position

    def add_listener(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(newest position)`` after every write that logged events (from the
        writing thread: it must hand over, not block)."""
        self._listeners.append(listener)

    @contextmanager
    def one_write(self) -> Iterator[None]:
        """Every store's writes in the block, and their events, go into one WriteBatch, written
        when the block ends (nothing, if it raises). Reads in the block see what was written
        before it: a store's caches (metas, histories) carry the block's own changes."""
        batch = self._rocks.share_batch()
        self._deferred = []
        try:
            yield
        finally:
            self._rocks.unshare_batch()
            deferred, self._deferred = self._deferred, None
        self._write_chunks(batch, deferred)

    def write(self, batch: WriteBatch, events: Sequence[Event] = ()) -> None:
        """Write ``batch``, with ``events`` logged in it after the last position."""
        if self._deferred is not None and self._rocks.is_shared(batch):
            if events:  # written with the block's batch (one_write)
                self._deferred.append(tuple(events))
            return
        self._write_chunks(batch, [events] if events else [])

    def write_shown(self, batch: WriteBatch, run: ShownRun) -> None:
        """``write(batch, [(MESSAGE, key, id) for key, id in zip(*run)])`` for a run of shown
        messages whose keys are all messages keys (``MESSAGES_KEY_LEN``): their seen_msg rows
        and events built a run at a time (``put_messages``' fast path), not an event at a time."""
        if self._deferred is not None and self._rocks.is_shared(batch):
            if run.keys:
                self._deferred.append(run)
            return
        self._write_chunks(batch, [run] if run.keys else [])

    def write_one_shown(self, batch: WriteBatch, key: bytes, msg_id: bytes) -> None:
        """``write(batch, [(MESSAGE, key, msg_id)])``: one shown message (``put_message``),
        without the lists and the loop of a write of many."""
        if self._deferred is not None and self._rocks.is_shared(batch):
            self._deferred.append(((EventKind.MESSAGE, key, msg_id),))
            return
        handle = self._handle
        with self._event_lock:
            position = self._last_position + 1
            at = _PACK_POSITION(position)
            batch.put(msg_id, key + at, handle["seen_msg"])
            batch.put(at, _ONE_SHOWN[len(key)] + key, handle["events"])
            self._rocks.write(batch)
            self._last_position = position
        for listener in self._listeners:
            listener(position)

    def _write_chunks(self, batch: WriteBatch, chunks: list[Sequence[Event] | ShownRun]) -> None:
        """Write ``batch`` with the events of ``chunks`` (each events or a run of shown
        messages) logged in it, in order, after the last position: one events row."""
        if not chunks:
            self._rocks.write(batch)
            return
        with self._event_lock:
            first = position = self._last_position + 1
            parts = [SEGMENT]
            for chunk in chunks:
                if isinstance(chunk, ShownRun):
                    position = self._log_run(batch, position, chunk, parts)
                else:
                    position = self._log_events(batch, position, chunk, parts)
            batch.put(first.to_bytes(POSITION_LEN, "big"), b"".join(parts), self._handle["events"])
            self._rocks.write(batch)
            self._last_position = position = position - 1
        for listener in self._listeners:
            listener(position)

    def _log_events(
        self, batch: WriteBatch, position: int, events: Sequence[Event], parts: list[bytes]
    ) -> int:
        """Log ``events`` from ``position`` (their heads and keys into ``parts``, a shown
        message's seen_msg row into ``batch``); the position after them."""
        seen_cf, heads, put = self._handle["seen_msg"], _HEADS, batch.put
        for at, event in enumerate(events, position):
            ref = event[1]
            parts += (heads[event[0]][len(ref)], ref)
            if len(event) == 3:  # a shown message: its id -> its key and position
                put(event[2], ref + _PACK_POSITION(at), seen_cf)
        return position + len(events)

    def _log_run(self, batch: WriteBatch, position: int, run: ShownRun, parts: list[bytes]) -> int:
        """``_log_events`` of a run of shown messages: every call made by ``map`` (in C)."""
        keys, ids = run
        after = position + len(keys)
        seen = map(concat, keys, map(_PACK_POSITION, range(position, after)))
        _consume(map(batch.put, ids, seen, repeat(self._handle["seen_msg"])))
        parts += (_SHOWN_HEAD, _SHOWN_HEAD.join(keys))
        return after

    def event_position(self, seen: bytes) -> int | None:
        """Where the message whose seen_msg value is ``seen`` entered the log as shown (None:
        not as shown). A message stored by an earlier version has its position in
        ``event_at`` (by its messages key) instead."""
        position = seen_position(seen)
        if position is not None:
            return position
        at = self._rocks.get("event_at", seen[:MESSAGES_KEY_LEN])
        return None if at is None else int.from_bytes(at, "big")

    def events_after(self, position: int, limit: int) -> Iterator[tuple[int, EventKind, bytes]]:
        """Up to ``limit`` events after ``position``: (position, kind, the record's key)."""
        start = position + 1
        if limit <= 0:
            return
        n = 0
        for first, value in self._rows_from(start):
            for event in read_segment(int.from_bytes(first, "big"), value):
                if event[0] < start:
                    continue
                yield event
                n += 1
                if n == limit:
                    return

    def _rows_from(self, start: int) -> Iterator[tuple[bytes, bytes]]:
        """The events rows from the one holding position ``start`` on (a row holds the
        positions from its key to the next row's key)."""
        at = start.to_bytes(POSITION_LEN, "big")
        before = next(self._rocks.iter_range("events", b"", at + b"\x00", reverse=True), None)
        if before is not None and before[0] < at:
            yield before  # (the next row's key is past ``at``)
        yield from self._rocks.iter_range("events", at, None)
