"""A small metrics registry rendered in the Prometheus text format (no client library needed)."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from functools import partial
from itertools import islice

Labels = tuple[tuple[str, str], ...]


class Metrics:
    """Counters (monotonic) and gauges (read from callbacks at scrape time)."""

    def __init__(self, prefix: str = "chatsync") -> None:
        self.prefix = prefix
        self._counters: dict[str, dict[Labels, float]] = defaultdict(dict)
        self._help: dict[str, str] = {}
        self._gauges: dict[str, Callable[[], dict[Labels, float]]] = {}
        self._latency: deque[float] = deque(maxlen=100_000)
        self.latencies_observed = 0  # since start (the deque keeps the newest)

    def observe_latency(self, ms: float) -> None:
        """Propagation latency of one op (now - its HLC time), kept for quantiles."""
        self._latency.append(ms)
        self.latencies_observed += 1

    def latency_quantiles(self) -> dict[str, float]:
        ordered = sorted(self._latency)
        if not ordered:
            return {}
        pick = partial(quantile, ordered)
        return {"count": len(ordered), "p50": pick(0.5), "p99": pick(0.99), "max": ordered[-1]}

    def newest_latencies(self, count: int) -> list[float]:
        """The last ``count`` latencies observed (fewer if the window dropped them)."""
        count = min(count, len(self._latency))
        return list(islice(reversed(self._latency), count))

    def inc(self, name: str, amount: float = 1, help: str = "", **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        series = self._counters[name]
        series[key] = series.get(key, 0) + amount
        if help:
            self._help.setdefault(name, help)

    def counter(self, name: str, **labels: str) -> float:
        return self._counters.get(name, {}).get(tuple(sorted(labels.items())), 0)

    def total(self, name: str) -> float:
        """A counter summed over all its labels."""
        return sum(self._counters.get(name, {}).values())

    def gauge(self, name: str, read: Callable[[], dict[Labels, float]], help: str = "") -> None:
        self._gauges[name] = read
        if help:
            self._help[name] = help

    def render(self) -> str:
        lines: list[str] = []
        for name, series in sorted(self._counters.items()):
            lines += self._block(f"{self.prefix}_{name}_total", "counter", name, series)
        for name, read in sorted(self._gauges.items()):
            lines += self._block(f"{self.prefix}_{name}", "gauge", name, read())
        quantiles = self.latency_quantiles()
        if quantiles:
            full = f"{self.prefix}_op_latency_ms"
            lines += [f"# HELP {full} gossip propagation latency of ops", f"# TYPE {full} summary"]
            lines += [f'{full}{{quantile="0.{q[1:]}"}} {quantiles[q]:g}' for q in ("p50", "p99")]
            lines.append(f"{full}_count {quantiles['count']:g}")
        return "\n".join(lines) + "\n"

    def _block(self, full: str, kind: str, name: str, series: dict[Labels, float]) -> list[str]:
        out = [f"# HELP {full} {self._help.get(name, name)}", f"# TYPE {full} {kind}"]
        for labels, value in sorted(series.items()):
            rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            out.append(f"{full}{{{rendered}}} {value:g}" if rendered else f"{full} {value:g}")
        return out


def quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted, non-empty ``ordered`` (nearest rank, no interpolation)."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
