"""A Spark standalone cluster on this machine: a master and N workers started with pyspark's
own ``bin/spark-class`` on 127.0.0.1, stopped on the way out.

What ``chatsync sim workers`` measures the simulator on (does another executor add speed?)
and what the standalone test runs it on. On real machines, start the master and workers as
Spark's documentation says and pass ``--master spark://host:port`` to ``chatsync sim run``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path

from sim.spark import LOOPBACK, spark_home

MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"


class ClusterError(RuntimeError):
    """The cluster did not come up; the message names the log to read."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((LOOPBACK, port)) == 0


def _env(work_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_LOG_DIR": str(work_dir / "logs"),
    }


def _registered(log: Path) -> bool:
    return log.exists() and b"Successfully registered with master" in log.read_bytes()


@contextmanager
def local_cluster(
    work_dir: Path,
    *,
    workers: int = 1,
    cores: int = 1,
    memory: str = "1g",
    timeout_s: float = 120,
) -> Iterator[str]:
    """Start a master and ``workers`` workers of ``cores`` cores and ``memory`` each (a
    worker's memory is what its executors' JVMs may take; the Python workers beside them
    are not counted in it); yield the master's URL once every worker has registered."""
    if workers < 1 or cores < 1:
        raise ValueError(f"a cluster needs a worker and a core: {workers} workers of {cores}")
    work_dir.mkdir(parents=True, exist_ok=True)
    spark_class = str(spark_home() / "bin" / "spark-class")
    port = free_port()
    url = f"spark://{LOOPBACK}:{port}"
    env = _env(work_dir)
    common = ["--host", LOOPBACK, "--webui-port", "0"]
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, args: list[str]) -> Path:
        log = work_dir / f"{name}.log"
        with log.open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [spark_class, *args],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # the whole JVM's group is stopped at the end
                )
            )
        return log

    try:
        master = start("master", [MASTER, "--port", str(port), *common])
        _wait(lambda: _listening(port), procs[0], master, timeout_s, f"no master on {url}")
        sizes = ["--cores", str(cores), "--memory", memory]
        logs = [
            start(
                f"worker-{i}",
                [WORKER, url, *sizes, "--work-dir", str(work_dir / f"worker-{i}"), *common],
            )
            for i in range(workers)
        ]
        for log, proc in zip(logs, procs[1:], strict=True):
            joined = partial(_registered, log)
            _wait(joined, proc, log, timeout_s, f"a worker did not join {url}")
        yield url
    finally:
        _stop(procs)


def _wait(
    ready: Callable[[], bool],
    proc: subprocess.Popen[bytes],
    log: Path,
    timeout_s: float,
    error: str,
) -> None:
    """Until ``ready()``; a process that exits first (a bad option, a taken port) raises at
    once with the JVM's reason from its log, a timeout after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while not ready():
        if proc.poll() is not None:
            raise ClusterError(f"{error}: it exited ({_last_error(log)}); see {log}")
        if time.monotonic() > end:
            raise ClusterError(f"{error} within {timeout_s:.0f} s; see {log}")
        time.sleep(0.3)


def _last_error(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if "Exception" in line]
    return lines[-1].strip() if lines else "no exception logged"


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in reversed(procs):
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
