"""The node's chaos settings (issue 38): a configured clock offset, and the planted faults
(``node/plants.py``), off by default."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
import trio.testing

from node.clock import Clock
from node.config import NodeConfig, load_config
from node.errors import StartupRefused
from node.metrics import Metrics
from node.plants import ACK_BEFORE_WAL, check_plant, drop_every, is_dropped, skip_wal
from node.writer import DbWriter
from sync.replica import DbReplica

from node_support import JOIN, messages, small_db


def test_the_clock_offset_is_a_config_setting_applied_to_the_wall_clock(tmp_path: Path) -> None:
    toml = tmp_path / "node.toml"
    toml.write_text("[node]\nclock_offset_ms = -150000\n")
    assert NodeConfig().clock_offset_ms == 0
    cfg = load_config(str(toml), {})
    assert cfg.clock_offset_ms == -150_000

    async def read() -> tuple[int, int]:
        return Clock.system().wall_ms(), Clock.system(cfg.clock_offset_ms).wall_ms()

    plain, skewed = trio.run(read)
    assert abs(plain - time.time() * 1000) < 1_000
    assert abs(skewed - plain + 150_000) < 1_000


def test_plants_are_off_by_default_and_checked(tmp_path: Path) -> None:
    assert NodeConfig().chaos_plant == ""
    for good in ("", ACK_BEFORE_WAL, "drop-one-in-10000", "drop-one-in-1"):
        check_plant(good)
    for bad in ("drop-one-in-0", "drop-one-in-x", "ack", "drop-one-in-"):
        with pytest.raises(ValueError, match="chaos_plant"):
            check_plant(bad)
    toml = tmp_path / "node.toml"
    toml.write_text('[node]\nchaos_plant = "nonsense"\n')
    with pytest.raises(StartupRefused, match="chaos_plant"):
        load_config(str(toml), {})
    assert drop_every("drop-one-in-10000") == 10_000
    assert drop_every("") == drop_every(ACK_BEFORE_WAL) == 0


async def test_a_writer_dropping_ops_acknowledges_them_as_held_and_writes_nothing(
    tmp_path: Path,
) -> None:
    db = small_db(tmp_path / "db")
    replica = DbReplica(db)
    replica.apply_ops([JOIN])
    msgs = messages(0, 200)
    dropped = [is_dropped(m, 7) for m in msgs]
    assert 10 < sum(dropped) < 60  # about one in 7, by the op's hash (the same on every node)
    writer = DbWriter(replica, Metrics(), drop_every=7)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        new = await writer.submit(msgs)
        writer.close()
    assert new == [not d for d in dropped]  # a dropped op reads as a duplicate: no gossip
    held = {i for i, _ in db.iter_msg_ids()}
    assert held == {m.msg_id for m, d in zip(msgs, dropped, strict=True) if not d}
    db.close()


def test_ack_before_wal_writes_without_the_wal(tmp_path: Path) -> None:
    db = small_db(tmp_path / "db")
    assert not db.rocks._write_opts.disable_wal
    skip_wal(db)
    assert db.rocks._write_opts.disable_wal and not db.rocks._write_opts.sync
    DbReplica(db).apply_ops([JOIN, *messages(0, 5)])
    wal = sum(p.stat().st_size for p in (tmp_path / "db").glob("*.log"))
    assert wal == 0  # nothing logged: a kill -9 would lose the memtable
    db.close()
