"""The gossip benchmark's report: goals met or missed, batched / unbatched ratios, the tables."""

from __future__ import annotations

import os
from importlib.metadata import version
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.machine import machine_info

RATE_GOAL = 2000.0  # ops/s reaching all of 5 nodes
P99_GOAL_MS = 1000.0
CATCHUP_GOAL_S = 30.0  # issue 4: 100,000 missed messages
CATCHUP_1M_GOAL_S = 60.0  # issue 18: 1,000,000


def catchup_goal_s(missed: int) -> float:
    """The catch-up goal for ``missed`` messages: issue 4's up to 100,000, then issue 18's
    60 s per 1,000,000."""
    return CATCHUP_GOAL_S if missed <= 100_000 else CATCHUP_1M_GOAL_S * missed / 1_000_000


MAELSTROM_P50_MS = 400.0  # Maelstrom broadcast challenge (25 nodes): median < 400 ms
MAELSTROM_MAX_MS = 600.0  # and max < 600 ms


def build_report(
    params: dict[str, Any],
    runs: dict[str, Any],
    catchup: dict[str, Any] | None,
    load_before: list[float] | None,
    notes: list[str] | None = None,
    floor: dict[str, Any] | None = None,
) -> dict[str, Any]:
    batched = runs["batched"]
    return {
        "benchmark": "gossip",
        "params": params,
        "machine": _machine(load_before),
        "runs": runs,
        "catchup": catchup,
        "floor": _floor(params, batched, floor),
        "ratios": _ratios(runs),
        "goals": _goals(params, batched, catchup),
        "notes": notes or [],
        # the node as configured (batched) and its catch-up; the unbatched run is a baseline
        # that may not drain in time: its own verdict is printed beside
        "all_delivered": _delivered(batched) and (catchup is None or catchup["caught_up"]),
    }


def _delivered(run: dict[str, Any]) -> bool:
    return bool(run["all_on_every_node"] and run["converged"])


def _lat(run: dict[str, Any], kind: str, q: str) -> float | None:
    value: float | None = run["latency_ms"][kind][q]
    return value


def _ratios(runs: dict[str, Any]) -> dict[str, float | None]:
    if "unbatched" not in runs:
        return {}
    b, u = runs["batched"], runs["unbatched"]

    def ratio(x: float | None, y: float | None) -> float | None:
        return x / y if x is not None and y else None

    return {
        "delivered_ops_s": ratio(b["delivered_ops_s"], u["delivered_ops_s"]),
        "posted_ops_s": ratio(b["posted_ops_s"], u["posted_ops_s"]),
        "first_post_to_all_s_unbatched_over_batched": ratio(
            u["first_post_to_all_s"], b["first_post_to_all_s"]
        ),
        "p50_unbatched_over_batched": ratio(
            _lat(u, "end_to_end", "p50"), _lat(b, "end_to_end", "p50")
        ),
        "p99_unbatched_over_batched": ratio(
            _lat(u, "end_to_end", "p99"), _lat(b, "end_to_end", "p99")
        ),
        "cpu_per_op_unbatched_over_batched": ratio(
            u["node_cpu"]["us_per_op_per_node"], b["node_cpu"]["us_per_op_per_node"]
        ),
    }


def _goals(
    params: dict[str, Any], batched: dict[str, Any], catchup: dict[str, Any] | None
) -> list[dict[str, Any]]:
    p50 = _lat(batched, "end_to_end", "p50")
    p99 = _lat(batched, "end_to_end", "p99")
    top = _lat(batched, "end_to_end", "max")
    goals = [
        {
            "goal": f"ops/s reaching all {params['nodes']} nodes",
            "target": f">= {RATE_GOAL:,.0f}",
            "measured": batched["delivered_ops_s"],
            "met": batched["delivered_ops_s"] >= RATE_GOAL and batched["all_on_every_node"],
        },
        {
            "goal": "latency to all nodes p99 (end to end)",
            "target": f"< {P99_GOAL_MS:,.0f} ms",
            "measured": p99,
            "met": p99 is not None and p99 < P99_GOAL_MS,
        },
        {
            "goal": "reference: Maelstrom median (25 nodes)",
            "target": f"< {MAELSTROM_P50_MS:,.0f} ms",
            "measured": p50,
            "met": p50 is not None and p50 < MAELSTROM_P50_MS,
        },
        {
            "goal": "reference: Maelstrom max (25 nodes)",
            "target": f"< {MAELSTROM_MAX_MS:,.0f} ms",
            "measured": top,
            "met": top is not None and top < MAELSTROM_MAX_MS,
        },
    ]
    if catchup is not None:
        goal_s = catchup_goal_s(catchup["missed"])
        goals.append(
            {
                "goal": f"catch-up of {catchup['missed']:,} missed messages",
                "target": f"< {goal_s:,.0f} s",
                "measured": catchup["catchup_s"],
                "met": catchup["catchup_s"] is not None and catchup["catchup_s"] < goal_s,
            }
        )
    return goals


def _floor(
    params: dict[str, Any], batched: dict[str, Any], floor: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The floor's figures beside the node's, and the cores each needs at the offered rate."""
    if floor is None:
        return None
    cores_per_us = params["rate"] * params["nodes"] / 1e6  # µs per op per node -> cores
    node_us = batched["node_cpu"]["us_per_op_per_node"]
    floor_us = floor["transport_us_per_op_per_peer"] + floor["verify_us_per_op"]
    return {
        **floor,
        "node_us_per_op_per_node": node_us,
        "node_over_floor": node_us / floor_us if floor_us else None,
        "cores_at_rate": {
            "transport": floor["transport_us_per_op_per_peer"] * cores_per_us,
            "verify": floor["verify_us_per_op"] * cores_per_us,
            "transport_and_verify": floor_us * cores_per_us,
            "node": node_us * cores_per_us,
        },
        "cores_available": os.cpu_count(),
    }


def _machine(load_before: list[float] | None) -> dict[str, Any]:
    return machine_info(load_before, libp2p=version("libp2p"))


# --- printing ------------------------------------------------------------------------------


def _ms(value: float | None, count: int = 1) -> str:
    if count == 0:
        return "–"
    return "∞ (no arrival logged)" if value is None else f"{value:,.0f}"


def _num(value: float | None, fmt: str = ",.0f", unit: str = "") -> str:
    return "–" if value is None else f"{value:{fmt}}{unit}"


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def print_report(console: Console, report: dict[str, Any]) -> None:
    params, runs = report["params"], report["runs"]
    names = list(runs)
    table = Table(
        title=(
            f"gossip: {params['nodes']} node processes, {params['rate']:,} ops/s offered for "
            f"{params['seconds']:g} s, {params['payload']} B payloads "
            f"({report['machine']['cpu_count']} cores, shared by nodes and load generator)"
        )
    )
    table.add_column("figure")
    for name in names:
        table.add_column(name, justify="right")
    if "unbatched" in runs:
        table.add_column("batched / unbatched", justify="right")
    ratios = report["ratios"]

    def row(label: str, values: list[str], ratio: str = "") -> None:
        table.add_row(label, *values, *([ratio] if "unbatched" in runs else []))

    row("offered (ops/s)", [_num(r["offered_ops_s"]) for r in runs.values()])
    row(
        "acknowledged by the origins (ops/s)",
        [_num(r["posted_ops_s"]) for r in runs.values()],
        _ratio(ratios.get("posted_ops_s")),
    )
    row(
        f"delivered to all {params['nodes']} nodes (ops/s, sustained)",
        [_num(r["delivered_ops_s"]) for r in runs.values()],
        _ratio(ratios.get("delivered_ops_s")),
    )
    row(
        "every op on every node, after load end (s)",
        [_num(r["drain_s"], ".2f") if r["all_on_every_node"] else "NO" for r in runs.values()],
    )
    for kind, label in (
        ("end_to_end", "latency POST -> all nodes"),
        ("propagation", "latency origin ack -> all nodes"),
        ("origin_ack", "origin ack (POST -> 201)"),
    ):
        for q in ("p50", "p99", "max"):
            ratio = ""
            if kind == "end_to_end" and q in ("p50", "p99"):
                ratio = _ratio(ratios.get(f"{q}_unbatched_over_batched"))
                ratio = f"unbatched {ratio}" if ratio != "–" else ratio
            row(
                f"{label} {q} (ms)",
                [
                    _ms(r["latency_ms"][kind][q], r["latency_ms"][kind]["count"])
                    for r in runs.values()
                ],
                ratio,
            )
    row(
        "ops some node got only by anti-entropy",
        [_num(r["latency_ms"]["not_by_gossip"]) for r in runs.values()],
    )
    row(
        "remote deliveries: via gossip / via anti-entropy",
        [f"{r['via_gossip']:,.0f} / {r['via_sync']:,.0f}" for r in runs.values()],
    )
    row(
        "gossip messages published (ops per message)",
        [
            f"{r['gossip_messages_published']:,.0f} ({r['ops_per_gossip_message']:.1f})"
            for r in runs.values()
        ],
    )
    row(
        "node CPU during load (cores busy)",
        [_num(r["node_cpu"]["load_cores"], ".2f") for r in runs.values()],
    )
    row(
        "other processes on the machine during load (cores busy)",
        [_num(r["node_cpu"]["other_processes_cores_during_load"], ".2f") for r in runs.values()],
    )
    row(
        "node CPU per op per node, until drained (µs)",
        [_num(r["node_cpu"]["us_per_op_per_node"]) for r in runs.values()],
        (f"unbatched {_ratio(ratios.get('cpu_per_op_unbatched_over_batched'))}" if ratios else ""),
    )
    row(
        "generator: POSTs / 503 busy / late ticks",
        [
            f"{r['generator']['posts']:,} / {r['generator']['busy']:,} / "
            f"{r['generator']['late_ticks']:,}"
            for r in runs.values()
        ],
    )
    console.print(table)

    catchup = report["catchup"]
    if catchup is not None:
        ctable = Table(title=f"catch-up: node {catchup['node']} restarted after missing messages")
        ctable.add_column("figure")
        ctable.add_column("value", justify="right")
        ctable.add_row("messages missed", f"{catchup['missed']:,}")
        ctable.add_row(
            "bulk ingest on the other nodes (ops/s, not timed in catch-up)",
            _num(catchup["ingest_ops_s"]),
        )
        ctable.add_row("restart -> HTTP ready (s)", _num(catchup["ready_s"], ".2f"))
        ctable.add_row("restart -> messages root equal (s)", _num(catchup["catchup_s"], ".2f"))
        ctable.add_row(
            "records applied by anti-entropy / by gossip",
            f"{catchup['sync_records_applied']:,.0f} / {catchup['gossip_ops_applied']:,.0f}",
        )
        console.print(ctable)

    floor = report.get("floor")
    if floor is not None:
        cores = floor["cores_at_rate"]
        goal = f"{report['params']['rate']:,} ops/s x {report['params']['nodes']} nodes"
        ftable = Table(
            title=f"floor: per op per node, and cores needed at {goal} "
            f"({floor['cores_available']} cores here)"
        )
        ftable.add_column("what")
        ftable.add_column("µs per op per node", justify="right")
        ftable.add_column(f"cores at {goal}", justify="right")
        ftable.add_row(
            f"py-libp2p alone ({floor['ops_per_message']} ops, "
            f"{floor['message_bytes']:,} B per message)",
            _num(floor["transport_us_per_op_per_peer"]),
            _num(cores["transport"], ".2f"),
        )
        ftable.add_row(
            "ed25519 check of an op (validate_op)",
            _num(floor["verify_us_per_op"]),
            _num(cores["verify"], ".2f"),
        )
        ftable.add_row(
            "both: a lower bound for any node on this stack",
            _num(floor["transport_us_per_op_per_peer"] + floor["verify_us_per_op"]),
            _num(cores["transport_and_verify"], ".2f"),
        )
        ftable.add_row(
            f"the node, batched run (x{_num(floor['node_over_floor'], '.2f')} the floor)",
            _num(floor["node_us_per_op_per_node"]),
            _num(cores["node"], ".2f"),
        )
        console.print(ftable)
        if not floor["all_received"]:
            console.print("[yellow]note[/]: some floor peers did not get every message")

    goals = Table(title="goals (issue 4 item 9)")
    goals.add_column("goal")
    goals.add_column("target", justify="right")
    goals.add_column("measured", justify="right")
    goals.add_column("", justify="center")
    for goal in report["goals"]:
        measured = goal["measured"]
        shown = (
            "–"
            if measured is None
            else f"{measured:,.1f}"
            if measured < 100
            else f"{measured:,.0f}"
        )
        goals.add_row(
            goal["goal"],
            goal["target"],
            shown,
            "[green]met[/]" if goal["met"] else "[red]missed[/]",
        )
    console.print(goals)
    for note in report["notes"]:
        console.print(f"[yellow]note[/]: {note}")
    for name, run in report["runs"].items():
        if _delivered(run):
            verdict = "[green]yes[/]"
        else:
            slowest = min(run["counts"])
            verdict = (
                f"[red]NO[/] (the slowest node held {slowest:,} of {run['expected_count']:,} "
                f"messages after the {report['params']['drain_timeout_s']:g} s drain)"
            )
        console.print(f"{name}: every acknowledged op reached every node: {verdict}")
    if report["catchup"] is not None:
        caught_up = "[green]yes[/]" if report["catchup"]["caught_up"] else "[red]NO[/]"
        console.print(f"catch-up: the restarted node holds every message: {caught_up}")
