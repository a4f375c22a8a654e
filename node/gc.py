"""The node's retention GC (RETENTION.md): every ``gc_interval_s``, one cycle.

A cycle takes ``now_ms`` once and derives the cutoff from it (age and size).
Each step that changes RocksDB — trimming chats, then each batch of aged
seen_msg entries with the same ids taken out of the Merkle tree (``store.retention.
Expiry`` sequences them) — is a job for the node's one writer, so writes of clients,
gossip and sync interleave with the GC's and the trees never disagree with the store.
Compaction, which only frees disk, runs beside it. The cutoff applied is the store's
(``DbReplica.cutoff_ms``): sync sessions read it there when they start.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import trio

from node.clock import Clock
from node.metrics import Metrics
from node.writer import DbWriter
from store.retention import RetentionPolicy, storage_bytes
from sync.replica import DbReplica

log = logging.getLogger(__name__)


@dataclass
class GcCycle:
    cutoff_ms: int | None
    chats_trimmed: int = 0
    messages_expired: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    seconds: float = 0.0


class RetentionGc:
    """The node's retention GC: ``cycle(now_ms)`` once, ``loop()`` every ``interval_s``."""

    def __init__(
        self,
        replica: DbReplica,
        writer: DbWriter,
        policy: RetentionPolicy,
        metrics: Metrics,
        clock: Clock,
        *,
        interval_s: float = 300.0,
        batch: int = 10_000,
    ) -> None:
        self.replica = replica
        self.db = replica.db
        self.writer = writer
        self.policy = policy
        self.metrics = metrics
        self.clock = clock
        self.interval_s = interval_s
        self.batch = batch

    @property
    def enabled(self) -> bool:
        """Whether the policy ages anything out (by age or by size)."""
        return self.policy.retention_days > 0 or self.policy.max_storage_mb > 0

    async def loop(self) -> None:
        """A cycle now (so a restarted node expires what aged while it was down), then periodically."""
        while True:
            try:
                await self.cycle(self.clock.wall_ms())
            except Exception as exc:  # the loop must outlive a failed cycle: retried next interval
                log.warning("gc cycle failed: %s: %s", type(exc).__name__, exc)
                self.metrics.inc("gc_errors", help="GC cycles that failed")
            await trio.sleep(self.interval_s)

    async def cycle(self, now_ms: int) -> GcCycle:
        t0 = self.clock.now()
        db = self.db
        cutoff = await trio.to_thread.run_sync(self.policy.cutoff, db, now_ms)
        cycle = GcCycle(cutoff)
        if cutoff is None:
            return cycle
        cycle.bytes_before = await trio.to_thread.run_sync(storage_bytes, db)
        expiry = self.replica.expiry(cutoff, self.batch)
        cycle.chats_trimmed = len(await self.writer.call(expiry.trim_chats))
        while ids := await self.writer.call(expiry.next_batch, size=self.batch):
            cycle.messages_expired += len(ids)  # one batch a job: other writes interleave
        if cycle.chats_trimmed or cycle.messages_expired:
            await trio.to_thread.run_sync(db.compact)
        cycle.bytes_after = await trio.to_thread.run_sync(storage_bytes, db)
        cycle.seconds = self.clock.now() - t0
        self._report(cycle)
        return cycle

    def _report(self, cycle: GcCycle) -> None:
        self.metrics.inc("gc_cycles", help="retention GC cycles that had a cutoff")
        self.metrics.inc(
            "gc_messages_expired", cycle.messages_expired, help="messages removed by retention"
        )
        log.info(
            "gc: cutoff %d, %d chats trimmed, %d messages expired, %.1f -> %.1f MB in %.2f s",
            cycle.cutoff_ms, cycle.chats_trimmed, cycle.messages_expired,
            cycle.bytes_before / 1e6, cycle.bytes_after / 1e6, cycle.seconds,
        )  # fmt: skip
