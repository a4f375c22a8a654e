"""The node's retention GC loop (RETENTION.md): every ``gc_interval_s``, one cycle.

A cycle takes ``now_ms`` once and derives the cutoff from it (age and size).
Each step that changes RocksDB — trimming chats, then each batch of aged
seen_msg entries with the same ids taken out of the Merkle tree — runs in a
worker thread under ``db_lock``, so the writer and sync sessions never see the
store and the tree disagree. Compaction, which only frees disk, runs outside
the lock. The new cutoff then becomes the sync sessions' message cutoff.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import trio

from node.metrics import Metrics
from node.syncer import SyncService
from store.chatdb import ChatDb
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


async def run_gc_cycle(
    db: ChatDb,
    replica: DbReplica,
    db_lock: trio.Lock,
    policy: RetentionPolicy,
    now_ms: int,
    *,
    metrics: Metrics,
    sync: SyncService | None = None,
    batch: int = 10_000,
) -> GcCycle:
    t0 = time.perf_counter()
    cutoff = await trio.to_thread.run_sync(policy.cutoff, db, now_ms)
    cycle = GcCycle(cutoff)
    if cutoff is None:
        return cycle
    cycle.bytes_before = await trio.to_thread.run_sync(storage_bytes, db)
    async with db_lock:
        cycle.chats_trimmed = len(await trio.to_thread.run_sync(trim_chats, db, cutoff))
    aged = iter_seen_aged(db, cutoff)

    def step() -> int:
        ids = expire_seen(aged, db, batch)
        replica.remove_from_tree(ids)
        return len(ids)

    while True:
        async with db_lock:  # one batch at a time: writers and sync sessions interleave
            removed = await trio.to_thread.run_sync(step)
        if not removed:
            break
        cycle.messages_expired += removed
    if sync is not None:
        sync.config = replace(sync.config, cutoff_ms=cutoff)
    if cycle.chats_trimmed or cycle.messages_expired:
        await trio.to_thread.run_sync(db.compact)
    cycle.bytes_after = await trio.to_thread.run_sync(storage_bytes, db)
    cycle.seconds = time.perf_counter() - t0
    metrics.inc("gc_cycles", help="retention GC cycles that had a cutoff")
    metrics.inc("gc_messages_expired", cycle.messages_expired, help="messages removed by retention")
    log.info(
        "gc: cutoff %d, %d chats trimmed, %d messages expired, %.1f -> %.1f MB in %.2f s",
        cutoff, cycle.chats_trimmed, cycle.messages_expired,
        cycle.bytes_before / 1e6, cycle.bytes_after / 1e6, cycle.seconds,
    )  # fmt: skip
    return cycle


async def gc_loop(
    db: ChatDb,
    replica: DbReplica,
    db_lock: trio.Lock,
    policy: RetentionPolicy,
    interval_s: float,
    clock_ms: Callable[[], int],
    *,
    metrics: Metrics,
    sync: SyncService | None = None,
) -> None:
    """A cycle now (so a restarted node expires what aged while it was down), then periodically."""
    while True:
        try:
            await run_gc_cycle(db, replica, db_lock, policy, clock_ms(), metrics=metrics, sync=sync)
        except Exception as exc:  # a failed cycle is retried next interval; the node keeps serving
            log.warning("gc cycle failed: %s: %s", type(exc).__name__, exc)
            metrics.inc("gc_errors", help="GC cycles that failed")
        await trio.sleep(interval_s)
