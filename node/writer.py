"""The DB writer: every write of the node's clients and gossip goes through one task.

    handlers ──submit()──▶ [queue, bounded in ops] ──▶ writer task ──to_thread──▶ DbReplica.apply_ops

One task owns writes. It takes every request waiting in the queue (up to ``batch_max``
ops), applies them in a worker thread under ``db_lock`` and only then acknowledges. A full
queue makes ``submit`` wait (backpressure) and ``submit_nowait`` raise ``trio.WouldBlock``.
The bound counts ops, not requests (``node.weighted_queue``): a request holds up to 1,024
decoded ops. With ``durable`` the DB syncs its WAL on
every write, so an acknowledged op survives kill -9.

A request is a list of ops. The ops of all the requests in a batch go through
``DbReplica.apply_ops`` together — one WriteBatch per domain, the Merkle trees updated in
the same step; the chat lists (CF user_inbox) of the chats that got new messages follow
once enough wait, or when the writer has been idle for ``CHAT_LISTS_IDLE_S``. The
answer: per op, whether it changed the store, and whether it is a message the chat's member
ops do not admit yet (held in the replica's waiting room).

A request whose write fails gets the error (``StorageFull`` and ``InvalidInput`` as
raised; anything else, from RocksDB or a bug, as ``WriteFailed``); the other requests of
its batch are written one by one and are not affected.

Sync sessions and the retention GC write too (records they receive, aged messages).
They take the same ``db_lock`` around each step, so there is one writer at a time and
the trees always match what is on disk.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from node.limits import check_free_disk
from node.metrics import Metrics
from node.weighted_queue import WeightedQueue
from store.errors import ChatsyncError
from store.ops import Op
from store.records import MsgV1
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


@dataclass
class WriterStatistics:
    queued: int  # ops waiting
    capacity: int  # ops that may wait
    batches: int
    ops_applied: int
    ops_new: int


class DbWriter:
    def __init__(
        self,
        replica: DbReplica,
        db_lock: trio.Lock,
        metrics: Metrics,
        *,
        queue_ops: int = 16384,
        batch_max: int = 2048,
        min_free_disk_mb: int = 0,
    ) -> None:
        self.replica = replica
        self.db = replica.db
        self.db_lock = db_lock
        self.metrics = metrics
        self.batch_max = batch_max
        self.min_free_disk_mb = min_free_disk_mb
        self._queue = WeightedQueue[WriteRequest](queue_ops, weight=lambda r: r.size)
        self._batches = self._ops_applied = self._ops_new = 0

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
                await self._apply_each_or_all(self._batch_after(first))
        finally:
            self._queue.close()  # submitters learn that nobody writes any more
        await self._flush_chat_lists()

    async def _flush_chat_lists(self) -> None:
        """Nothing to write: the chat-list moves that wait are written now (store.inbox)."""
        if not self.db.chat_lists_stale():
            return
        try:
            async with self.db_lock:
                await trio.to_thread.run_sync(self.db.flush_chat_lists)
        except Exception as exc:  # they still wait: the next read or idle moment retries
            log.warning("chat-list refresh failed: %s: %s", type(exc).__name__, exc)
            self.metrics.inc("write_errors", help="write batches that failed")

    def _batch_after(self, first: WriteRequest) -> list[WriteRequest]:
        """``first`` and the requests waiting behind it, up to ``batch_max`` ops."""
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

    async def _apply_each_or_all(self, requests: Sequence[WriteRequest]) -> None:
        """Write ``requests`` in a worker thread under db_lock; if that fails, each request
        alone, so that one bad request does not fail the others."""
        try:
            async with self.db_lock:
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
        """Apply validated ops (worker thread, under db_lock); per op, whether it changed anything."""
        check_free_disk(self.db.config.path, self.min_free_disk_mb)  # refuse, never half-write
        return self.replica.apply_ops(ops).new
