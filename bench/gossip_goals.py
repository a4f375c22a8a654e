"""Issue 18's goals ("a node at the floor") for ``chatsync bench gossip``, and issue 4's rate and p99.

Each goal is one figure of one run against its target: ``{"id", "goal", "target", "limit",
"unit", "measured", "met", "note"}``. ``met`` is True or False when the run measured the goal
under its conditions, and None when it did not (``note`` says why): the latency and delivery
goals hold at 2,000 ops/s over 5 nodes, the catch-up and memory goals at 1,000,000 messages,
the CPU goal needs the floor run, capacity the stepping. The measured value is still given
where there is one. A latency of None is an op some node logged no arrival for: measured,
infinite, missed.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

GOAL_RATE = 2000  # ops/s offered, all of GOAL_NODES nodes together
GOAL_NODES = 5
CPU_OVER_FLOOR_MAX = 1.25
VIA_GOSSIP_MIN_PCT = 99.0
P50_MAX_MS = 200.0
MAX_MAX_MS = 600.0
P99_MAX_MS = 1000.0  # issue 4
CATCHUP_MESSAGES = 1_000_000
CATCHUP_MAX_S = 60.0
RSS_MAX_MB = 300.0


def _goal(
    id_: str,
    label: str,
    target: str,
    limit: float,
    unit: str,
    measured: float | None,
    met: bool | None,
    note: str | None = None,
) -> dict[str, Any]:
    return {
        "id": id_,
        "goal": label,
        "target": target,
        "limit": limit,
        "unit": unit,
        "measured": measured,
        "met": met,
        "note": note,
    }


def build_goals(
    params: dict[str, Any],
    batched: dict[str, Any],
    floor: dict[str, Any] | None,
    capacity: dict[str, Any] | None,
    catchup: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """Every goal of issue 18 (and issue 4's rate and p99), measured or not, in print order."""
    return [
        _cpu_goal(floor),
        *_load_goals(params, batched),
        _capacity_goal(params, capacity),
        *_catchup_goals(catchup),
    ]


def _cpu_goal(floor: dict[str, Any] | None) -> dict[str, Any]:
    ratio = floor["node_over_floor"] if floor is not None else None
    return _goal(
        "cpu_over_floor",
        "node CPU per op per node / the floor (same run)",
        f"<= {CPU_OVER_FLOOR_MAX:.2f}x",
        CPU_OVER_FLOOR_MAX,
        "x",
        ratio,
        None if ratio is None else ratio <= CPU_OVER_FLOOR_MAX,
        "floor not run (--no-floor)" if floor is None else None,
    )


def _load_goals(params: dict[str, Any], batched: dict[str, Any]) -> list[dict[str, Any]]:
    """The goals of the batched run at 2,000 ops/s x 5 nodes: judged only at that load."""
    at_goal = params["rate"] == GOAL_RATE and params["nodes"] == GOAL_NODES
    note = None if at_goal else f"run at {params['rate']:,} ops/s x {params['nodes']} nodes"

    def judged(ok: bool) -> bool | None:
        return ok if at_goal else None

    latency = batched["latency_ms"]["end_to_end"]
    remote = batched["remote_deliveries"]
    gossip_pct = 100 * batched["via_gossip"] / remote if remote else None
    where = f"at {GOAL_RATE:,} ops/s, POST -> all {GOAL_NODES} nodes"

    def latency_goal(q: str, limit: float, source: str = "") -> dict[str, Any]:
        value = latency[q]
        return _goal(
            f"latency_{q}",
            f"latency {q} {where}{source}",
            f"< {limit:,.0f} ms",
            limit,
            "ms",
            value,
            judged(value is not None and value < limit),
            note or ("an op some node logged no arrival for: infinite" if value is None else None),
        )

    delivered = batched["delivered_ops_s"]
    return [
        _goal(
            "via_gossip",
            f"remote deliveries by gossip at {GOAL_RATE:,} ops/s",
            f">= {VIA_GOSSIP_MIN_PCT:g} %",
            VIA_GOSSIP_MIN_PCT,
            "%",
            gossip_pct,
            judged(gossip_pct is not None and gossip_pct >= VIA_GOSSIP_MIN_PCT),
            note,
        ),
        latency_goal("p50", P50_MAX_MS),
        latency_goal("max", MAX_MAX_MS),
        latency_goal("p99", P99_MAX_MS, " (issue 4)"),
        _goal(
            "delivered_ops_s",
            f"ops/s reaching all {GOAL_NODES} nodes, {GOAL_RATE:,} offered (issue 4)",
            f">= {GOAL_RATE:,}",
            GOAL_RATE,
            "ops/s",
            delivered,
            judged(delivered >= GOAL_RATE and batched["all_on_every_node"]),
            note,
        ),
    ]


def _capacity_goal(params: dict[str, Any], capacity: dict[str, Any] | None) -> dict[str, Any]:
    label = f"capacity: highest offered rate with p99 < {P99_MAX_MS:,.0f} ms"
    target = f">= {GOAL_RATE:,} ops/s"
    if capacity is None:
        return _goal("capacity", label, target, GOAL_RATE, "ops/s", None, None,
                     "not run (--no-capacity)")  # fmt: skip
    rate = capacity["rate"]
    if rate is None:
        lowest = min(step["rate"] for step in capacity["steps"])
        note = f"below {lowest:,} ops/s: no step held"
    else:
        note = f"{capacity['ops_s_per_core']:,.0f} ops/s per core"
    if params["nodes"] != GOAL_NODES:
        note = f"run with {params['nodes']} nodes; {note}"
    goal = _goal(
        "capacity",
        label,
        target,
        GOAL_RATE,
        "ops/s",
        rate,
        (rate is not None and rate >= GOAL_RATE) if params["nodes"] == GOAL_NODES else None,
        note,
    )
    goal["ops_s_per_core"] = capacity["ops_s_per_core"]
    goal["cores"] = capacity["cores"]
    return goal


def _catchup_goals(catchup: dict[str, Any] | None) -> list[dict[str, Any]]:
    catchup_label = f"catch-up of {CATCHUP_MESSAGES:,} missed messages"
    rss_label = f"RSS of a node holding {CATCHUP_MESSAGES:,} messages (the max of those)"
    catchup_target = f"< {CATCHUP_MAX_S:,.0f} s"
    rss_target = f"<= {RSS_MAX_MB:,.0f} MB"
    if catchup is None:
        skipped = "catch-up not run (--catchup 0)"
        return [
            _goal("catchup_s", catchup_label, catchup_target, CATCHUP_MAX_S, "s", None, None,
                  skipped),
            _goal("rss_mb", rss_label, rss_target, RSS_MAX_MB, "MB", None, None, skipped),
        ]  # fmt: skip
    at_goal = catchup["missed"] >= CATCHUP_MESSAGES
    short = None if at_goal else f"not measured at 1M: run with {catchup['missed']:,}"
    seconds = catchup["catchup_s"]
    # the nodes that hold every message (the restarted one only once it caught up)
    holding = [
        mb
        for mb, count in zip(catchup["rss_mb"], catchup["node_counts"], strict=True)
        if count >= catchup["expected_count"]
    ]
    rss = max(holding) if holding else None
    return [
        _goal(
            "catchup_s",
            catchup_label,
            catchup_target,
            CATCHUP_MAX_S,
            "s",
            seconds,
            (seconds is not None and seconds < CATCHUP_MAX_S) if at_goal else None,
            short or (None if seconds is not None else "did not catch up within the timeout"),
        ),
        _goal(
            "rss_mb",
            rss_label,
            rss_target,
            RSS_MAX_MB,
            "MB",
            rss,
            (rss is not None and rss <= RSS_MAX_MB) if at_goal else None,
            short,
        ),
    ]


# --- printing ------------------------------------------------------------------------------


def shown(value: float | None, unit: str) -> str:
    """A measured value with its unit for the goals table."""
    if value is None:
        return "∞" if unit == "ms" else "–"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "%":
        return f"{value:.1f} %"
    if unit in ("ms", "ops/s"):
        return f"{value:,.0f}" + (" ms" if unit == "ms" else "")
    return f"{value:,.1f} {unit}"


def verdict(goal: dict[str, Any]) -> str:
    if goal["met"] is None:
        return f"[yellow]not judged[/] ({goal['note']})"
    text = "[green]met[/]" if goal["met"] else "[red]missed[/]"
    return f"{text} ({goal['note']})" if goal["note"] else text


def print_goals(console: Console, goals: list[dict[str, Any]]) -> None:
    table = Table(title="goals (issue 18; issue 4's rate and p99)")
    table.add_column("goal")
    table.add_column("target", justify="right")
    table.add_column("measured", justify="right")
    table.add_column("")
    for goal in goals:
        table.add_row(goal["goal"], goal["target"], shown(goal["measured"], goal["unit"]),
                      verdict(goal))  # fmt: skip
    console.print(table)
