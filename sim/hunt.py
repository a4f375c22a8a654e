"""Checker strength: how many seeds until the check catches each planted bug.

For each bug, seeds 1, 2, ... each generate a small trace with every fault kind
(with the bug, if it is one of the generator's; a scoped one, ``SCOPED_SMALL``, for a bug of
partial replication) and replay it with the bug planted; the first failing check stops the search.
``chatsync sim bugs`` prints the table; ``tests/sim/test_spark_run.py``
asserts every bug is caught within the budget.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from sim.bugs import GENERATOR_BUGS, SCOPE_BUGS, Bug
from sim.generate import GenParams, generate
from sim.runner import run_simulation

# Small and edgy: every fault kind, and a third of member and identity ops with a twin at the
# same stamp, so a tie-break bug has ties to break.
SMALL: dict[str, Any] = {
    "nodes": 5,
    "users": 24,
    "chats": 3,
    "ops": 300,
    "duration_s": 120.0,
    "anti_entropy_ms": 5_000,
    "tie_rate": 0.3,
}

# Partial replication's bugs (``SCOPE_BUGS``) on scoped traces: more chats over 64 shards, each
# pinned on 2 of 10 nodes, so that scopes differ and grow and shrink (``sim.scopes``).
SCOPED_SMALL: dict[str, Any] = {
    **SMALL,
    "nodes": 10,
    "users": 40,
    "chats": 12,
    "scope_shards": 64,
    "replication": 2,
}


@dataclass
class Hunt:
    bug: str
    caught_at: int | None  # the seed whose check failed, or None within the budget
    seeds_tried: int
    why: str  # what the check saw


def small_trace(seed: int, out: Path, **overrides: Any) -> Path:
    generate(GenParams(seed=seed, **{**SMALL, **overrides}), out)
    return out


def why_failed(result: dict[str, object]) -> str:
    check = result["check"]
    assert isinstance(check, dict)
    parts = [f"{k} {v}" for k, v in check.items() if v]
    domains = result["domains"]
    assert isinstance(domains, dict)
    parts += [
        f"{name}: {d['distinct_roots']} root(s), not the oracle's"
        for name, d in domains.items()
        if not d["equals_oracle"]
    ]
    return ", ".join(parts) or "?"


def hunt(
    spark: SparkSession,
    bug: Bug,
    *,
    max_seeds: int = 200,
    shards: int = 2,
    workdir: Path | None = None,
    on_seed: Callable[[Bug, int], None] | None = None,
) -> Hunt:
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for seed in range(1, max_seeds + 1):
            if on_seed is not None:
                on_seed(bug, seed)
            # a bug of the generator's clients is in the trace; the nodes' bugs in the replay
            made = {"plant": bug.value} if bug in GENERATOR_BUGS else {}
            if bug in SCOPE_BUGS:
                made = SCOPED_SMALL
            trace = small_trace(seed, Path(tmp) / f"seed-{seed}.parquet", **made)
            outcome = run_simulation(spark, trace, shards=shards, plant=bug.value)
            if not outcome.ok:
                return Hunt(bug.value, seed, seed, why_failed(outcome.result))
    return Hunt(bug.value, None, max_seeds, "not caught")
