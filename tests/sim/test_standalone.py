"""The simulator on a real Spark standalone cluster: master and worker from pyspark's own
``bin/spark-class`` on 127.0.0.1, torn down after."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.runner import run_simulation
from sim.spark import spark_home, spark_session

from sim_support import SPARK_WARNINGS, small_trace

pytestmark = [pytest.mark.slow, *SPARK_WARNINGS]
CHATSYNC = str(Path(sys.executable).parent / "chatsync")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


def _env(tmp: Path) -> dict[str, str]:
    home = spark_home()
    return {
        **os.environ,
        "SPARK_HOME": str(home),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(tmp / "logs"),
        "SPARK_WORKER_DIR": str(tmp / "work"),
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("cluster")
    spark_class = str(spark_home() / "bin" / "spark-class")
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    env = _env(tmp)
    procs: list[subprocess.Popen[bytes]] = []
    common = ["--host", "127.0.0.1", "--webui-port", "0"]
    try:
        for args in (
            ["org.apache.spark.deploy.master.Master", "--port", str(port), *common],
            [
                "org.apache.spark.deploy.worker.Worker",
                url,
                "--cores",
                "1",
                "--memory",
                "1g",
                *common,
            ],
        ):
            log = (tmp / f"{args[0].rsplit('.', 1)[-1]}.log").open("wb")
            command = [spark_class, *args]
            procs.append(
                subprocess.Popen(
                    command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
            if len(procs) == 1:
                _wait_for_port(port, 120)
        time.sleep(3)  # the worker registers with the master
        yield url
    finally:
        for proc in reversed(procs):
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def _run_cli(trace: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            CHATSYNC,
            "sim",
            "run",
            str(trace),
            "--shards",
            "2",
            "--out",
            str(out),
            "--no-progress",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )


def test_the_simulator_runs_on_a_standalone_cluster(cluster: str, tmp_path: Path) -> None:
    trace = small_trace(3, tmp_path / "t.parquet")
    done = _run_cli(trace, tmp_path / "report", "--master", cluster)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["timing"]["master"] == cluster
    assert report["result"]["ok"]
    # The same trace on local[2] in this process: the very same result.
    spark = spark_session("local[2]")
    try:
        local = run_simulation(spark, trace, shards=2).result
    finally:
        spark.stop()
    assert report["result"] == json.loads(json.dumps(local))
