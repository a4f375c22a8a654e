"""A first-in first-out queue between trio tasks, bounded by the weight of what waits in it.

The node's queues carry lists of decoded ops: an API call or a gossip message is up to
1,024 of them, ~0.9 KB each in Python objects. Bounded in lists, a queue of 256 held up to
~230 MB during a bulk ingest (the gossip publisher's, while py-libp2p's outbound queues were
deep), and Python's allocator kept those arenas after the ops left: the node's RSS stayed
up. Bounded in ops, what waits stays a few MB.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

import trio

T = TypeVar("T")


class WeightedQueue(Generic[T]):
    """Items wait in order; a ``put`` waits while the total weight would exceed ``capacity``
    (an empty queue takes an item of any weight, so none waits forever). ``close()`` ends
    it: putting raises ``trio.ClosedResourceError`` (also for putters waiting), getting
    drains what is left, then raises ``trio.EndOfChannel``."""

    def __init__(self, capacity: int, weight: Callable[[T], int]) -> None:
        self.capacity = capacity
        self._weigh = weight
        self._items: deque[tuple[T, int]] = deque()
        self.weight = 0  # of the items waiting
        self._closed = False
        self._putters = trio.lowlevel.ParkingLot()
        self._getters = trio.lowlevel.ParkingLot()

    def __len__(self) -> int:
        return len(self._items)

    async def put(self, item: T) -> None:
        weight = self._weigh(item)
        while not self._fits(weight):
            await self._putters.park()
        self._append(item, weight)

    def put_nowait(self, item: T) -> None:
        """Raises ``trio.WouldBlock`` when the item does not fit now."""
        weight = self._weigh(item)
        if not self._fits(weight):
            raise trio.WouldBlock
        self._append(item, weight)

    async def get(self) -> T:
        while not self._items:
            if self._closed:
                raise trio.EndOfChannel
            await self._getters.park()
        return self._pop()

    def get_nowait(self) -> T:
        """Raises ``trio.WouldBlock`` when empty, ``trio.EndOfChannel`` when empty and closed."""
        if not self._items:
            raise trio.EndOfChannel if self._closed else trio.WouldBlock
        return self._pop()

    def close(self) -> None:
        self._closed = True
        self._putters.unpark_all()
        self._getters.unpark_all()

    def _fits(self, weight: int) -> bool:
        if self._closed:
            return True  # _append raises
        return not self._items or self.weight + weight <= self.capacity

    def _append(self, item: T, weight: int) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the queue is closed")
        self._items.append((item, weight))
        self.weight += weight
        self._getters.unpark(count=1)

    def _pop(self) -> T:
        item, weight = self._items.popleft()
        self.weight -= weight
        self._putters.unpark_all()  # each checks again whether it fits now
        return item
