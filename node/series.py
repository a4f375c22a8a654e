"""A node's recent figures, one sample a second for ten minutes: what the web view charts.

A sample holds running totals (ops written, ops in by gossip, sync and the API, ops
published) — the page turns consecutive samples into rates, so a missed sample loses no
op — and point values: resident memory, connected peers, and the gossip lag (now minus an
op's HLC time) of the ops that arrived since the sample before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from node.metrics import Metrics, quantile

SAMPLE_INTERVAL_S = 1.0
SAMPLES = 600  # ten minutes

# sample field -> the Metrics counter it totals
COUNTERS = {
    "gossip_in": "gossip_ops_received",
    "gossip_out": "gossip_ops_published",
    "sync_in": "sync_records_applied",
    "api_in": "ops_submitted",
}

Sample = dict[str, float | None]


class Series:
    """The newest ``capacity`` samples, oldest first."""

    def __init__(self, capacity: int = SAMPLES) -> None:
        self._samples: deque[Sample] = deque(maxlen=capacity)

    def add(self, sample: Sample) -> None:
        self._samples.append(sample)

    def since(self, t_ms: int = 0) -> list[Sample]:
        """The samples taken after ``t_ms`` (a page polling asks for what it lacks)."""
        return [s for s in self._samples if (s["t"] or 0) > t_ms]


class Sampler:
    """Takes samples from ``metrics`` plus the node's own point values (``read``)."""

    def __init__(self, metrics: Metrics, read: Callable[[], dict[str, float]]) -> None:
        self.metrics = metrics
        self.read = read
        self._latencies_seen = metrics.latencies_observed

    def take(self, now_ms: int) -> Sample:
        sample: Sample = {"t": now_ms}
        for field, counter in COUNTERS.items():
            sample[field] = self.metrics.total(counter)
        observed = self.metrics.latencies_observed
        lags = sorted(self.metrics.newest_latencies(observed - self._latencies_seen))
        self._latencies_seen = observed
        sample["lag_p50"] = quantile(lags, 0.5) if lags else None
        sample["lag_p99"] = quantile(lags, 0.99) if lags else None
        sample.update(self.read())
        return sample
