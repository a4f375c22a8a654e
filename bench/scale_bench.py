"""``chatsync bench scale``: the same offered load on 4, 8, … 20 nodes — does a node's cost
grow with the network? (issue 32)

For each node count the batched load of ``chatsync bench gossip`` runs on a fresh cluster
whose later nodes know only the first one (``--bootstrap-nodes 1``: the rest they find by
peer exchange). Per node: CPU per op until every op is on every node, CPU per second idle
(measured before the load), loopback bytes per op (every node's libp2p and HTTP traffic),
connections; for the run: latency POST -> all nodes p50/p99/max and the share of remote
deliveries that came by gossip. Printed side by side with the ratio to the smallest
cluster, saved as JSON and plotted (PNG).

Goals (2-core machine, 300 ops/s): 20 nodes with p99 < 1 s and >= 99 % by gossip; CPU per
op and idle CPU per node at 20 nodes <= 1.2x those at 4.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt
from rich.console import Console
from rich.table import Table

from bench.console import bench_console, red_unless, save_report
from bench.gossip_bench import GossipBenchParams, Signer, _close, run_load

MAX_RATIO = 1.2
MAX_P99_MS = 1000.0
MIN_BY_GOSSIP = 0.99


@dataclass(frozen=True)
class ScaleParams:
    nodes: tuple[int, ...] = (4, 8, 12, 16, 20)
    rate: int = 300
    seconds: float = 20.0
    idle_s: float = 10.0
    sync_interval_s: float = 10.0
    bootstrap_nodes: int | None = 1  # None: each node bootstraps from every node before it
    out: Path = Path("bench-results/scale.json")
    data: Path | None = None


def row_of(n: int, result: dict[str, Any]) -> dict[str, Any]:
    """The figures of one node count, from ``run_load``'s result."""
    accepted = max(1, result["acknowledged_ops"])
    remote = result["via_gossip"] + result["via_sync"]
    latency = result["latency_ms"]["end_to_end"]
    return {
        "nodes": n,
        "cpu_us_per_op_per_node": result["node_cpu"]["us_per_op_per_node"],
        "idle_cores_per_node": result["idle_cores_per_node"],
        "bytes_per_op_per_node": result["loopback_bytes"] / accepted / n,
        "connections_mean": sum(result["connections"]) / max(1, len(result["connections"])),
        "connections_max": max(result["connections"], default=0),
        "p50_ms": latency["p50"],
        "p99_ms": latency["p99"],
        "max_ms": latency["max"],
        "by_gossip": result["via_gossip"] / remote if remote else 0.0,
        "ops_per_gossip_message": result["ops_per_gossip_message"],
        "all_delivered": result["all_on_every_node"],
        "other_processes_cores": result["node_cpu"]["other_processes_cores_during_load"],
    }


def run_scale_bench(params: ScaleParams, console: Console | None = None) -> dict[str, Any]:
    console = console or bench_console(log_width=160)
    base = Path(tempfile.mkdtemp(prefix="chatsync-scale-")) if params.data is None else params.data
    shutil.rmtree(base, ignore_errors=True)
    signer = Signer(16, 100, 200)
    rows, runs = [], {}
    try:
        for n in params.nodes:
            gossip_params = replace(
                GossipBenchParams(),
                nodes=n, rate=params.rate, seconds=params.seconds, catchup=0, unbatched=False,
                floor=False, capacity=None, sync_interval_s=params.sync_interval_s,
                bootstrap_nodes=params.bootstrap_nodes, idle_s=params.idle_s,
            )  # fmt: skip
            result, cluster = run_load(
                console, gossip_params, base / f"n{n}", batched=True, signer=signer
            )
            _close(cluster, f"{n} nodes")
            runs[str(n)] = result
            rows.append(row_of(n, result))
            console.print(f"  {n} nodes: {_one_line(rows[-1])}")
            report = {"params": _shown(params), "rows": rows, "runs": runs}
            save_report(console, report, params.out)  # after each count: a crash keeps them
    finally:
        if params.data is None:
            shutil.rmtree(base, ignore_errors=True)
    print_table(console, rows)
    plot(rows, params.out.with_suffix(".png"))
    console.print(f"saved {params.out.with_suffix('.png')}")
    return report


def _shown(params: ScaleParams) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in params.__dict__.items()}


def _one_line(row: dict[str, Any]) -> str:
    return (
        f"{row['cpu_us_per_op_per_node']:,.0f} µs/op/node, idle "
        f"{row['idle_cores_per_node']:.3f} cores/node, p99 {row['p99_ms']:,.0f} ms, "
        f"{100 * row['by_gossip']:.1f} % by gossip"
    )


def print_table(console: Console, rows: list[dict[str, Any]]) -> None:
    first = rows[0]
    table = Table(title=f"per node, same offered rate (ratio to {first['nodes']} nodes)")
    table.add_column("figure")
    for row in rows:
        table.add_column(f"{row['nodes']} nodes", justify="right")

    def ratio_cells(key: str, fmt: str, limit: float | None) -> list[str]:
        cells = []
        for row in rows:
            ratio = row[key] / first[key] if first[key] else float("nan")
            text = f"{row[key]:{fmt}} ({ratio:.2f}x)"
            cells.append(text if limit is None else red_unless(text, ratio <= limit))
        return cells

    table.add_row(
        "CPU per op per node (µs)", *ratio_cells("cpu_us_per_op_per_node", ",.0f", MAX_RATIO)
    )
    table.add_row(
        "idle CPU per node (cores)", *ratio_cells("idle_cores_per_node", ".4f", MAX_RATIO)
    )
    table.add_row(
        "loopback bytes per op per node", *ratio_cells("bytes_per_op_per_node", ",.0f", None)
    )
    table.add_row(
        "connections per node (mean / max)",
        *[f"{r['connections_mean']:.1f} / {r['connections_max']}" for r in rows],
    )
    for key, label in (("p50_ms", "p50"), ("p99_ms", "p99"), ("max_ms", "max")):
        cells = [f"{r[key]:,.0f}" if r[key] is not None else "–" for r in rows]
        if key == "p99_ms":
            cells = [
                red_unless(c, r[key] is not None and r[key] < MAX_P99_MS)
                for c, r in zip(cells, rows, strict=True)
            ]
        table.add_row(f"latency POST -> all nodes {label} (ms)", *cells)
    table.add_row(
        "remote deliveries by gossip",
        *[
            red_unless(f"{100 * r['by_gossip']:.1f} %", r["by_gossip"] >= MIN_BY_GOSSIP)
            for r in rows
        ],
    )
    table.add_row("ops per gossip message", *[f"{r['ops_per_gossip_message']:.1f}" for r in rows])
    table.add_row(
        "other processes during load (cores)", *[f"{r['other_processes_cores']:.2f}" for r in rows]
    )
    table.add_row(
        "every op on every node", *["yes" if r["all_delivered"] else "[red]no[/]" for r in rows]
    )
    console.print(table)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Per-node cost against the node count, each as a ratio to the smallest cluster."""
    nodes = [r["nodes"] for r in rows]
    fig, (cost, latency) = plt.subplots(1, 2, figsize=(11, 4))
    for key, label in (
        ("cpu_us_per_op_per_node", "CPU per op per node"),
        ("idle_cores_per_node", "idle CPU per node"),
        ("bytes_per_op_per_node", "bytes per op per node"),
    ):
        base = rows[0][key] or 1.0
        cost.plot(nodes, [r[key] / base for r in rows], marker="o", label=label)
    cost.axhline(MAX_RATIO, color="grey", linestyle="--", label=f"goal {MAX_RATIO}x")
    cost.set_xlabel("nodes")
    cost.set_ylabel(f"ratio to {nodes[0]} nodes")
    cost.set_title("per-node cost, same offered rate")
    cost.legend()
    for key, label in (("p50_ms", "p50"), ("p99_ms", "p99"), ("max_ms", "max")):
        latency.plot(nodes, [r[key] or 0 for r in rows], marker="o", label=label)
    latency.axhline(MAX_P99_MS, color="grey", linestyle="--", label="p99 goal")
    latency.set_xlabel("nodes")
    latency.set_yscale("log")  # 100 ms to 30 s on one axis
    latency.set_ylabel("ms, POST -> all nodes")
    latency.set_title("latency")
    latency.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
