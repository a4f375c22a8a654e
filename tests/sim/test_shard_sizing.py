"""How many shards a run is cut into when ``--shards`` is left out (``sim.shards.shards_for``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from sim.cli import _ProgressLog, sim_app
from sim.hunt import small_trace
from sim.shards import MAX_SIM_SHARDS, TASK_BUDGET_BYTES, shards_for, task_bytes

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@given(
    nodes=st.integers(1, 20_000),
    ops=st.integers(0, 1_000_000),
    cores=st.integers(1, 64),
)
def test_the_fewest_shards_that_fit_the_budget_and_one_a_core_at_least(
    nodes: int, ops: int, cores: int
) -> None:
    shards = shards_for(nodes, ops, cores)
    assert cores <= shards <= MAX_SIM_SHARDS
    if task_bytes(nodes, ops, shards) > TASK_BUDGET_BYTES:
        assert shards == MAX_SIM_SHARDS  # nothing fits: as many as there may be
    elif shards > cores:
        assert task_bytes(nodes, ops, shards - 1) > TASK_BUDGET_BYTES  # one fewer would not fit


def test_the_estimate_is_never_below_the_runs_measured_in_sim_md() -> None:
    # (nodes, ops, shards) -> a task's peak RSS in MB, from SIM.md's runs with IndexedTree
    measured = {
        (1000, 13_661, 8): 761,
        (1000, 13_661, 2): 2106,
        (1000, 151_895, 16): 1985,
        (1000, 151_895, 8): 3529,
        (10_000, 2_746, 8): 2200,
    }
    for (nodes, ops, shards), mb in measured.items():
        estimate = task_bytes(nodes, ops, shards) / 1e6
        assert mb <= estimate <= 1.6 * mb, (nodes, ops, shards, estimate, mb)
    # the goal's trace: 13 shards on 2 cores (1,985 MB measured at 16, 3,529 MB at 8)
    assert shards_for(1000, 151_895, 2) == 13


def test_sim_run_without_shards_cuts_one_a_core_and_logs_progress_and_memory(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_ProgressLog, "every_s", 0.0)  # every update a line
    trace = small_trace(3, tmp_path / "t.parquet")
    cmd = ["run", str(trace), "--out", str(tmp_path / "r")]
    result = CliRunner().invoke(sim_app, cmd)  # no terminal: the progress comes as lines
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if "simulating:" in line]
    assert lines and all("node-ops/s, ETA" in line for line in lines)
    assert "100.0%" in result.stderr  # the last update: checking
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    cores = spark.sparkContext.defaultParallelism
    assert report["result"]["shards"] == cores == 2  # a small trace: the cores decide
    assert f"{cores} shards" in result.stdout
    assert "memory: shard peak RSS" in result.stdout
    assert report["timing"]["shard_rss_mb_estimate"] > 0
