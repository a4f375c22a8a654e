"""The node's GC cycle: its steps are jobs of the running writer; trees, sync cutoff and metrics follow."""

from __future__ import annotations

from pathlib import Path

import trio

from node.clock import Clock
from node.gc import RetentionGc
from node.metrics import Metrics
from node.syncer import SyncService
from node.writer import DbWriter
from store.retention import DAY_MS, RetentionPolicy
from sync.frames import Domain
from sync.replica import DbReplica

from node_support import JOIN, messages, small_db


async def test_a_cycle_expires_old_messages_while_the_writer_keeps_writing(tmp_path: Path) -> None:
    db = small_db(tmp_path / "db")
    try:
        replica, metrics, clock = DbReplica(db), Metrics(), Clock(0)
        replica.apply_ops([JOIN])  # admits the author of ``messages()``
        writer = DbWriter(replica, metrics)
        sync = SyncService(
            replica, writer.store_received, metrics, clock=clock, cutoff=lambda: replica.cutoff_ms
        )
        old = messages(0, 300)  # HLC physical 1_000 .. 1_299 ms
        new = messages(10**6, 300)  # far newer
        policy = RetentionPolicy(retention_days=1)
        now = 1_300 + DAY_MS  # everything at or before 1_300 ms is expired
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            await writer.submit(old)
            nursery.start_soon(writer.submit, new)  # writes go on during the cycle
            gc = RetentionGc(replica, writer, policy, metrics, clock, batch=50)
            cycle = await gc.cycle(now)
            writer.close()
        assert cycle.cutoff_ms == 1_300
        assert cycle.messages_expired == 300
        kept = {i for i, _ in db.iter_msg_ids()}
        assert kept == {m.msg_id for m in new} and not replica.waiting
        assert DbReplica(db).tree(Domain.MESSAGES) == replica.tree(Domain.MESSAGES)
        assert sync.session_config().cutoff_ms == 1_300  # sessions now negotiate with this cutoff
        assert metrics.counter("gc_messages_expired") == 300
        assert all(r.expired for r in db.put_messages(old[:5]))  # no resurrection by replay
    finally:
        db.close()


async def test_no_policy_no_cycle(tmp_path: Path) -> None:
    db = small_db(tmp_path / "db")
    try:
        db.put_messages(messages(0, 10))
        replica = DbReplica(db)
        gc = RetentionGc(
            replica, DbWriter(replica, Metrics()), RetentionPolicy(), Metrics(), Clock(0)
        )
        cycle = await gc.cycle(10**13)
        assert cycle.cutoff_ms is None and sum(1 for _ in db.iter_msg_ids()) == 10
    finally:
        db.close()
