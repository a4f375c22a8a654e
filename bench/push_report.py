"""The push benchmark's report: latency summaries, polling / push ratios, the table, the CDF plot."""

from __future__ import annotations

import math
from importlib.metadata import version
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt
from rich.console import Console
from rich.table import Table

from bench.console import red_unless
from bench.machine import machine_info
from bench.quantiles import quantile

# the CDF kept in the JSON (and plotted): these quantiles of each latency distribution
CDF_QUANTILES = [
    *(q / 200 for q in range(0, 198)),  # 0 .. 0.985 by 0.005
    0.99, 0.995, 0.999, 1.0,
]  # fmt: skip


def latency_summary(values_ms: list[float], *, cdf: bool = False) -> dict[str, Any]:
    """count, p50, p99 and max (ms) of ``values_ms``; an op that never came is ``inf`` there
    and makes a quantile it reaches None ("never"). ``cdf``: also the quantiles to plot."""
    if not values_ms:
        out: dict[str, Any] = {"count": 0, "never": 0, "p50": None, "p99": None, "max": None}
        return {**out, "cdf": []} if cdf else out
    ordered = sorted(values_ms)

    def pick(q: float) -> float | None:
        v = quantile(ordered, q)
        return None if v is None else round(v, 2)

    out = {
        "count": len(ordered),
        "never": sum(1 for v in ordered if math.isinf(v)),
        "p50": pick(0.5),
        "p99": pick(0.99),
        "max": pick(1.0),
    }
    if cdf:
        out["cdf"] = [[q, pick(q)] for q in CDF_QUANTILES]
    return out


def ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x is not None and y else None


def build_report(
    params: dict[str, Any],
    setup: dict[str, Any],
    memory: dict[str, Any],
    runs: list[dict[str, Any]],
    node_b: dict[str, Any],
    notes: list[str],
    load_before: list[float] | None,
) -> dict[str, Any]:
    for run in runs:
        polling = run["polling"]
        run["ratios"] = {
            "polling_over_push_p50": None
            if polling is None
            else ratio(polling["latency_ms"]["p50"], run["push"]["latency_ms"]["p50"]),
            "polling_over_push_p99": None
            if polling is None
            else ratio(polling["latency_ms"]["p99"], run["push"]["latency_ms"]["p99"]),
        }
    delivered = all(
        run["push"]["missing"] == 0
        and (run["polling"] is None or run["polling"]["missing"] == 0)
        and run["acknowledged_ops"] == run["offered_ops"]
        for run in runs
    )
    return {
        "benchmark": "push",
        "params": params,
        "machine": machine_info(
            load_before, trio_websocket=version("trio-websocket"), hypercorn=version("hypercorn")
        ),
        "setup": setup,
        "memory": memory,
        "runs": runs,
        "node_b": node_b,
        "notes": notes,
        "all_delivered": delivered,
    }


# --- printing ------------------------------------------------------------------------------


def _ms(value: float | None, count: int = 1) -> str:
    if count == 0:
        return "–"
    return "never" if value is None else f"{value:,.0f}"


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}x"


def print_report(console: Console, report: dict[str, Any]) -> None:
    params, memory = report["params"], report["memory"]
    m = report["machine"]
    table = Table(
        title=(
            f"push: 2 node processes; a writer posts to node A over HTTP, "
            f"{params['probes']} probe streams among the clients of node B "
            f"({params['payload']} B payloads, {params['seconds']:g} s per rate)"
        ),
        caption=(
            "latency: POST start -> a probe has the op (push) / a poller's GET returned it "
            f"(polling: {params['pollers']} pollers, every {params['poll_interval_s']:g} s, "
            f"limit {params['poll_limit']}, beside the push clients of the same run); "
            "B hop: stored on node B -> probe; "
            "delivered: ops every probe got / ops acknowledged; B CPU: load start to drained"
        ),
    )
    for name in (
        "rate ops/s", "clients", "push p50 ms", "push p99 ms", "push max ms", "delivered",
        "RSS/conn KiB", "B hop p50/p99 ms", "poll p50 ms", "poll p99 ms", "poll/push p50",
        "poll/push p99", "B CPU cores",
    ):  # fmt: skip
        table.add_column(name, justify="right")
    for run in report["runs"]:
        push, hop, polling = run["push"], run["b_hop_ms"], run["polling"]
        lat = push["latency_ms"]
        ok = push["missing"] == 0
        table.add_row(
            f"{run['rate']:,}",
            f"{run['clients']:,}",
            _ms(lat["p50"], lat["count"]),
            _ms(lat["p99"], lat["count"]),
            _ms(lat["max"], lat["count"]),
            red_unless(f"{push['delivered']:,} / {push['expected']:,}", ok),
            f"{memory['kib_per_connection']:,.1f}",
            f"{_ms(hop['p50'], hop['count'])}/{_ms(hop['p99'], hop['count'])}",
            "–" if polling is None else _ms(polling["latency_ms"]["p50"]),
            "–" if polling is None else _ms(polling["latency_ms"]["p99"]),
            _ratio(run["ratios"]["polling_over_push_p50"]),
            _ratio(run["ratios"]["polling_over_push_p99"]),
            f"{run['cpu']['node_b_cores_until_drained']:.2f}",
        )
    console.print(table)
    console.print(
        f"memory: node B RSS {memory['rss_before_kib'] / 1024:,.1f} MiB before the clients, "
        f"{memory['rss_idle_kib'] / 1024:,.1f} MiB with {memory['clients']:,} idle streams "
        f"-> {memory['kib_per_connection']:,.1f} KiB per connection; after the runs "
        + ", ".join(f"{kib / 1024:,.1f}" for kib in memory["rss_after_runs_kib"])
        + " MiB"
    )
    for run in report["runs"]:
        polling = run["polling"]
        line = (
            f"{run['rate']:,} ops/s: {run['acknowledged_ops']:,} of {run['offered_ops']:,} ops "
            f"acknowledged by node A ({run['posted_ops_s']:,.0f} ops/s); gossip hop (POST -> "
            f"stored on B) p50 {_ms(run['gossip_hop_ms']['p50'])} ms; drained "
            + (
                f"{run['drain_s']:.1f} s after the load"
                if run["drain_s"] is not None
                else f"[red]not within {params['drain_timeout_s']:g} s[/]"
            )
            + f"; stream frames {run['frames']:,}, closes {run['closes'] or 'none'}"
            f"; CPU cores (load): A {run['cpu']['node_a_cores']:.2f}, "
            f"B {run['cpu']['node_b_cores']:.2f}, harness {run['cpu']['harness_cores']:.2f}, "
            f"writer {run['cpu']['writer_cores']:.2f}, "
            f"other processes on the machine {run['cpu']['other_processes_cores']:.2f}"
        )
        if run["push"]["missing"]:
            got = run["push"]["latency_ms_of_received"]
            line += (
                f"; [red]{run['push']['missing']:,} ops missed some probe[/]; over the "
                f"{got['count']:,} (op, probe) pairs that came: p50 {_ms(got['p50'])}, p99 "
                f"{_ms(got['p99'])}, max {_ms(got['max'])} ms"
            )
        if polling is not None:
            line += (
                f"; polling: {polling['delivered']:,} / {polling['expected']:,} delivered, "
                f"{polling['requests']:,} requests, {polling['errors']} errors"
            )
        console.print(line)
    console.print(
        f"machine: {m['cpu_count']} CPUs, {m['platform']}, Python {m['python']}, "
        f"hypercorn {m['hypercorn']}, trio-websocket {m['trio_websocket']}; "
        f"load {m['loadavg_before']} -> {m['loadavg_after']}"
    )
    for note in report["notes"]:
        console.print(f"[yellow]note[/]: {note}")
    verdict = "[green]yes[/]" if report["all_delivered"] else "[red]NO[/]"
    console.print(f"every acknowledged op reached every probe (and poller): {verdict}")


# --- the plot ------------------------------------------------------------------------------


def plot_cdfs(report: dict[str, Any], path: Path) -> None:
    """Latency CDFs: push at each rate, polling beside the run it shared."""
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for run in report["runs"]:
        curves = [("push", run["push"]["latency_ms"], "-")]
        if run["polling"] is not None:
            curves.append(("polling", run["polling"]["latency_ms"], "--"))
        for label, summary, style in curves:
            points = [(v, q) for q, v in summary.get("cdf", []) if v is not None]
            if not points:
                continue
            xs, ys = zip(*points, strict=True)
            ax.plot(
                [max(x, 0.1) for x in xs],
                ys,
                style,
                lw=1.6,
                label=f"{label}, {run['rate']:,} ops/s, {run['clients']:,} clients",
            )
    ax.set_xscale("log")
    ax.set_xlabel("latency: POST start -> the op at the client (ms, log scale)")
    ax.set_ylabel("fraction of (op, client) pairs")
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3, which="both")
    m = report["machine"]
    ax.set_title(f"chatsync push vs polling — 2 nodes, {m['cpu_count']} cores shared")
    ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
