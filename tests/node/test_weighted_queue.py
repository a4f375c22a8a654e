"""node/weighted_queue.py: order, the bound in weight, close."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from node.weighted_queue import WeightedQueue


def queue(capacity: int = 10) -> WeightedQueue[list[int]]:
    return WeightedQueue[list[int]](capacity, weight=len)


async def test_items_leave_in_order_and_the_weight_follows() -> None:
    q = queue()
    for item in ([1, 2], [3], [4, 5, 6]):
        q.put_nowait(item)
    assert (len(q), q.weight) == (3, 6)
    assert [q.get_nowait(), await q.get(), q.get_nowait()] == [[1, 2], [3], [4, 5, 6]]
    assert (len(q), q.weight) == (0, 0)
    with pytest.raises(trio.WouldBlock):
        q.get_nowait()


async def test_the_bound_is_the_weight_and_an_empty_queue_takes_any_item() -> None:
    q = queue(capacity=10)
    q.put_nowait(list(range(25)))  # heavier than the capacity: taken, the queue was empty
    with pytest.raises(trio.WouldBlock):
        q.put_nowait([0])
    assert q.get_nowait() == list(range(25))
    q.put_nowait(list(range(8)))
    q.put_nowait([1, 2])  # 10: exactly full
    with pytest.raises(trio.WouldBlock):
        q.put_nowait([3])


async def test_a_putter_waits_until_its_item_fits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    q = queue(capacity=10)
    q.put_nowait(list(range(6)))
    q.put_nowait(list(range(4)))
    done: list[str] = []

    async def put_five() -> None:
        await q.put(list(range(5)))
        done.append("put")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(put_five)
        await trio.sleep(1)
        assert done == [] and q.weight == 10
        q.get_nowait()  # 6 leave: 4 + 5 fit
        await trio.sleep(1)
        assert done == ["put"] and q.weight == 9


async def test_a_getter_waits_for_an_item(autojump_clock: trio.testing.MockClock) -> None:
    q = queue()
    got: list[list[int]] = []

    async def getter() -> None:
        got.append(await q.get())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(getter)
        await trio.sleep(1)
        assert got == []
        q.put_nowait([7])
    assert got == [[7]]


async def test_close_fails_putters_and_getters_drain_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    q = queue(capacity=1)
    q.put_nowait([1])
    failed: list[str] = []

    async def waiting_putter() -> None:
        with pytest.raises(trio.ClosedResourceError):
            await q.put([2])
        failed.append("putter")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiting_putter)
        await trio.sleep(1)
        q.close()
    assert failed == ["putter"]
    with pytest.raises(trio.ClosedResourceError):
        q.put_nowait([3])
    assert await q.get() == [1]  # what was accepted still comes out
    with pytest.raises(trio.EndOfChannel):
        await q.get()
    with pytest.raises(trio.EndOfChannel):
        q.get_nowait()
