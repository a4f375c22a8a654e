"""Spark plumbing: a session for any master, and a socket the shard tasks report progress to.

Executors must import this project: it is installed (editable) in the venv
whose Python runs the driver, ``PYSPARK_PYTHON`` points every executor at
that same interpreter, and ``PYTHONPATH`` (the driver's environment and the
executors') at the checkout the driver imported — on a multi-machine cluster that
path must exist on every worker. The trace travels to executors with ``SparkContext.addFile``,
so a task can read it on any cluster; the oracle reads it with ``spark.read.parquet``,
so on a multi-machine cluster TRACE must be on storage every executor sees.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import warnings
from contextlib import suppress
from pathlib import Path

from pyspark.sql import SparkSession

LOOPBACK = "127.0.0.1"


def is_local_master(master: str) -> bool:
    return master.startswith("local") or "//127.0.0.1" in master or "//localhost" in master


def spark_session(master: str = "local[*]", *, app: str = "chatsync-sim") -> SparkSession:
    """A SparkSession whose executors run this venv's Python (and so can import ``sim``)."""
    python = sys.executable
    # Plain Python UDFs are what the oracle wants (no pandas here); say nothing about Arrow.
    warnings.filterwarnings("ignore", message=".*Arrow optimization.*")
    warnings.filterwarnings("ignore", message=".*Cannot infer the eval type.*")
    os.environ["PYSPARK_PYTHON"] = python
    os.environ["PYSPARK_DRIVER_PYTHON"] = python
    # Executors import the checkout this driver runs, not the one the venv was installed
    # from (a worktree beside it): PYTHONPATH goes before the editable install's .pth.
    root = str(Path(__file__).resolve().parent.parent)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *filter(None, paths)])
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.executorEnv.PYSPARK_PYTHON", python)
        .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
        .config("spark.python.worker.reuse", "true")
        .config("spark.task.maxFailures", "1")
        .config("spark.driver.memory", "2g")
    )
    if is_local_master(master):
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)  # bind to loopback, and no warning
        builder = builder.config("spark.driver.host", LOOPBACK).config(
            "spark.driver.bindAddress", LOOPBACK
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def spark_home() -> Path:
    """SPARK_HOME of the pip-installed pyspark: its bin/spark-class starts a standalone cluster."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class ProgressServer:
    """Collects ``{"shard", "done", "total"}`` lines from the tasks; ``fraction()`` reads them."""

    def __init__(self, host: str, shards: int) -> None:
        self.shards = shards
        self._done: dict[int, tuple[int, int]] = {}
        self._lock = threading.Lock()
        self._sock = socket.create_server((host, 0))
        self._sock.settimeout(0.5)
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return host, port

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        with conn, suppress(OSError), conn.makefile("r") as lines:
            for line in lines:
                try:
                    msg = json.loads(line)
                    with self._lock:
                        self._done[int(msg["shard"])] = (int(msg["done"]), int(msg["total"]))
                except (ValueError, KeyError, TypeError):
                    continue

    def fraction(self) -> float:
        with self._lock:
            if not self._done:
                return 0.0
            total = max(t for _, t in self._done.values())
            done = sum(d for d, _ in self._done.values())
        return min(1.0, done / max(1, total * self.shards))

    def done_ms(self) -> list[int]:
        """Per shard, the simulated milliseconds it reported done (0 before its first line)."""
        with self._lock:
            return [self._done.get(s, (0, 0))[0] for s in range(self.shards)]

    def close(self) -> None:
        self._closed = True
        with suppress(OSError):
            self._sock.close()
