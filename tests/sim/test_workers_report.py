"""``chatsync sim workers``' comparison (``sim.workers``) without a cluster: what makes it fail,
and the table's ratios."""

from __future__ import annotations

from typing import Any

from sim.workers import WorkersRun, problems, table_rows


def _run(workers: int, node_ops_per_s: float, result: dict[str, Any]) -> WorkersRun:
    timing = {
        "wall_s": 10.0,
        "simulate_s": 8.0,
        "node_ops_per_s": node_ops_per_s,
        "shard_peak_rss_mb": 100.0,
    }
    return WorkersRun(workers, 1, timing, result, summary="")


def test_runs_with_one_result_pass_and_the_table_gives_the_speed_up() -> None:
    runs = [_run(1, 1_000.0, {"ok": True, "x": 1}), _run(2, 1_700.0, {"ok": True, "x": 1})]
    assert problems(runs) == []
    rows = table_rows(runs)
    assert [row[6] for row in rows] == ["1.00x", "1.70x"]
    assert [row[5] for row in rows] == ["1,000", "850"]  # node-ops/s per executor core


def test_a_result_that_differs_or_a_failed_check_fails_the_comparison() -> None:
    one = _run(1, 1_000.0, {"ok": True, "x": 1})
    assert problems([one, _run(2, 1_700.0, {"ok": True, "x": 2})]) == [
        "2 worker(s): a result other than that of 1 worker(s)"
    ]
    assert problems([one, _run(2, 1_700.0, {"ok": False, "x": 1})]) == [
        "2 worker(s): the check failed",
        "2 worker(s): a result other than that of 1 worker(s)",
    ]
