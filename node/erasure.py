"""Erasure compaction: a delete takes the erased rows out at once (the writer's WriteBatch);
this task makes their payloads leave the files — a flush and a compaction of the erased
range (``ChatDb.compact_erased``), ~0.1 s — in a worker thread, outside the writer and the
db lock (RocksDB compacts concurrently with writes), for all the deletes of an interval at
once. A node killed before the task ran keeps those payloads in its files until the
RocksDB's own compactions rewrite them (MESSAGES.md)."""

from __future__ import annotations

import trio

from node.metrics import Metrics
from store.chatdb import ChatDb


async def compact_erasures(db: ChatDb, metrics: Metrics, interval_s: float = 1.0) -> None:
    while True:
        await trio.sleep(interval_s)
        if db.erasure_pending():
            keys = await trio.to_thread.run_sync(db.compact_erased)
            metrics.inc(
                "erasures_compacted", keys, help="erased messages whose files were compacted"
            )
