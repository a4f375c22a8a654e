"""The gossip benchmark's report: the JSON document, batched / unbatched ratios, the floor beside
the node, the tables (the goals: ``bench.gossip_goals``; the capacity steps: ``gossip_capacity``)."""

from __future__ import annotations

import os
from importlib.metadata import version
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.gossip_capacity import print_capacity
from bench.gossip_goals import build_goals, print_goals
from bench.machine import machine_info


def build_report(
    params: dict[str, Any],
    runs: dict[str, Any],
    catchup: dict[str, Any] | None,
    load_before: list[float] | None,
    notes: list[str] | None = None,
    floor: dict[str, Any] | None = None,
    capacity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    batched = runs["batched"]
    floor_figures = _floor(params, batched, floor)
    return {
        "benchmark": "gossip",
        "params": params,
        "machine": _machine(load_before),
        "runs": runs,
        "catchup": catchup,
        "floor": floor_figures,
        "capacity": capacity,
        "ratios": _ratios(runs),
        "goals": build_goals(params, batched, floor_figures, capacity, catchup),
        "notes": notes or [],
        # the node as configured (batched), its capacity steps (each op everywhere in the end,
        # even a step that did not hold) and its catch-up; the unbatched run is a baseline that
        # may not drain in time: its own verdict is printed beside
        "all_delivered": _delivered(batched)
        and (capacity is None or capacity["all_delivered"])
        and (catchup is None or catchup["caught_up"]),
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


def cores_per_us(params: dict[str, Any]) -> float:
    """Cores that one µs per op per node takes at the offered rate on all the nodes."""
    return float(params["rate"] * params["nodes"] / 1e6)


def _floor(
    params: dict[str, Any], batched: dict[str, Any], floor: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The floor's figures beside the node's, and the cores each needs at the offered rate."""
    if floor is None:
        return None
    per_us = cores_per_us(params)
    node_us = batched["node_cpu"]["us_per_op_per_node"]
    floor_us = floor["transport_us_per_op_per_peer"] + floor["verify_us_per_op"]
    # the floor plus storing the op: the least a node that stores every op can spend on it
    stored_us = floor_us + floor["store_us_per_op"] if "store_us_per_op" in floor else None
    return {
        **floor,
        "node_us_per_op_per_node": node_us,
        "node_over_floor": node_us / floor_us if floor_us else None,
        "floor_and_store_us": stored_us,
        "floor_and_store_over_floor": stored_us / floor_us if stored_us and floor_us else None,
        "node_over_floor_and_store": node_us / stored_us if stored_us else None,
        "cores_at_rate": {
            "transport": floor["transport_us_per_op_per_peer"] * per_us,
            "verify": floor["verify_us_per_op"] * per_us,
            "transport_and_verify": floor_us * per_us,
            "node": node_us * per_us,
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
        ctable.add_row(
            "messages held per node, after catch-up",
            " / ".join(f"{count:,}" for count in catchup["node_counts"]),
        )
        ctable.add_row(
            "RSS per node at rest after catch-up, child processes included "
            "(MB; the restarted node last)",
            " / ".join(f"{mb:,.1f}" for mb in catchup["rss_mb"]),
        )
        if "catchup_peak_rss_mb" in catchup:
            ctable.add_row(
                "restarted node's peak RSS during catch-up, signature workers included (MB)",
                f"{catchup['catchup_peak_rss_mb']:,.1f}",
            )
        memory = catchup.get("memory_mb") or []
        for part in sorted({part for parts in memory for part in parts} - {"rss"}):
            ctable.add_row(
                f"  of it: {part.replace('_', ' ')} (MB)",
                " / ".join(_num(parts.get(part), ",.1f") for parts in memory),
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
        if floor.get("floor_and_store_us") is not None:
            ftable.add_row(
                f"decoding and storing an op ({floor['store_ops']:,} ops, "
                f"{floor['ops_per_message']} at a time; RocksDB's threads included)",
                _num(floor["store_us_per_op"]),
                _num(floor["store_us_per_op"] * cores_per_us(report["params"]), ".2f"),
            )
            ftable.add_row(
                f"floor + storing: the least a node storing every op spends "
                f"(x{_num(floor['floor_and_store_over_floor'], '.2f')} the floor)",
                _num(floor["floor_and_store_us"]),
                _num(floor["floor_and_store_us"] * cores_per_us(report["params"]), ".2f"),
            )
        ftable.add_row(
            f"the node, batched run (x{_num(floor['node_over_floor'], '.2f')} the floor"
            + (
                f", x{_num(floor['node_over_floor_and_store'], '.2f')} floor + storing)"
                if floor.get("node_over_floor_and_store") is not None
                else ")"
            ),
            _num(floor["node_us_per_op_per_node"]),
            _num(cores["node"], ".2f"),
        )
        console.print(ftable)
        if not floor["all_received"]:
            console.print("[yellow]note[/]: some floor peers did not get every message")

    if report["capacity"] is not None:
        print_capacity(console, report["capacity"], params["nodes"])
    print_goals(console, report["goals"])
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
    if report["capacity"] is not None:
        verdict = "[green]yes[/]" if report["capacity"]["all_delivered"] else "[red]NO[/]"
        console.print(f"capacity steps: every acknowledged op reached every node: {verdict}")
    if report["catchup"] is not None:
        caught_up = "[green]yes[/]" if report["catchup"]["caught_up"] else "[red]NO[/]"
        console.print(f"catch-up: the restarted node holds every message: {caught_up}")
