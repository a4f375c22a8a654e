"""The node's retention GC (RETENTION.md): every ``gc_interval_s``, one cycle.

A cycle takes ``now_ms`` once and derives the cutoff from it (age and size).
Each step that changes RocksDB — trimming chats, then each batch of aged
seen_msg entries with the same ids taken out of the Merkle tree — runs in a
worker thread under ``db_lock``, so the writer and sync sessions never see the
store and the tree disagree. Compaction, which only frees disk, runs outside
the lock. The new cutoff then becomes the sync sessions' message cutoff.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import trio

from node.clock import Clock
from node.metrics import Metrics
from node.syncer import SyncService
from store.retention import RetentionPolicy, expire_seen, iter_seen_aged, storage_bytes, trim_chats
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
        db_lock: trio.Lock,
        policy: RetentionPolicy,
        metrics: Metrics,
        clock: Clock,
        *,
        sync: SyncService | None = None,
        interval_s: float = 300.0,
        batch: int = 10_000,
    ) -> None:
        self.replica = replica
        self.db = replica.db
        self.db_lock = db_lock
        self.policy = policy
        self.metrics = metrics
        self.clock = clock
        self.sync = sync  # its sessions' message cutoff follows ours
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
        async with self.db_lock:
            cycle.chats_trimmed = len(await trio.to_thread.run_sync(trim_chats, db, cutoff))
        cycle.messages_expired = await self._expire_seen(cutoff)
        if self.sync is not None:
            self.sync.config = replace(self.sync.config, cutoff_ms=cutoff)
        if cycle.chats_trimmed or cycle.messages_expired:
            await trio.to_thread.run_sync(db.compact)
        cycle.bytes_after = await trio.to_thread.run_sync(storage_bytes, db)
        cycle.seconds = self.clock.now() - t0
        self._report(cycle)
        return cycle

    async def _expire_seen(self, cutoff: int) -> int:
        """Drop the aged seen_msg entries, one batch at a time, the same ids out of the tree."""
        aged = iter_seen_aged(self.db, cutoff)

        def step() -> int:
            ids = expire_seen(aged, self.db, self.batch)
            self.replica.remove_from_tree(ids)
            return len(ids)

        expired = 0
        while True:
            async with self.db_lock:  # one batch at a time: writers and sync sessions interleave
                removed = await trio.to_thread.run_sync(step)
            if not removed:
                return expired
            expired += removed

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
