"""Capacity for ``chatsync bench gossip``: the highest offered rate the nodes carry with p99 < 1 s.

The policy, apart from how one step is measured (the caller's ``measure(rate)``: a load of
``seconds`` at ``rate`` ops/s, then the wait for every op on every node, then the figures):

- rates step up from ``start`` by ``step`` (1,000, 1,500, 2,000, ...) up to ``max_rate``;
- a step *holds* when every offered op was acknowledged, every op reached every node within
  the step's drain timeout, and the latency POST -> last node has p99 < ``p99_limit_ms``;
- the first step that does not hold ends the stepping: a rate above one that fails is not
  tried (a backlog would only grow), and the one below it is the capacity; when the first
  step already fails, the rate steps down by ``step`` instead until one holds;
- ops/s per core at that rate: the acknowledged ops over the node CPU seconds they cost (all
  nodes, from the first POST until the last node stored the last op), i.e. the offered rate
  divided by the node cores busy carrying it.

The steps run on the batched run's cluster, one after another, the store growing by each
step's ops (tens of thousands on top of the batched run's): the nodes are already meshed and
hold every author's add, a fresh cluster per step would spend more time starting than
measuring, and a node in service holds what it was sent before. A step that fails leaves a
backlog; the caller waits for it to drain before anything else runs on the cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console
from rich.table import Table


@dataclass(frozen=True)
class CapacityParams:
    start: int = 1000  # ops/s offered at the first step
    step: int = 500  # added at each step
    max_rate: int = 10_000  # the last step at most
    seconds: float = 6.0  # load per step (shorter than the batched run's)
    drain_timeout_s: float = 30.0  # a step whose ops are not everywhere by then does not hold
    p99_limit_ms: float = 1000.0

    def rates(self) -> Iterator[int]:
        rate = self.start
        while rate <= self.max_rate:
            yield rate
            rate += self.step


def summarize_step(rate: int, run: dict[str, Any], p99_limit_ms: float) -> dict[str, Any]:
    """One row of the capacity table from a load run's figures, and whether the step holds."""
    latency = run["latency_ms"]["end_to_end"]
    cpu = run["node_cpu"]
    acknowledged = run["acknowledged_ops"]
    why = None
    if acknowledged < run["offered_ops"]:
        why = f"{run['offered_ops'] - acknowledged:,} ops not acknowledged"
    elif not run["all_on_every_node"]:
        why = "not every op on every node within the step's drain timeout"
    elif latency["p99"] is None or latency["p99"] >= p99_limit_ms:
        why = f"p99 >= {p99_limit_ms:,.0f} ms"
    return {
        "rate": rate,
        "offered_ops": run["offered_ops"],
        "acknowledged_ops": acknowledged,
        "delivered_ops_s": run["delivered_ops_s"],
        "p50_ms": latency["p50"],
        "p99_ms": latency["p99"],
        "max_ms": latency["max"],
        "all_on_every_node": run["all_on_every_node"],
        "drain_s": run["drain_s"],
        # a step that did not drain in time: did its ops reach every node afterwards?
        "on_every_node_in_the_end": run.get("on_every_node_in_the_end", run["all_on_every_node"]),
        "cores": cpu["cores_until_drained"],
        "ops_s_per_core": acknowledged / cpu["until_drained_s"] if cpu["until_drained_s"] else None,
        "holds": why is None,
        "why_not": why,
    }


def run_capacity(
    console: Console, params: CapacityParams, measure: Callable[[int], dict[str, Any]]
) -> dict[str, Any]:
    """Step the rate up until a step does not hold (down, if the first does not); the steps and
    the highest rate that held."""
    steps: list[dict[str, Any]] = []

    def held(rate: int) -> bool:
        console.print(f"[bold]capacity[/]: {rate:,} ops/s for {params.seconds:g} s")
        step = summarize_step(rate, measure(rate), params.p99_limit_ms)
        steps.append(step)
        verdict = "holds" if step["holds"] else f"does not hold: {step['why_not']}"
        console.print(f"  p99 {_ms(step['p99_ms'])} ms, {step['cores']:.2f} node cores: {verdict}")
        return bool(step["holds"])

    stopped_by = "max_rate"
    for rate in params.rates():
        if not held(rate):
            stopped_by = steps[-1]["why_not"]
            break
    if steps and not steps[0]["holds"]:  # below the first rate: step down until one holds
        rate = params.start - params.step
        while rate > 0 and not held(rate):
            rate -= params.step
    holding = [s for s in steps if s["holds"]]
    best = max(holding, key=lambda s: s["rate"]) if holding else None
    return {
        "params": asdict(params),
        "steps": steps,
        "rate": best["rate"] if best else None,
        "cores": best["cores"] if best else None,
        "ops_s_per_core": best["ops_s_per_core"] if best else None,
        "all_delivered": all(s["on_every_node_in_the_end"] for s in steps),
        "stopped_by": stopped_by,
    }


# --- printing ------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "∞" if value is None else f"{value:,.0f}"


def capacity_result(capacity: dict[str, Any]) -> str:
    """One line: the highest rate that held, and ops/s per core there."""
    params = capacity["params"]
    if capacity["rate"] is None:
        lowest = min(step["rate"] for step in capacity["steps"])
        return f"capacity: below {lowest:,} ops/s (no step held: {capacity['stopped_by']})"
    return (
        f"capacity: {capacity['rate']:,} ops/s with p99 < {params['p99_limit_ms']:,.0f} ms; "
        f"the nodes kept {capacity['cores']:.2f} cores busy (first POST -> last op stored "
        f"everywhere): {capacity['ops_s_per_core']:,.0f} ops/s per core (ops per node CPU second)"
    )


def print_capacity(console: Console, capacity: dict[str, Any], nodes: int) -> None:
    params = capacity["params"]
    table = Table(
        title=f"capacity: {nodes} nodes, {params['seconds']:g} s per rate, stepping by "
        f"{params['step']:,} ops/s until p99 >= {params['p99_limit_ms']:,.0f} ms"
    )
    for column in ("offered ops/s", "delivered/s", "p50 ms", "p99 ms", "max ms", "node cores"):
        table.add_column(column, justify="right")
    table.add_column("")
    for step in capacity["steps"]:
        table.add_row(
            f"{step['rate']:,}",
            f"{step['delivered_ops_s']:,.0f}",
            _ms(step["p50_ms"]),
            _ms(step["p99_ms"]),
            _ms(step["max_ms"]),
            f"{step['cores']:.2f}",
            "[green]holds[/]" if step["holds"] else f"[red]{step['why_not']}[/]",
        )
    console.print(table)
    console.print(capacity_result(capacity))
