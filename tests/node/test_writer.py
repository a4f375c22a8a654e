"""The DB writer: acks after the write, batching, backpressure, drain, trees in step with RocksDB."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from node.metrics import Metrics
from node.writer import DbWriter, WriteFailed
from sync.frames import Domain
from sync.replica import DbReplica

from node_support import JOIN, USERS, add, identity, messages, small_db


@pytest.fixture
def parts(tmp_path: Path):  # type: ignore[no-untyped-def]
    db = small_db(tmp_path / "db")
    replica = DbReplica(db)
    assert replica.apply_ops([JOIN]).new == [True]  # admits the author of ``messages()``
    yield db, replica
    db.close()


def make_writer(parts, **kw) -> DbWriter:  # type: ignore[no-untyped-def]
    _, replica = parts
    return DbWriter(replica, Metrics(), **kw)


async def test_ops_are_written_acknowledged_and_reflected_in_the_trees(parts) -> None:  # type: ignore[no-untyped-def]
    db, replica = parts
    writer = make_writer(parts)
    msgs = messages(0, 20)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        new = await writer.submit([*msgs, add(1, 5), identity(1, 7)])
        assert new == [True] * 22
        assert not replica.waiting  # every message admitted: none held back
        again = await writer.submit([msgs[0], add(1, 5), identity(1, 7)])
        assert again == [False, False, False]  # duplicates change nothing
        writer.close()
    assert db.is_member(msgs[0].chat_id, USERS[1])
    assert db.get_identity(USERS[1]) is not None
    rebuilt = DbReplica(db).trees
    for domain in Domain:
        assert rebuilt[domain] == replica.trees[domain]
    assert replica.trees[Domain.MESSAGES].count == 20


async def test_waiting_requests_are_merged_into_one_batch(parts) -> None:  # type: ignore[no-untyped-def]
    writer = make_writer(parts, batch_max=10_000)
    requests = [writer.submit_nowait(messages(i * 10, 10)) for i in range(8)]
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for request in requests:
            assert await writer.wait(request) == [True] * 10
        writer.close()
    stats = writer.statistics()
    assert stats.batches == 1 and stats.ops_applied == 80 and stats.ops_new == 80


async def test_a_full_queue_pushes_back(parts, autojump_clock: trio.testing.MockClock) -> None:  # type: ignore[no-untyped-def]
    writer = make_writer(parts, queue_ops=2)
    writer.submit_nowait(messages(0, 1))
    writer.submit_nowait(messages(1, 1))
    with pytest.raises(trio.WouldBlock):
        writer.submit_nowait(messages(2, 1))
    finished = trio.Event()

    async def blocked_submitter() -> None:
        await writer.submit(messages(3, 1))
        finished.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(blocked_submitter)
        await trio.sleep(5)
        assert not finished.is_set()  # waits while nobody drains the queue
        assert writer.statistics().queued == 2
        await nursery.start(writer.run)
        # No deadline here: the autojump clock would jump while the write runs in its thread.
        await finished.wait()
        writer.close()


async def test_close_drains_what_was_accepted(parts) -> None:  # type: ignore[no-untyped-def]
    db, _ = parts
    writer = make_writer(parts)
    requests = [writer.submit_nowait(messages(i, 1)) for i in range(5)]
    writer.close()
    await writer.run()  # returns once the queue is empty
    assert all(r.done.is_set() and r.new == [True] for r in requests)
    assert sum(1 for _ in db.iter_msg_ids()) == 5


async def test_a_failing_request_fails_alone(parts) -> None:  # type: ignore[no-untyped-def]
    writer = make_writer(parts)
    too_big = messages(0, 1)[0]
    object.__setattr__(too_big, "payload", b"x" * (300 * 1024))  # over the store's 256 KiB limit
    good = writer.submit_nowait(messages(1, 3))
    bad = writer.submit_nowait([too_big])
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        assert await writer.wait(good) == [True] * 3
        with pytest.raises(Exception, match="over the limit"):
            await writer.wait(bad)
        writer.close()


async def test_a_write_that_fails_unexpectedly_is_a_write_failed(parts) -> None:  # type: ignore[no-untyped-def]
    """What RocksDB (or a bug) raises reaches the submitter as our WriteFailed, and the
    writer goes on with the next request."""
    writer = make_writer(parts)
    real_apply = writer.replica.apply_ops

    def broken(ops):  # type: ignore[no-untyped-def]
        if len(ops) == 1:
            raise RuntimeError("the disk said no")
        return real_apply(ops)

    writer.replica.apply_ops = broken  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        with pytest.raises(WriteFailed, match="the disk said no"):
            await writer.submit(messages(0, 1))
        assert await writer.submit(messages(1, 2)) == [True, True]
        writer.close()


async def test_the_queue_is_bounded_in_ops(parts) -> None:  # type: ignore[no-untyped-def]
    """A request holds up to 1,024 decoded ops: the bound counts them, not requests."""
    writer = make_writer(parts, queue_ops=100)
    big = writer.submit_nowait(messages(0, 150))  # an empty queue takes any size
    with pytest.raises(trio.WouldBlock):
        writer.submit_nowait(messages(150, 1))
    assert writer.statistics().queued == 150
    blocked = trio.Event()

    async def waiting_submitter() -> None:
        request = await writer.enqueue(messages(151, 60))
        blocked.set()
        assert await writer.wait(request) == [True] * 60

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiting_submitter)
        await trio.sleep(0.05)
        assert not blocked.is_set()
        await nursery.start(writer.run)  # takes the 150: room for the 60
        await blocked.wait()
        assert await writer.wait(big) == [True] * 150
        writer.close()
    assert writer.statistics().queued == 0


async def test_a_submitter_waiting_for_room_learns_of_close(parts) -> None:  # type: ignore[no-untyped-def]
    writer = make_writer(parts, queue_ops=1)
    writer.submit_nowait(messages(0, 1))

    async def waiting_submitter() -> None:
        with pytest.raises(trio.ClosedResourceError):
            await writer.enqueue(messages(1, 1))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiting_submitter)
        await trio.sleep(0.05)
        writer.close()
    await writer.run()  # drains the one accepted


async def test_jobs_run_in_turn_with_the_ops_and_a_failing_one_fails_its_caller_only(parts) -> None:  # type: ignore[no-untyped-def]
    """Every write is the writer's: a job queued between two requests sees the first written
    and not the second; a job that raises raises in its caller, and the writer goes on."""
    db, _ = parts
    writer = make_writer(parts, batch_max=10_000)
    first = writer.submit_nowait(messages(0, 5))
    seen: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: writer.call(lambda: seen.append(len(list(db.iter_msg_ids())))))
        await trio.testing.wait_all_tasks_blocked()
        second = writer.submit_nowait(messages(5, 5))
        await nursery.start(writer.run)
        assert await writer.wait(first) == [True] * 5

        def broken() -> None:
            raise WriteFailed("a job that fails")

        with pytest.raises(WriteFailed):
            await writer.call(broken)
        assert await writer.wait(second) == [True] * 5
        writer.close()
    assert seen == [5]  # between the two requests
    assert writer.statistics().jobs == 2


async def test_a_sync_sessions_records_are_written_by_the_writer(parts) -> None:  # type: ignore[no-untyped-def]
    from sync.protocol import Received

    db, replica = parts
    writer = make_writer(parts)
    msgs = messages(0, 4)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        received = Received(((Domain.MEMBERS, [add(1, 5)]), (Domain.MESSAGES, list(msgs))))
        assert await writer.store_received(received) == 5
        assert await writer.store_received(received) == 0  # held: nothing changes
        writer.close()
    assert DbReplica(db).trees[Domain.MESSAGES] == replica.trees[Domain.MESSAGES]
    assert writer.statistics().jobs == 2
