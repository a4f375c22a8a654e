"""This node's event log: what became readable here, in the order it was committed.

``events[position:8]`` -> kind (1 byte) | the record's key in its column family, and for a
shown message ``event_at[its messages key]`` -> its position (delivery state). Each
write that makes something readable — a shown message stored or shown after all, a
delete, a member op, a message hidden after it was shown — appends its events in the
same WriteBatch, so an event is on disk exactly when its record is. Positions are
allocated and the batch written under one lock: positions become readable in order, so
a reader that has read up to position P has missed nothing at or below it.

The log is local, like the chat lists: another node numbers its own log. Clients page
it by position (``node/api/events.py`` wraps a position in a token); listeners are told
the newest position after each write (``add_listener``), from the writing thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import IntEnum

from rocksdict import WriteBatch

from store.rocks import Rocks

POSITION_LEN = 8


class EventKind(IntEnum):
    MESSAGE = 1  # a shown message (ref: its messages key)
    DELETE = 2  # a DELETE (ref: its deletes key)
    MEMBER = 3  # a member op (ref: its member_ops key)
    HIDDEN = 4  # a message shown before, hidden now (ref: its messages key)


Event = tuple[EventKind, bytes]  # (kind, the record's key)
_KINDS = {kind.value: kind for kind in EventKind}


class EventLog:
    """The log and its position: every row store whose writes make something readable writes
    through ``write`` (given this log when it is built); the others write to ``Rocks``."""

    def __init__(self, rocks: Rocks) -> None:
        self._rocks = rocks
        self._handle = rocks.handle
        self._event_lock = threading.Lock()
        self._listeners: list[Callable[[int], None]] = []
        self._deferred: list[Event] | None = None  # the events of a one_write block
        last = next(rocks.iter_range("events", b"", None, reverse=True), None)
        self._last_position = 0 if last is None else int.from_bytes(last[0], "big")

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
        self.write(batch, deferred)

    def write(self, batch: WriteBatch, events: Sequence[Event] = ()) -> None:
        """Write ``batch``, with ``events`` logged in it after the last position."""
        if self._deferred is not None and self._rocks.is_shared(batch):
            self._deferred.extend(events)  # written with the block's batch (one_write)
            return
        if not events:
            self._rocks.write(batch)
            return
        events_cf, event_at = self._handle["events"], self._handle["event_at"]
        with self._event_lock:
            position = self._last_position
            for kind, ref in events:
                position += 1
                at = position.to_bytes(POSITION_LEN, "big")
                batch.put(at, bytes([kind]) + ref, events_cf)
                if kind is EventKind.MESSAGE:
                    batch.put(ref, at, event_at)  # where a shown message entered the log
            self._rocks.write(batch)
            self._last_position = position
        for listener in self._listeners:
            listener(position)

    def event_position(self, messages_key: bytes) -> int | None:
        """Where the message entered the log as shown (None: not as shown, or not here)."""
        at = self._rocks.get("event_at", messages_key)
        return None if at is None else int.from_bytes(at, "big")

    def events_after(self, position: int, limit: int) -> Iterator[tuple[int, EventKind, bytes]]:
        """Up to ``limit`` events after ``position``: (position, kind, the record's key)."""
        start = (position + 1).to_bytes(POSITION_LEN, "big")
        for n, (key, value) in enumerate(self._rocks.iter_range("events", start, None)):
            if n == limit:
                return
            yield int.from_bytes(key, "big"), _KINDS[value[0]], value[1:]
