"""Reading a node's ``/metrics`` text (the Prometheus format ``node.metrics`` renders)."""

from __future__ import annotations


def metric(text: str, name: str) -> dict[str, float]:
    """One Prometheus metric's samples by label set (``""`` for none) from /metrics text."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(f"chatsync_{name}"):
            series, _, value = line.rpartition(" ")
            labels = series.partition("{")[2].rstrip("}")
            samples[labels] = float(value)
    return samples
