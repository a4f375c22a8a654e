"""The quantile the benchmarks report: nearest rank, and None where it falls on an op that never
came (``inf``)."""

from __future__ import annotations

import math


def quantile(ordered: list[float], q: float) -> float | None:
    """The ``q`` quantile of sorted, non-empty ``ordered`` (None if it is ``inf``)."""
    v = ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    return None if math.isinf(v) else v
