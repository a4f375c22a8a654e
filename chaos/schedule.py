"""The nemesis schedule: which fault hits which node when, drawn from a seed (pure).

A schedule is a list of ``Fault`` windows — a start, an end, a kind and its victims — made
by ``make_schedule(seed, ...)``: the same seed and parameters give the same schedule, so a
run printed with its seed can be repeated. Kinds:

* ``kill``: kill -9 the node at the start, restart it at the end;
* ``pause``: SIGSTOP at the start, SIGCONT at the end;
* ``partition``: the admin switch both ways between ``group`` and the other nodes;
* ``partition-oneway``: only the nodes of ``group`` block the others (the others do not);
* ``skew``: restart the node with ``clock_offset_ms`` within the drift limit, back to 0 at
  the end; ``skew-far``: the same, beyond the limit (the node refuses what is "ahead");
* ``disk``: fill the node's data disk until it refuses writes (``min_free_disk_mb``), free it.

Process faults (kill, pause, skews, disk) never overlap on one node, and at most
``(nodes - 1) // 2`` of them run at once (at least one); one partition at a time. Windows
of different kinds overlap freely otherwise, so a node may be killed while cut off.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

KILL, PAUSE, PARTITION, ONEWAY = "kill", "pause", "partition", "partition-oneway"
SKEW, SKEW_FAR, DISK = "skew", "skew-far", "disk"
KINDS = (KILL, PAUSE, PARTITION, ONEWAY, SKEW, SKEW_FAR, DISK)
PROCESS_KINDS = frozenset({KILL, PAUSE, SKEW, SKEW_FAR, DISK})
PARTITION_KINDS = frozenset({PARTITION, ONEWAY})


@dataclass(frozen=True)
class Fault:
    start_s: float  # seconds after the workload started
    end_s: float
    kind: str
    node: int  # the victim; a partition's first node of ``group``
    group: tuple[int, ...] = ()  # partitions: one side (the other side: every other node)
    offset_ms: int = 0  # skews

    def describe(self) -> str:
        what = f"{self.kind} node {self.node}"
        if self.kind in PARTITION_KINDS:
            what = f"{self.kind} {list(self.group)} | rest"
        elif self.offset_ms:
            what += f" offset {self.offset_ms:+d} ms"
        return f"{self.start_s:6.1f}-{self.end_s:6.1f} s  {what}"


@dataclass(frozen=True)
class ScheduleParams:
    seed: int
    nodes: int
    duration_s: float
    kinds: tuple[str, ...] = KINDS
    warmup_s: float = 5.0  # no fault before this
    min_fault_s: float = 3.0
    max_fault_s: float = 12.0
    min_gap_s: float = 1.0  # between two faults' starts
    max_gap_s: float = 6.0
    max_offset_ms: int = 120_000  # the nodes' drift limit
    extra: dict[str, Any] = field(default_factory=dict)


def check_kinds(kinds: tuple[str, ...]) -> None:
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise ValueError(f"nemesis kinds: {unknown or 'none'} not among {', '.join(KINDS)}")


def make_schedule(params: ScheduleParams) -> list[Fault]:
    """The faults of a run, by start time; a function of ``params`` alone."""
    check_kinds(params.kinds)
    rng = random.Random(params.seed)
    nodes, end = params.nodes, params.duration_s
    max_process = max(1, (nodes - 1) // 2)
    busy: dict[int, float] = {}  # node -> end of its process fault
    partition_until = 0.0
    faults: list[Fault] = []
    t = params.warmup_s
    while t + params.min_fault_s <= end:
        kind = rng.choice(params.kinds)
        stop = min(end, t + rng.uniform(params.min_fault_s, params.max_fault_s))
        fault = _draw(rng, params, kind, t, stop, busy, partition_until, max_process)
        if fault is not None:
            faults.append(fault)
            if kind in PARTITION_KINDS:
                partition_until = stop
            else:
                busy[fault.node] = stop
        t += rng.uniform(params.min_gap_s, params.max_gap_s)
    return faults


def _draw(
    rng: random.Random,
    params: ScheduleParams,
    kind: str,
    start: float,
    stop: float,
    busy: dict[int, float],
    partition_until: float,
    max_process: int,
) -> Fault | None:
    nodes = params.nodes
    if kind in PARTITION_KINDS:
        if partition_until > start or nodes < 2:
            return None
        group = tuple(sorted(rng.sample(range(nodes), rng.randint(1, nodes // 2))))
        return Fault(start, stop, kind, group[0], group)
    free = [n for n in range(nodes) if busy.get(n, 0.0) <= start]
    if nodes - len(free) >= max_process or not free:
        return None
    node = rng.choice(free)
    offset = 0
    limit = params.max_offset_ms
    if kind == SKEW:
        offset = rng.choice((-1, 1)) * rng.randint(limit // 10, limit // 2)
    elif kind == SKEW_FAR:
        offset = rng.choice((-1, 1)) * rng.randint(limit * 3 // 2, limit * 3)
    return Fault(start, stop, kind, node, (node,), offset)


@dataclass(frozen=True)
class Action:
    """One step of the nemesis: a fault's start (``begin``) or its end."""

    at_s: float
    begin: bool
    fault: Fault


def actions(faults: list[Fault]) -> list[Action]:
    """Every start and end in time order (at equal times, ends first)."""
    steps = [Action(f.start_s, True, f) for f in faults] + [
        Action(f.end_s, False, f) for f in faults
    ]
    return sorted(steps, key=lambda a: (a.at_s, a.begin))


def to_json(faults: list[Fault]) -> list[dict[str, Any]]:
    return [asdict(f) for f in faults]


def from_json(items: list[dict[str, Any]]) -> list[Fault]:
    return [Fault(**{**item, "group": tuple(item["group"])}) for item in items]
