"""Does another executor add speed? One trace replayed on standalone clusters of 1, 2, ...
workers on this machine (``sim.cluster``), side by side: ``chatsync sim workers``.

Shards are the unit of work (one Spark task each), so a run can use at most ``shards``
executor cores, and the slowest shard bounds it: more shards than cores keep every core
busy to the end. Every run must give the very same ``result`` (it depends on the trace,
``--shards`` and a planted bug only).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from sim.cluster import local_cluster
from sim.report import summary
from sim.runner import run_simulation
from sim.spark import spark_session

COLUMNS = (
    "workers",
    "executor cores",
    "wall s",
    "simulating s",
    "node-ops/s",
    "per executor core",
    "speed-up",
    "shard peak RSS MB",
    "result",
)


@dataclass(frozen=True)
class WorkersRun:
    workers: int
    cores: int  # per worker
    timing: dict[str, Any]
    result: dict[str, Any]
    summary: str  # what ``chatsync sim run`` prints of it

    @property
    def executor_cores(self) -> int:
        return self.workers * self.cores

    @property
    def node_ops_per_s(self) -> float:
        return float(self.timing["node_ops_per_s"])


def measure_workers(
    trace: Path,
    counts: Sequence[int],
    *,
    shards: int,
    cores: int = 1,
    memory: str = "2g",
    note: Callable[[str], None] = lambda what: None,
) -> list[WorkersRun]:
    """Replay ``trace`` once per worker count, each on a cluster of its own."""
    runs = []
    for count in counts:
        with tempfile.TemporaryDirectory(prefix="chatsync-cluster-") as tmp:
            note(f"{count} worker(s): starting the cluster")
            with local_cluster(Path(tmp), workers=count, cores=cores, memory=memory) as url:
                spark = spark_session(url)
                try:
                    outcome = run_simulation(
                        spark,
                        trace,
                        shards=shards,
                        on_progress=partial(_progress, note, count),
                    )
                finally:
                    spark.stop()
        runs.append(WorkersRun(count, cores, outcome.timing, outcome.result, summary(outcome)))
    return runs


def _progress(note: Callable[[str], None], workers: int, _: float, what: str) -> None:
    note(f"{workers} worker(s): {what}")  # what sim run's bar says: simulated time, rate, ETA


def table_rows(runs: Sequence[WorkersRun]) -> list[list[str]]:
    base = runs[0].node_ops_per_s if runs else 0.0
    rows = []
    for run in runs:
        t = run.timing
        rows.append(
            [
                str(run.workers),
                str(run.executor_cores),
                f"{t['wall_s']:,.1f}",
                f"{t['simulate_s']:,.1f}",
                f"{run.node_ops_per_s:,.0f}",
                f"{run.node_ops_per_s / run.executor_cores:,.0f}",
                f"{run.node_ops_per_s / base:.2f}x" if base else "-",
                f"{t['shard_peak_rss_mb']:,.0f}",
                "OK" if run.result["ok"] else "FAILED",
            ]
        )
    return rows


def problems(runs: Sequence[WorkersRun]) -> list[str]:
    """What makes the comparison fail: a failed check, or results that differ."""
    out = [f"{r.workers} worker(s): the check failed" for r in runs if not r.result["ok"]]
    if not runs:
        return out
    first = _canonical(runs[0].result)  # once, not once per run compared with it
    out += [
        f"{r.workers} worker(s): a result other than that of {runs[0].workers} worker(s)"
        for r in runs[1:]
        if _canonical(r.result) != first
    ]
    return out


def _canonical(result: Any) -> str:
    return json.dumps(result, sort_keys=True)


def write_report(runs: Sequence[WorkersRun], out: Path, command: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "workers.json"
    rows = [
        {
            "workers": r.workers,
            "cores_per_worker": r.cores,
            "timing": r.timing,
            "summary": r.summary,
        }
        for r in runs
    ]
    report = {
        "command": command,
        "columns": list(COLUMNS),
        "table": table_rows(runs),
        "runs": rows,
        "problems": problems(runs),
        "result": runs[0].result if runs else None,
    }
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path
