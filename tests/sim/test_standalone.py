"""The simulator on a real Spark standalone cluster: master and workers from pyspark's own
``bin/spark-class`` on 127.0.0.1 (``sim.cluster``), torn down after."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.cluster import ClusterError, local_cluster
from sim.runner import run_simulation
from sim.spark import spark_session

from sim_support import SPARK_WARNINGS, small_trace

pytestmark = [pytest.mark.slow, *SPARK_WARNINGS]
CHATSYNC = str(Path(sys.executable).parent / "chatsync")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with local_cluster(tmp_path_factory.mktemp("cluster")) as url:
        yield url


def _chatsync(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHATSYNC, "sim", *args], capture_output=True, text=True, timeout=900)


def test_the_simulator_runs_on_a_standalone_cluster(cluster: str, tmp_path: Path) -> None:
    trace = small_trace(3, tmp_path / "t.parquet")
    out = tmp_path / "report"
    done = _chatsync(
        "run", str(trace), "--shards", "2", "--out", str(out), "--no-progress", "--master", cluster
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["timing"]["master"] == cluster
    assert report["result"]["ok"]
    # The same trace on local[2] in this process: the very same result.
    spark = spark_session("local[2]")
    try:
        local = run_simulation(spark, trace, shards=2).result
    finally:
        spark.stop()
    assert report["result"] == json.loads(json.dumps(local))


def test_one_and_two_workers_give_the_same_result_side_by_side(tmp_path: Path) -> None:
    """``chatsync sim workers``: a cluster of one worker, then one of two; the table, the
    report, and the one result both runs must give."""
    trace = small_trace(4, tmp_path / "t.parquet")
    out = tmp_path / "workers"
    done = _chatsync(
        "workers", str(trace), "--workers", "1,2", "--shards", "4", "--memory", "1g",
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "OK: every run gave the same result" in done.stdout
    assert done.stdout.count("check: lost 0, extra 0") == 2  # each run's summary
    report = json.loads((out / "workers.json").read_text())
    assert [r["workers"] for r in report["runs"]] == [1, 2]
    assert [row[0] for row in report["table"]] == ["1", "2"]
    assert report["problems"] == [] and report["result"]["ok"]
    masters = {run["timing"]["master"] for run in report["runs"]}
    assert len(masters) == 2 and all(m.startswith("spark://127.0.0.1:") for m in masters)


@pytest.mark.parametrize("workers", ["0", "1,x", ""])
def test_worker_counts_that_are_no_counts_are_refused(workers: str, tmp_path: Path) -> None:
    trace = tmp_path / "t.parquet"
    trace.write_bytes(b"not read")
    done = _chatsync("workers", str(trace), "--workers", workers)
    assert done.returncode == 2
    assert "--workers" in done.stderr


def test_a_cluster_that_cannot_start_names_its_log(tmp_path: Path) -> None:
    no_memory = pytest.raises(ClusterError, match=r"Memory is below 1MB.*worker-0\.log")
    with no_memory, local_cluster(tmp_path, memory="0", timeout_s=20):
        pass
