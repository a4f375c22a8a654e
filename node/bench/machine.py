"""What a benchmark records about the machine it ran on (a shared machine's load matters)."""

from __future__ import annotations

import os
import platform
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
