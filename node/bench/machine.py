"""What a benchmark records about the machine it ran on (a shared machine's load matters)."""

from __future__ import annotations

import os
import platform
from typing import Any


def machine_info(load_before: list[float] | None) -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
