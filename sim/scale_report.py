"""``chatsync sim scale``'s report: the table, ``scale.json`` and ``scale.png``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt

from sim.scale import BOUND_C, BOUND_K, ScaleResult, result_dict

FLAT_MAX_RATIO = 1.2  # per-node figures: largest over smallest across N
FLAT_FIELDS = ("sessions_per_node", "records_per_node", "connections_mean")


def flatness(results: Sequence[ScaleResult]) -> dict[str, float]:
    """Per steady per-node figure, its largest value over its smallest across the runs."""
    out = {}
    for name in (*FLAT_FIELDS, "node_ops_per_node", "bytes_per_node"):
        values = [r.steady[name] for r in results]
        out[name] = max(values) / max(min(values), 1e-9)
    return out


def verdict(results: Sequence[ScaleResult]) -> tuple[bool, list[str]]:
    """Passed, and why not: every run converged within the bound; the per-node figures are flat."""
    problems = [
        f"N={r.nodes}: not converged within {r.bound:.0f} rounds after the heal"
        for r in results
        if not r.converged_in_bound
    ]
    ratios = flatness(results)
    problems += [
        f"{name} differs x{ratios[name]:.2f} across N (limit x{FLAT_MAX_RATIO})"
        for name in FLAT_FIELDS
        if ratios[name] > FLAT_MAX_RATIO
    ]
    return not problems, problems


def table_rows(results: Sequence[ScaleResult]) -> list[list[str]]:
    rows = []
    for r in results:
        s, heal = r.steady, r.heal["rounds_to_converge"]
        rows.append(
            [
                f"{r.nodes:,}",
                f"{r.log2_n:.1f}",
                f"{s['connections_mean']:.1f} ({s['connections_max']}; {s['peak_degree']})",
                f"{s['sessions_per_node']:.2f}",
                f"{s['records_per_node']:.2f}",
                f"{s['node_ops_per_node']:.1f}",
                f"{s['session_bytes_per_node'] / 1000:.1f} + {s['exchange_bytes_per_node'] / 1000:.2f}",
                "never" if heal is None else str(heal),
                f"{r.bound:.0f}",
                f"{r.wall_s:.0f}",
            ]
        )
    return rows


TABLE_COLUMNS = (
    "N",
    "log2 N",
    "conns (max; peak)",
    "sessions",
    "records",
    "node-ops",
    "KB sync + exch",
    "heal rounds",
    "bound",
    "wall s",
)
TABLE_CAPTION = (
    "per node per round (steady state): connections at the round's end (the most on one node; "
    "the most before closing the surplus), sessions opened + answered, records received, "
    "their sum, KB sent; then rounds until every live node holds every record after the heal"
)


def write_report(results: Sequence[ScaleResult], out_dir: Path, command: str) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "scale.json", "png": out_dir / "scale.png"}
    ok, problems = verdict(results)
    report: dict[str, Any] = {
        "command": command,
        "ok": ok,
        "problems": problems,
        "bound": f"{BOUND_C:g} * log2(N) + {BOUND_K}",
        "flatness": flatness(results),
        "runs": [result_dict(r) for r in results],
    }
    paths["json"].write_text(json.dumps(report, indent=1) + "\n")
    plot(results, paths["png"])
    return paths


def plot(results: Sequence[ScaleResult], path: Path) -> None:
    ns = [r.nodes for r in results]
    fig, (cost, heal) = plt.subplots(1, 2, figsize=(12, 4.8))
    for name, label in (
        ("sessions_per_node", "sessions opened + answered"),
        ("records_per_node", "records received"),
        ("connections_mean", "connections (mean)"),
    ):
        cost.plot(ns, [r.steady[name] for r in results], marker="o", label=label)
    kb = cost.twinx()
    kb.plot(
        ns,
        [r.steady["bytes_per_node"] / 1000 for r in results],
        marker="s",
        color="tab:gray",
        ls="--",
        label="KB sent (sync + exchange)",
    )
    kb.set_ylabel("KB per node per round")
    kb.set_ylim(bottom=0)
    cost.set_xscale("log")
    cost.set_ylim(bottom=0)
    cost.set_xlabel("nodes")
    cost.set_ylabel("per node per round")
    cost.set_title("per-node cost, steady state (one round = one sync interval)")
    lines = cost.get_legend_handles_labels()
    extra = kb.get_legend_handles_labels()
    cost.legend(lines[0] + extra[0], lines[1] + extra[1], fontsize="small", loc="lower right")
    cost.grid(alpha=0.3)
    rounds = [r.heal["rounds_to_converge"] for r in results]
    done = [(n, k) for n, k in zip(ns, rounds, strict=True) if k is not None]
    heal.plot([n for n, _ in done], [k for _, k in done], marker="o", label="rounds to converge")
    heal.plot(ns, [r.log2_n for r in results], ls=":", color="tab:gray", label="log2 N")
    heal.plot(ns, [r.bound for r in results], ls="--", color="tab:red", label="bound")
    for n, k in zip(ns, rounds, strict=True):
        if k is None:
            heal.annotate("never", (n, results[0].bound), color="tab:red", ha="center")
    heal.set_xscale("log")
    heal.set_ylim(bottom=0)
    heal.set_xlabel("nodes")
    heal.set_ylabel("rounds after the heal")
    heal.set_title("a healed partition (bootstrap nodes stopped)")
    heal.legend(fontsize="small")
    heal.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
