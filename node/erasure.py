"""Erasure compaction: a delete takes the erased rows out at once (the writer's WriteBatch);
this task makes their payloads leave the files — a flush and a compaction of the erased
range (``ChatDb.compact_erased``), ~0.1 s — as a job of the node's one writer, for all the
deletes of an interval at once (so at most ~0.1 s of the writer's time a second, and only
while deletes come). A node killed before the task ran keeps those payloads in its files
until the RocksDB's own compactions rewrite them (MESSAGES.md)."""

from __future__ import annotations

import trio

from node.metrics import Metrics
from node.writer import DbWriter


async def compact_erasures(writer: DbWriter, metrics: Metrics, interval_s: float = 1.0) -> None:
    while True:
        await trio.sleep(interval_s)
        if writer.db.erasure_pending():
            keys = await writer.call(writer.db.compact_erased)
            metrics.inc(
                "erasures_compacted", keys, help="erased messages whose files were compacted"
            )
