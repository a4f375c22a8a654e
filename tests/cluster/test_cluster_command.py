"""``chatsync cluster`` as a person runs it (a process): it refuses a data directory it did
not make, SIGTERM stops every node it started, and a node that dies stops the rest."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cluster.cli import MARKER

pytestmark = pytest.mark.slow


def start(*args: str) -> tuple[subprocess.Popen[str], list[str]]:
    """The command, and the lines it prints (read as they come, stdout and stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "cluster", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    assert proc.stdout is not None
    stdout = proc.stdout
    threading.Thread(target=lambda: lines.extend(iter(stdout.readline, "")), daemon=True).start()
    return proc, lines


def node_pids(lines: list[str], nodes: int, timeout_s: float = 120) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = [int(p) for line in lines for p in re.findall(r"\(pid (\d+),", line)]
        if len(pids) == nodes:
            return pids
        time.sleep(0.2)
    raise AssertionError(f"no {nodes} nodes started: {lines}")


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie (exited, not yet reaped by a parent that is gone too) counts as gone
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"


def test_sigterm_stops_every_node_and_a_dead_node_stops_the_rest(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, lines = start("--nodes", "2", "--data", str(data))
    pids = node_pids(lines, 2)
    assert (data / MARKER).exists()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, lines
    assert all(gone(pid) for pid in pids), lines

    # the directory it made is its own: a second run takes it (and wipes it)
    proc, lines = start("--nodes", "2", "--data", str(data))
    pids = node_pids(lines, 2)
    os.kill(pids[1], signal.SIGKILL)
    assert proc.wait(timeout=60) == 1, lines
    assert all(gone(pid) for pid in pids), lines
    assert any(re.search(r"error: node 1 exited \(status -9; log .*node1.log\)", x) for x in lines)


def test_a_directory_it_did_not_make_is_refused_unless_wiped(tmp_path: Path) -> None:
    data = tmp_path / "mine"
    data.mkdir()
    (data / "notes.txt").write_text("keep me")
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "cluster", "--nodes", "1", "--data", str(data)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done
    assert done.stderr == (
        f"error: --data {data} is not empty and was not made by `chatsync cluster`; "
        "pass --wipe to delete what is in it, or name another directory\n"
    )
    assert (data / "notes.txt").read_text() == "keep me"
    proc, lines = start("--nodes", "1", "--data", str(data), "--wipe")
    [pid] = node_pids(lines, 1)
    assert not (data / "notes.txt").exists() and (data / MARKER).exists()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0, lines
    assert gone(pid)
