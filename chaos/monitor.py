"""The divergence monitor: every ``interval_s``, each node's record count per domain and its
roots (``/status``), for the timeline plot and the quiescence wait."""

from __future__ import annotations

import threading
import time

from chaos.history import History, Sample
from chaos.nodes import ChaosNodes


def sample(nodes: ChaosNodes, t0: float) -> Sample:
    counts: list[dict[str, int] | None] = []
    roots: list[str | None] = []
    for i in range(nodes.count):
        status = nodes.status(i)
        if status is None:
            counts.append(None)
            roots.append(None)
            continue
        domains = status["domains"]
        counts.append({name: int(d["count"]) for name, d in domains.items()})
        roots.append("/".join(f"{name}={d['root']}" for name, d in sorted(domains.items())))
    return Sample(time.monotonic() - t0, counts, roots)


def divergence(s: Sample) -> int:
    """Records the most behind answering node lacks against the most ahead, summed over
    domains (0: every answering node has as many of each)."""
    answering = [c for c in s.counts if c is not None]
    if len(answering) < 2:
        return 0
    return sum(max(c[d] for c in answering) - min(c[d] for c in answering) for d in answering[0])


def monitor(
    nodes: ChaosNodes, history: History, t0: float, stop: threading.Event, interval_s: float = 1.0
) -> None:
    while not stop.is_set():
        history.add_sample(sample(nodes, t0))
        stop.wait(interval_s)


def wait_quiet(nodes: ChaosNodes, t0: float, timeout_s: float, settle: int = 3) -> bool:
    """Wait until every node answers with the same roots ``settle`` polls in a row."""
    deadline = time.monotonic() + timeout_s
    same = 0
    while time.monotonic() < deadline:
        roots = sample(nodes, t0).roots
        same = same + 1 if None not in roots and len(set(roots)) == 1 else 0
        if same >= settle:
            return True
        time.sleep(1.0)
    return False
