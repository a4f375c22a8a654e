"""What a benchmark records about the machine it ran on (a shared machine's load matters)."""

from __future__ import annotations

import math
import os
import platform
from pathlib import Path
from typing import Any


def machine_info(load_before: list[float] | None, **versions: str) -> dict[str, Any]:
    """CPU count, platform, Python, ``versions`` of what the benchmark compares, load averages."""
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        **versions,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_busy_s() -> float:
    """CPU seconds all cores spent busy since boot (Linux /proc/stat; nan elsewhere)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return math.nan
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process and of its children (a node's signature workers), in
    seconds (Linux /proc): of those it has waited for, and of those still running."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    ticks = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return ticks + sum(cpu for c in child_pids(pid) if not math.isnan(cpu := process_cpu_s(c)))


def rss_kib(pid: int) -> int:
    """A process's resident set (VmRSS, KiB; Linux /proc) and its children's: a node's signature
    workers are its memory too (shared library pages are counted in each)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) + sum(rss_kib_or_zero(c) for c in child_pids(pid))
    raise ValueError(f"no VmRSS for process {pid}")


def rss_kib_or_zero(pid: int) -> int:
    """``rss_kib``, or 0 for a process that has exited meanwhile."""
    try:
        return rss_kib(pid)
    except (OSError, ValueError):
        return 0


def child_pids(pid: int) -> list[int]:
    """The processes any thread of ``pid`` started and that still run ([]: none, or it is gone)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tasks:
        try:
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return out
