"""The newest arrivals of ops, ``(packed HLC, arrival ms)``, for GET /debug/latency?arrivals=1.

Two rings of machine words, 16 bytes an arrival: the deque of tuples they replace took about
130, 26 MB for the two full logs of a node (gossip's and sync's) — a tenth of the 300 MB a
node holding a million messages may use (``chatsync bench gossip``).
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Iterable, Iterator

ARRIVAL_LOG = 100_000  # arrivals kept per log: a benchmark's run at 2,000 ops/s for 20 s fits


class ArrivalLog:
    """The newest ``size`` arrivals, oldest first. Extended from the trio thread (gossip) or
    the writing thread (sync), read from an API worker: a lock keeps each extend whole."""

    def __init__(self, size: int = ARRIVAL_LOG) -> None:
        if size < 1:
            raise ValueError(f"an arrival log holds at least one arrival, not {size}")
        self._stamps = array("Q", [0]) * size
        self._times = array("q", [0]) * size
        self._next = 0  # where the next arrival goes
        self._count = 0
        self._lock = threading.Lock()

    def extend(self, arrivals: Iterable[tuple[int, int]]) -> None:
        size = len(self._stamps)
        with self._lock:
            for stamp, at_ms in arrivals:
                self._stamps[self._next] = stamp
                self._times[self._next] = at_ms
                self._next = (self._next + 1) % size
                self._count = min(self._count + 1, size)

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[tuple[int, int]]:
        with self._lock:
            size, count = len(self._stamps), self._count
            first = (self._next - count) % size
            order = [(first + i) % size for i in range(count)]
            return iter([(self._stamps[i], self._times[i]) for i in order])
