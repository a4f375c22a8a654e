"""``chatsync bench hostile`` on tiny parameters: every attack runs and the report has its
figures, no verdict asserted (the hostile tests assert what honest peers get at full size).
Needs Node.js 20 and npm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from bench.hostile_bench import HostileBenchParams, run_hostile_bench

pytestmark = pytest.mark.slow

TINY = HostileBenchParams(
    cycles=20, probes=1, silent_streams=1, sync_messages=10, sync_timeout_s=8,
    nosync_peers=3, nosync_window_s=4, nosync_sync_interval_s=2, replay_rate=20, replay_s=3,
    honest_ops=2, flood_connections=5, flood_hold_s=1, settle_s=1,
)  # fmt: skip


def test_bench_hostile_tiny(tmp_path: Path) -> None:
    out = tmp_path / "results" / "hostile.json"
    params = HostileBenchParams(**{**TINY.__dict__, "out": out, "data": tmp_path / "nodes"})
    with (tmp_path / "log.txt").open("w") as log:
        report = run_hostile_bench(params, console=Console(file=log, width=200))

    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(report))
    assert saved["benchmark"] == "hostile"
    attacks = saved["attacks"]
    assert set(attacks) == set(saved["honest_peers_ok"]) == {
        "churn", "silent_sync", "no_sync_protocol", "replay_flood", "connection_flood",
    }  # fmt: skip
    assert saved["failures"] == [k for k, ok in saved["honest_peers_ok"].items() if not ok]
    assert attacks["churn"]["cycles"] == 20
    assert attacks["silent_sync"]["converged_s_without_attack"] is not None
    assert attacks["no_sync_protocol"]["peers_connected"] == 3
    assert attacks["no_sync_protocol"]["log_lines_per_minute"] >= 0
    assert attacks["replay_flood"]["published"] > 0
    assert attacks["replay_flood"]["honest_arrived"] == 2
    flood = attacks["connection_flood"]
    assert flood["connected"] == 5
    assert min(flood["rss_mb_before"], flood["rss_mb_during"], flood["rss_mb_after"]) > 0
    assert "what honest peers get" in (tmp_path / "log.txt").read_text()
