"""The DB writer: seed 002's write pipeline with bounded queues.

    handlers ──submit()──▶ [bounded channel] ──▶ writer task ──to_thread──▶ ChatDb + Merkle trees

One task owns writes. It takes every request waiting in the channel (up to
``batch_max`` ops), applies them in a worker thread — one WriteBatch per domain
— updates the Merkle trees in the same step, and only then acknowledges. A full
channel makes ``submit`` wait (backpressure) and ``submit_nowait`` raise
``trio.WouldBlock``. With ``durable`` the DB syncs its WAL on every write, so an
acknowledged op survives kill -9.

Sync sessions also write (records they receive). They take the same ``db_lock``
around each step, so there is one writer at a time and the trees always match
what is on disk.

Inbox: after the ops of a batch are stored, ``update_inboxes`` rewrites the
chat-list entry (CF user_inbox) of every chat that got new messages — one
``upsert_inbox_for_members`` call per chat per batch — for the chat's active
members plus the batch's senders. The entry comes from the chat's ChatMeta
(newest message, local ``last_seq``, which the unread count is measured against);
its kind is DM when the chat id is the DM id of its two participants
(``node.e2e.dm_chat_id``), else GROUP. The inbox is a local view: it is written in
its own WriteBatch right after the messages', and derived again on the next message.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from node.limits import check_free_disk
from node.metrics import Metrics
from store.chatdb import ChatDb
from store.ops import MembershipOp, Op
from store.records import IdentityRecord, MsgV1
from sync.frames import Domain
from sync.replica import DbReplica

if TYPE_CHECKING:
    from trio_typing import TaskStatus

log = logging.getLogger(__name__)


@dataclass
class WriteRequest:
    ops: list[Op]
    done: trio.Event = field(default_factory=trio.Event)
    new: list[bool] = field(default_factory=list)  # per op: did it change the store?
    error: BaseException | None = None


@dataclass
class WriterStatistics:
    queued: int
    capacity: int
    batches: int
    ops_applied: int
    ops_new: int


class DbWriter:
    def __init__(
        self,
        db: ChatDb,
        replica: DbReplica,
        db_lock: trio.Lock,
        metrics: Metrics,
        *,
        queue_size: int = 1024,
        batch_max: int = 2048,
        min_free_disk_mb: int = 0,
    ) -> None:
        self.db = db
        self.replica = replica
        self.db_lock = db_lock
        self.metrics = metrics
        self.batch_max = batch_max
        self.min_free_disk_mb = min_free_disk_mb
        self._capacity = queue_size
        self._send, self._receive = trio.open_memory_channel[WriteRequest](queue_size)
        self._batches = self._ops_applied = self._ops_new = 0

    # --- submitting ---

    async def submit(self, ops: list[Op]) -> list[bool]:
        """Queue ``ops`` (waiting while the queue is full) and wait until they are written."""
        request = WriteRequest(ops)
        await self._send.send(request)
        return await self.wait(request)

    async def enqueue(self, ops: list[Op]) -> WriteRequest:
        """Queue ``ops`` (waiting only while the queue is full); ``wait()`` on the result."""
        request = WriteRequest(ops)
        await self._send.send(request)
        return request

    def submit_nowait(self, ops: list[Op]) -> WriteRequest:
        """Queue ``ops`` or raise trio.WouldBlock at once; ``wait()`` on the result for the ack."""
        request = WriteRequest(ops)
        self._send.send_nowait(request)
        return request

    @staticmethod
    async def wait(request: WriteRequest) -> list[bool]:
        await request.done.wait()
        if request.error is not None:
            raise request.error
        return request.new

    def statistics(self) -> WriterStatistics:
        stats = self._send.statistics()
        return WriterStatistics(
            stats.current_buffer_used,
            self._capacity,
            self._batches,
            self._ops_applied,
            self._ops_new,
        )

    def close(self) -> None:
        """No more submissions; ``run`` drains what is queued and returns."""
        self._send.close()

    # --- the writer task ---

    async def run(self, *, task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with self._receive:
            async for first in self._receive:
                batch = [first]
                size = len(first.ops)
                while size < self.batch_max:
                    try:
                        request = self._receive.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                    batch.append(request)
                    size += len(request.ops)
                await self._write(batch)

    async def _write(self, batch: list[WriteRequest]) -> None:
        ops = [op for request in batch for op in request.ops]
        try:
            async with self.db_lock:
                new = await trio.to_thread.run_sync(self.apply_ops, ops)
        except Exception as exc:  # one bad request must not fail the others: retry one by one
            if len(batch) > 1:
                for request in batch:
                    await self._write([request])
                return
            log.warning("write failed: %s", exc)
            self.metrics.inc("write_errors", help="write batches that failed")
            batch[0].error = exc
            batch[0].done.set()
            return
        self._batches += 1
        self._ops_applied += len(ops)
        self._ops_new += sum(new)
        offset = 0
        for request in batch:
            request.new = new[offset : offset + len(request.ops)]
            offset += len(request.ops)
            request.done.set()

    def apply_ops(self, ops: list[Op]) -> list[bool]:
        """Apply validated ops (worker thread, under db_lock); per op, whether it changed anything."""
        check_free_disk(self.db.config.path, self.min_free_disk_mb)  # refuse, never half-write
        new = [False] * len(ops)
        trees = self.replica.trees
        msgs = [(i, op) for i, op in enumerate(ops) if isinstance(op, MsgV1)]
        fresh: list[MsgV1] = []
        previous = {m.chat_id: self.db.load_meta(m.chat_id).last_ts for _, m in msgs}
        if msgs:
            for (i, msg), result in zip(
                msgs, self.db.put_messages([m for _, m in msgs]), strict=True
            ):
                if not result.duplicate:
                    trees[Domain.MESSAGES].insert(result.msg_id)
                    new[i] = True
                    fresh.append(msg)
        members = [(i, op) for i, op in enumerate(ops) if isinstance(op, MembershipOp)]
        if members:
            rows = [(op.chat_id, op.user_id, op.state()) for _, op in members]
            for (i, _), change in zip(members, self.db.apply_member_states(rows), strict=True):
                trees[Domain.MEMBERS].replace(change.old_id, change.new_id)
                new[i] = change.changed
        idents = [(i, op) for i, op in enumerate(ops) if isinstance(op, IdentityRecord)]
        if idents:
            for (i, _), ichange in zip(
                idents, self.db.put_identities([r for _, r in idents]), strict=True
            ):
                trees[Domain.IDENTITY].replace(ichange.old_id, ichange.new_id)
                new[i] = ichange.changed
        if fresh:  # after the member ops: a first message may come with its chat's members
            self.db.refresh_inboxes(fresh, previous)
        return new
