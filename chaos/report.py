"""A chaos run's output: the printed summary, the JSON report, the timeline plot."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt

from chaos.checker import COUNTERS, NodeState, Report
from chaos.history import ACKED, History
from chaos.monitor import divergence
from chaos.schedule import PARTITION_KINDS, Fault

COLORS = {
    "kill": "tab:red", "pause": "tab:orange", "partition": "tab:blue",
    "partition-oneway": "tab:cyan", "skew": "tab:green", "skew-far": "tab:olive",
    "disk": "tab:purple",
}  # fmt: skip


def summary_lines(report: Report) -> list[str]:
    lines = ["counters (0 expected):"]
    lines += [f"  {name:<20} {report.counters[name]}" for name in COUNTERS]
    s = report.stats
    lines.append(
        f"ops {s['ops']}: acked {s['acked']}, refused {s['refused']}, unknown {s['unknown']} "
        f"({s['unknown_present']} of them held by the nodes)"
    )
    lines.append(f"fault actions: {s['fault_actions']} ({s['fault_actions_failed']} failed)")
    lines.append(
        f"sessions {s['sessions']} ({s['session_epochs']} epochs), events read {s['events_read']},"
        f" history reads {s['reads']}; healed at {s['heal_s']:.1f} s, quiet at {s['quiet_s']:.1f} s"
    )
    lines.append(f"not acked, by code: {s['not_acked_codes']}")
    for name, examples in report.examples.items():
        lines += [f"  {name}: {e}" for e in examples]
    lines.append("OK: every counter 0" if report.ok else "FAILED: see the counters")
    return lines


def save(
    result: dict[str, Any], history: History, finals: list[NodeState], out: Path
) -> tuple[Path, Path]:
    """The report as JSON at ``out``; beside it (gzipped) the whole history and the nodes'
    final states, so that the checker can run again on them (``load_run``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    history_path = out.with_name(out.stem + "-history.json.gz")
    states = [
        {**asdict(s), "ids": {d: sorted(v) for d, v in s.ids.items()}, "visible": sorted(s.visible)}
        for s in finals
    ]
    with gzip.open(history_path, "wt") as f:
        json.dump({"history": history.to_json(), "finals": states}, f)
    return out, history_path


def load_run(history_path: Path) -> tuple[History, list[NodeState]]:
    with gzip.open(history_path, "rt") as f:
        data = json.load(f)
    finals = [
        NodeState(
            s["index"],
            {d: set(v) for d, v in s["ids"].items()},
            s["identities"],
            set(s["visible"]),
            s["views"],
            s["roots"],
        )
        for s in data["finals"]
    ]
    return History.from_json(data["history"]), finals


def plot(history: History, faults: list[Fault], report: Report, path: Path) -> Path:
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(13, 6.5), sharex=True, gridspec_kw={"height_ratios": [1.2, 1]}
    )
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for fault in faults:
        rows = fault.group if fault.kind in PARTITION_KINDS else (fault.node,)
        for row in rows:
            bars.setdefault((row, fault.kind), []).append(
                (fault.start_s, fault.end_s - fault.start_s)
            )
    seen: set[str] = set()
    for (row, kind), spans in sorted(bars.items()):
        top.broken_barh(
            spans, (row - 0.3, 0.6), facecolors=COLORS[kind], alpha=0.8,
            label=None if kind in seen else kind,
        )  # fmt: skip
        seen.add(kind)
    top.scatter(
        [r.t_s for r in history.faults], [r.node for r in history.faults], marker="|",
        color="k", s=60, label="nemesis step",
    )  # fmt: skip
    top.set_yticks(range(history.nodes), [f"node {i}" for i in range(history.nodes)])
    top.invert_yaxis()
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    top.set_title(
        f"chatsync chaos: {history.nodes} nodes, seed {history.seed} — "
        + ("every counter 0" if report.ok else f"FAILED {_failed(report)}")
    )
    t = [s.t_s for s in history.samples]
    bottom.plot(
        t, [divergence(s) for s in history.samples], color="tab:red", label="divergence (records)"
    )
    bottom.set_ylabel("records behind")
    acked = Counter(int(op.done_s) for op in history.ops if op.status == ACKED)
    if acked:
        rate = bottom.twinx()
        xs = range(0, max(acked) + 1)
        rate.plot(xs, [acked.get(x, 0) for x in xs], color="tab:gray", alpha=0.6, linewidth=0.8)
        rate.set_ylabel("ops acked per s", color="tab:gray")
    for at, label, height in ((history.heal_s, "healed", 0.9), (history.quiet_s, "quiet", 0.75)):
        if at:
            bottom.axvline(at, color="k", linestyle="--", linewidth=0.8)
            bottom.text(at, bottom.get_ylim()[1] * height, f" {label}", fontsize=8)
    bottom.set_xlabel("seconds")
    bottom.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _failed(report: Report) -> str:
    return ", ".join(f"{k} {v}" for k, v in report.counters.items() if v)
