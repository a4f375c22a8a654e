"""A node's CPU and memory as the benchmarks read them include its child processes (the
signature workers): real processes, read from /proc."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.machine import child_pids, process_cpu_s, rss_kib

HOLD_AND_BURN = (
    "import sys, time\n"
    "block = b'x' * (40 * 1024 * 1024)  # 40 MiB, written: resident\n"
    "t = time.process_time()\n"
    "while time.process_time() - t < 0.5: pass\n"
    "sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()\n"
)


def test_cpu_and_rss_count_the_children() -> None:
    me = os.getpid()
    cpu_before, rss_before = process_cpu_s(me), rss_kib(me)
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        assert child.pid in child_pids(me)
        assert process_cpu_s(me) - cpu_before >= 0.45  # the child's half second
        assert rss_kib(me) - rss_before >= 40 * 1024
    finally:
        child.communicate(b"")
    assert child.pid not in child_pids(me)
    assert process_cpu_s(me) - cpu_before >= 0.45  # waited for: counted still (cutime)
    assert child_pids(2**22 + 1) == []  # no such process
