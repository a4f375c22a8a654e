"""The DB writer: the one task that writes RocksDB and the Merkle trees.

    HTTP, gossip ──submit()──▶ ┐
    sync records, GC steps,    ├─▶ [queue, bounded in ops] ──▶ writer task ──to_thread──▶ the store
    acks, erasure ──call()───▶ ┘

Every write of the node goes through this queue: the ops of clients and gossip
(``submit``: batched, ``DbReplica.apply_ops``), and every other change as a job
(``call``): the records a sync session received (the session only returns them),
each step of the retention GC, the devices' acknowledgements, erasure compaction,
the chat lists that wait. The writer takes what waits (up to ``batch_max`` ops),
runs it in order in one worker thread, and only then acknowledges. There is no lock:
nothing else writes, so the trees always match what is on disk once a job is done;
readers (sync sessions, the HTTP API) read RocksDB concurrently, and a session that
reads a tree mid-write at worst finds a difference the next pass settles.

A full queue makes ``submit`` and ``call`` wait (backpressure) and ``submit_nowait``
raise ``trio.WouldBlock``. The bound counts ops, not requests (``node.weighted_queue``):
a request holds up to 1,024 decoded ops, a job weighs what it says. With ``durable``
the DB syncs its WAL on every write, so an acknowledged op survives kill -9.

A request is a list of ops. The ops of all the requests in a batch go through
``DbReplica.apply_ops`` together — planned once (``store.plan``), one WriteBatch per
domain, the Merkle trees updated in the same step; the chat lists (CF user_inbox) of the
chats that got new messages follow once enough wait, or when the writer has been idle
for ``CHAT_LISTS_IDLE_S``. The answer: per op, whether it changed the store, and whether
it is a message the chat's member ops do not admit yet (held in the replica's waiting room).

A request whose write fails gets the error (``StorageFull`` and ``InvalidInput`` as
raised; anything else, from RocksDB or a bug, as ``WriteFailed``); the other requests of
its batch are written one by one and are not affected. A job that fails raises in its
caller, the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import trio

from node.limits import check_free_disk
from node.metrics import Metrics
from node.plants import apply_dropping
from node.weighted_queue import WeightedQueue
from store.errors import ChatsyncError
from store.ops import Op
from store.records import MsgV1
from sync.protocol import Received
from sync.replica import DbReplica

if TYPE_CHECKING:
    from trio_typing import TaskStatus

log = logging.getLogger(__name__)

CHAT_LISTS_IDLE_S = 0.25  # this long without a write request: refresh the waiting chat lists


class WriteFailed(ChatsyncError):
    """A write failed for a reason that is neither the input's nor a full disk (RocksDB, a bug)."""


@dataclass
class WriteRequest:
    ops: list[Op]
    done: trio.Event = field(default_factory=trio.Event)
    new: list[bool] = field(default_factory=list)  # per op: did it change the store?
    # per op: a message held back until a member op admits it (store.waiting)
    waiting: list[bool] = field(default_factory=list)
    error: ChatsyncError | None = None

    @property
    def size(self) -> int:
        return len(self.ops)


R = TypeVar("R")


@dataclass
class WriteJob(Generic[R]):
    """A change other than ops (``DbWriter.call``): run in the writer's thread, in turn."""

    run: Callable[[], R]
    size: int = 1
    done: trio.Event = field(default_factory=trio.Event)
    result: R | None = None
    error: BaseException | None = None


Work = WriteRequest | WriteJob[Any]


@dataclass
class WriterStatistics:
    queued: int  # ops waiting
    capacity: int  # ops that may wait
    batches: int
    ops_applied: int
    ops_new: int
    jobs: int  # changes other than ops: sync records, GC steps, acks, erasure


class DbWriter:
    def __init__(
        self,
        replica: DbReplica,
        metrics: Metrics,
        *,
        queue_ops: int = 16384,
        batch_max: int = 2048,
        min_free_disk_mb: int = 0,
        drop_every: int = 0,
    ) -> None:
        """``drop_every``: CHAOS PLANT (node/plants.py), 0 = off: drop one op in that many."""
        self.replica = replica
        self.db = replica.db
        self.metrics = metrics
        self.batch_max = batch_max
        self.min_free_disk_mb = min_free_disk_mb
        self.drop_every = drop_every
        self._queue = WeightedQueue[Work](queue_ops, weight=lambda w: w.size)
        self._batches = self._ops_applied = self._ops_new = self._jobs = 0

    # --- submitting ---

    async def submit(self, ops: list[Op]) -> list[bool]:
        """Queue ``ops`` (waiting while the queue is full) and wait until they are written."""
        return await self.wait(await self.enqueue(ops))

    async def enqueue(self, ops: list[Op]) -> WriteRequest:
        """Queue ``ops`` (waiting only while the queue is full); ``wait()`` on the result."""
        request = WriteRequest(ops)
        await self._queue.put(request)
        return request

    def submit_nowait(self, ops: list[Op]) -> WriteRequest:
        """Queue ``ops`` or raise trio.WouldBlock at once; ``wait()`` on the result for the ack."""
        request = WriteRequest(ops)
        self._queue.put_nowait(request)
        return request

    async def call(self, run: Callable[[], R], *, size: int = 1) -> R:
        """Queue a change for the writer's thread (waiting while the queue is full), wait
        until it ran, and return its result (or raise its error). ``size``: its weight in
        the queue's bound, in ops (a job carrying records: how many)."""
        job = WriteJob(run, max(1, min(size, self._queue.capacity)))
        await self._queue.put(job)
        await job.done.wait()
        if job.error is not None:
            raise job.error
        return cast(R, job.result)  # set by the writer: run() returned it

    async def store_received(self, received: Received) -> int:
        """A sync session's records, written in their order (member ops first); how many
        changed the store (``node.syncer.StoreReceived``)."""
        size = sum(len(records) for _, records in received.records)
        return await self.call(partial(self._apply_received, received), size=size)

    def _apply_received(self, received: Received) -> int:
        check_free_disk(self.db.config.path, self.min_free_disk_mb)
        return received.write_to(self.replica)

    async def settle_chat_lists(self) -> None:
        """The chat-list moves that wait, written now (before a list is read: store.inbox)."""
        if self.db.chat_lists_stale():
            await self.call(self.db.flush_chat_lists)

    @staticmethod
    async def wait(request: WriteRequest) -> list[bool]:
        await request.done.wait()
        if request.error is not None:
            raise request.error
        return request.new

    def statistics(self) -> WriterStatistics:
        return WriterStatistics(
            self._queue.weight,
            self._queue.capacity,
            self._batches,
            self._ops_applied,
            self._ops_new,
            self._jobs,
        )

    def close(self) -> None:
        """No more submissions; ``run`` drains what is queued and returns."""
        self._queue.close()

    # --- the writer task ---

    async def run(self, *, task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                with trio.move_on_after(CHAT_LISTS_IDLE_S) as idle:
                    try:
                        first = await self._queue.get()
                    except trio.EndOfChannel:
                        break
                if idle.cancelled_caught:
                    await self._flush_chat_lists()
                    continue
                for run in _runs(self._batch_after(first)):
                    if isinstance(run, WriteJob):
                        await self._run_job(run)
                    else:
                        await self._apply_each_or_all(run)
        finally:
            self._queue.close()  # submitters learn that nobody writes any more
        await self._flush_chat_lists()

    async def _flush_chat_lists(self) -> None:
        """Nothing to write: the chat-list moves that wait are written now (store.inbox)."""
        if not self.db.chat_lists_stale():
            return
        try:
            await trio.to_thread.run_sync(self.db.flush_chat_lists)
        except Exception as exc:  # they still wait: the next read or idle moment retries
            log.warning("chat-list refresh failed: %s: %s", type(exc).__name__, exc)
            self.metrics.inc("write_errors", help="write batches that failed")

    def _batch_after(self, first: Work) -> list[Work]:
        """``first`` and the work waiting behind it, up to ``batch_max`` ops."""
        batch = [first]
        size = first.size
        while size < self.batch_max:
            try:
                request = self._queue.get_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            batch.append(request)
            size += request.size
        return batch

    async def _run_job(self, job: WriteJob[Any]) -> None:
        try:
            job.result = await trio.to_thread.run_sync(job.run)
        except Exception as exc:  # the caller gets it; the one writer goes on
            job.error = exc
        self._jobs += 1
        job.done.set()

    async def _apply_each_or_all(self, requests: Sequence[WriteRequest]) -> None:
        """Write ``requests`` in a worker thread; if that fails, each request alone, so that
        one bad request does not fail the others."""
        try:
            await trio.to_thread.run_sync(self._apply_writes, requests)
        except Exception as exc:  # the one writer outlives any failed request
            if len(requests) > 1:
                for request in requests:
                    await self._apply_each_or_all([request])
                return
            log.warning("write failed: %s: %s", type(exc).__name__, exc)
            self.metrics.inc("write_errors", help="write batches that failed")
            requests[0].error = exc if isinstance(exc, ChatsyncError) else WriteFailed(repr(exc))
        for request in requests:
            request.done.set()

    def _apply_writes(self, requests: Sequence[WriteRequest]) -> None:
        new = self.apply_ops([op for request in requests for op in request.ops])
        offset = 0
        is_waiting = self.replica.is_waiting
        for request in requests:
            request.new = new[offset : offset + len(request.ops)]
            request.waiting = [isinstance(op, MsgV1) and is_waiting(op) for op in request.ops]
            offset += len(request.ops)
        self._batches += 1
        self._ops_applied += len(new)
        self._ops_new += sum(new)

    def apply_ops(self, ops: list[Op]) -> list[bool]:
        """Apply validated ops (the writer's thread); per op, whether it changed anything."""
        check_free_disk(self.db.config.path, self.min_free_disk_mb)  # refuse, never half-write
        if self.drop_every:  # CHAOS PLANT (node/plants.py): off by default
            return apply_dropping(
                ops, self.drop_every, lambda kept: self.replica.apply_ops(kept).new
            )
        return self.replica.apply_ops(ops).new


def _runs(batch: list[Work]) -> list[WriteJob[Any] | list[WriteRequest]]:
    """The batch in order: each job alone, the requests between jobs together."""
    runs: list[WriteJob[Any] | list[WriteRequest]] = []
    for work in batch:
        if isinstance(work, WriteJob):
            runs.append(work)
        elif runs and isinstance(runs[-1], list):
            runs[-1].append(work)
        else:
            runs.append([work])
    return runs
