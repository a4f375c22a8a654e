"""``chatsync bench sync``, side by side: this protocol (sketches) beside the one it replaces
(per-leaf cells and id lists, ``SyncConfig(sketch=False)``) and beside negentropy when its
reference code runs here (``bench.negentropy_peer``), case by case, as ratios; and issue 35's
goals, checked on the cases that were run.

A ratio survives a noisy machine where an absolute time does not (ARCHITECTURE.md): both
protocols run on the same replicas, one after the other, in one process.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from bench.console import byte_size

# Issue 35's goals, at n = 10^6 scattered, both directions, record bodies excluded.
GOAL_N = 1_000_000
FLOOR_GOALS = {1_000: 1.0, 100_000: 1.0}  # d -> at most this many times d x 32 B
ROUND_TRIP_GOALS = {0: 1, 1: 2, 1_000: 3}  # d -> at most this many round trips
BYTE_GOALS = {0: 100, 1: 320}  # d -> at most this many bytes
CPU_RESOLUTION_S = 0.005  # below this a CPU difference is the timer's and the machine's noise


def side_by_side(
    cases: list[dict[str, Any]],
    baseline: list[dict[str, Any]],
    negentropy: dict[tuple[int, int, str], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One row per case: this protocol's bytes, round trips and CPU, the baseline's, the ratios."""
    before = {(c["n"], c["d"], c["placement"]): c for c in baseline}
    rows = []
    for c in cases:
        key = (c["n"], c["d"], c["placement"])
        old = before.get(key)
        if old is None:
            continue
        row = {
            "n": c["n"],
            "d": c["d"],
            "placement": c["placement"],
            "bytes": c["reconciliation_bytes"],
            "floor_ratio": c["floor_ratio"],
            "round_trips": c["round_trips"],
            "cpu_s": c["cpu_s"],
            "cells_bytes": old["reconciliation_bytes"],
            "cells_floor_ratio": old["floor_ratio"],
            "cells_round_trips": old["round_trips"],
            "cells_cpu_s": old["cpu_s"],
            "bytes_vs_cells": c["reconciliation_bytes"] / old["reconciliation_bytes"],
            "cpu_vs_cells": c["cpu_s"] / old["cpu_s"] if old["cpu_s"] else None,
            "cpu_pairs": c.get("cpu_pairs"),
        }
        neg = (negentropy or {}).get(key)
        if neg is not None:
            row["negentropy_bytes"] = neg["bytes"]
            row["negentropy_round_trips"] = neg["round_trips"]
            row["bytes_vs_negentropy"] = c["reconciliation_bytes"] / neg["bytes"]
        rows.append(row)
    return rows


def goals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 35's goals on the scattered cases at n = 10^6 that were run (met: None if not run)."""
    at = {r["d"]: r for r in rows if r["n"] == GOAL_N and r["placement"] == "scattered"}
    out: list[dict[str, Any]] = []
    for d in sorted(set(FLOOR_GOALS) | set(ROUND_TRIP_GOALS) | set(BYTE_GOALS)):
        r = at.get(d)
        parts = []
        if d in FLOOR_GOALS:
            parts.append(f"<= {FLOOR_GOALS[d]:g}x d·32 B")
        if d in BYTE_GOALS:
            parts.append(f"<= {BYTE_GOALS[d]} B")
        if d in ROUND_TRIP_GOALS:
            parts.append(f"<= {ROUND_TRIP_GOALS[d]} round trip(s)")
        parts.append("CPU <= the cells protocol's")
        target = f"n=10^6, d={d:,}: " + ", ".join(parts)
        if r is None:
            out.append({"target": target, "value": "not run", "met": None})
            continue
        met = (
            (d not in FLOOR_GOALS or (r["floor_ratio"] or 0) <= FLOOR_GOALS[d])
            and (d not in BYTE_GOALS or r["bytes"] <= BYTE_GOALS[d])
            and (d not in ROUND_TRIP_GOALS or r["round_trips"] <= ROUND_TRIP_GOALS[d])
            and _cpu_met(r)
        )
        ratio = "" if r["floor_ratio"] is None else f" = {r['floor_ratio']:.2f}x"
        value = f"{r['bytes']:,} B{ratio}, {r['round_trips']} RT, CPU {_cpu(r)} the cells'"
        out.append({"target": target, "value": value, "met": met})
    return out


def _cpu_met(r: dict[str, Any]) -> bool:
    """CPU <= the cells path's: the median of the paired sessions where there are some (one
    session's ratio is the machine's noise as much as the protocol's), else the one session;
    a difference under the timer's resolution counts as equal."""
    if r["cpu_s"] <= r["cells_cpu_s"] + CPU_RESOLUTION_S:
        return True
    pairs = r.get("cpu_pairs")
    return pairs is not None and pairs["median"] <= 1.0


def _cpu(r: dict[str, Any]) -> str:
    one = "x—" if r["cpu_vs_cells"] is None else f"x{r['cpu_vs_cells']:.2f}"
    pairs = r.get("cpu_pairs")
    if pairs is None:
        return one
    return (
        f"x{pairs['median']:.2f} (median of {pairs['pairs']} pairs, "
        f"{pairs['min']:.2f}-{pairs['max']:.2f}; one session {one})"
    )


def side_by_side_table(rows: list[dict[str, Any]]) -> Table:
    negentropy = any("negentropy_bytes" in r for r in rows)
    table = Table(
        title="sketch (this protocol) beside cells (the one it replaces)"
        + (" and negentropy" if negentropy else "")
        + ": one session, bytes both directions, record bodies excluded",
        caption="x floor = bytes / (d x 32 B); RT = round trips (frames the initiator sent); "
        "CPU = both sides, one process; ratios: sketch / the other",
    )
    cols = [
        "n", "d", "placement", "sketch", "x floor", "RT", "CPU ms",
        "cells", "x floor", "RT", "CPU ms", "bytes ratio", "CPU ratio",
    ]  # fmt: skip
    if negentropy:
        cols += ["negentropy", "RT", "vs negentropy"]
    for col in cols:
        table.add_column(col, justify="left" if col == "placement" else "right", no_wrap=True)
    for r in rows:
        cells = [
            _n(r["n"]),
            f"{r['d']:,}",
            r["placement"],
            byte_size(r["bytes"]),
            _ratio(r["floor_ratio"]),
            str(r["round_trips"]),
            f"{r['cpu_s'] * 1000:,.0f}",
            byte_size(r["cells_bytes"]),
            _ratio(r["cells_floor_ratio"]),
            str(r["cells_round_trips"]),
            f"{r['cells_cpu_s'] * 1000:,.0f}",
            f"{r['bytes_vs_cells']:.3f}",
            "—" if r["cpu_vs_cells"] is None else f"{r['cpu_vs_cells']:.2f}",
        ]
        if negentropy:
            if "negentropy_bytes" in r:
                cells += [
                    byte_size(r["negentropy_bytes"]),
                    str(r["negentropy_round_trips"]),
                    f"{r['bytes_vs_negentropy']:.3f}",
                ]
            else:
                cells += ["—", "—", "—"]
        table.add_row(*cells)
    return table


def goals_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="issue 35's goals")
    for col in ("goal", "measured", "met"):
        table.add_column(col)
    for g in rows:
        met = "—" if g["met"] is None else ("[green]met[/]" if g["met"] else "[red]missed[/]")
        table.add_row(g["target"], g["value"], met)
    return table


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def _n(n: int) -> str:
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n:,}"
