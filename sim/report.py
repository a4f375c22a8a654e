"""The run's report: ``report.json``, ``report.png`` and ``summary.txt`` in one directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt

from sim.runner import RunOutcome

BYTE_KINDS = ("gossip", "tree", "ids", "records", "control")
BYTE_LABELS = {
    "gossip": "gossip (ops)",
    "tree": "hashes (HELLO, NODES, CELLS)",
    "ids": "ids (wants, id lists)",
    "records": "records (sync)",
    "control": "control",
}


def write_report(outcome: RunOutcome, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "report.json", "png": out / "report.png", "summary": out / "summary.txt"}
    paths["json"].write_text(json.dumps(outcome.report(), indent=1, sort_keys=True) + "\n")
    plot(outcome, paths["png"])
    paths["summary"].write_text(summary(outcome) + "\n")
    return paths


def plot(outcome: RunOutcome, path: Path) -> None:
    h, rounds = outcome.header, outcome.result["rounds"]
    fields = rounds["fields"]
    rows = rounds["rows"]
    col = {name: i for i, name in enumerate(fields)}
    t = [(r[0] - h.start_ms) / 1000 for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    top.plot(t, [max(r[col["divergence"]], 0) for r in rows], color="tab:red", lw=1.5)
    top.set_ylabel("missing (node, record) pairs")
    top.set_title(
        f"divergence among honest live nodes — {h.nodes} nodes, {outcome.result['oracle']['valid_ops'] + outcome.result['oracle']['invalid_ops']:,} ops, seed {h.seed}"
    )
    if any(r[col["divergence"]] > 0 for r in rows):
        top.set_yscale("symlog", linthresh=10)
    bottom_stack = [0.0] * len(rows)
    for kind in BYTE_KINDS:
        values = [r[col[kind]] / 1e6 for r in rows]
        bottom.bar(
            t,
            values,
            bottom=bottom_stack,
            width=h.anti_entropy_ms / 1000 * 0.9,
            label=BYTE_LABELS[kind],
        )
        bottom_stack = [a + b for a, b in zip(bottom_stack, values, strict=True)]
    bottom.set_ylabel("MB per round")
    bottom.set_xlabel("simulated time (s)")
    bottom.legend(loc="upper right", fontsize="small")
    for ax in (top, bottom):
        ax.axvline((h.heal_ms - h.start_ms) / 1000, color="gray", ls="--", lw=1)
        ax.grid(alpha=0.3)
    top.text((h.heal_ms - h.start_ms) / 1000, top.get_ylim()[1], " heal", va="top", color="gray")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(outcome: RunOutcome) -> str:
    r, h, timing = outcome.result, outcome.header, outcome.timing
    check = r["check"]
    stats = r["stats"]
    o = r["oracle"]
    lines = [
        f"{'OK' if r['ok'] else 'FAILED'}: {h.nodes} nodes, {r['oracle']['valid_ops']:,} valid ops"
        f" (+{r['oracle']['invalid_ops']:,} invalid), seed {h.seed}, {r['shards']} shards"
        + (f", planted bug {r['plant']}" if r["plant"] else "")
        + (f", planted bug {h.params['plant']} (in the trace)" if h.params.get("plant") else ""),
        "roots: "
        + ", ".join(
            f"{name} {d['distinct_roots']} distinct, {'=' if d['equals_oracle'] else '!='} oracle ({d['oracle_count']:,} records)"
            for name, d in r["domains"].items()
        ),
        "check: "
        + ", ".join(f"{k} {v:,}" for k, v in check.items())
        + f" over {r['nodes']['checked']} honest live nodes"
        + (
            f" (poisoned clocks, not checked: {r['nodes']['poisoned']})"
            if r["nodes"]["poisoned"]
            else ""
        ),
        f"who may post: {o['messages']:,} messages stored ({o['messages_visible']:,} shown, "
        f"{o['messages'] - o['messages_visible']:,} hidden), {o['messages_inadmissible']:,} "
        f"never admitted; {stats['posts_waiting_at_origin']:,} posts waited at their origin, "
        f"{stats['waiting_at_end']:,} (node, message) pairs waiting at the end",
        f"message kinds: {o['deletes']:,} deletes held, {o['erased']:,} messages erased, "
        f"{o['tombstones']:,} tombstones, {o['edited_messages']:,} messages shown edited; "
        f"{stats.get('erased_waiting_at_end', 0):,} (node, message) pairs erased by a held "
        "delete but still in a waiting room",
        f"group keys: {o.get('group_messages', 0):,} group messages from members, "
        f"{o.get('keys_messages', 0):,} KEYS messages shown, "
        f"{o.get('hidden_keys_messages', 0):,} hidden (read all the same); "
        f"undecryptable_for_member {o.get('undecryptable_for_member', 0):,}, "
        f"readable_by_removed {o.get('readable_by_removed', 0):,}",
        f"gossip: {stats['gossip_sent']:,} sent, {stats['gossip_dropped']:,} dropped, "
        f"{stats['gossip_duplicated']:,} duplicated, {stats['gossip_rejected_drift']:,} refused (drift), "
        f"{stats['gossip_rejected_old']:,} refused (retention)",
        f"anti-entropy: {stats['sessions']:,} shard sessions, {stats['sessions_converged']:,} converged, "
        f"{stats['sessions_cut']:,} cut, {stats['sessions_aborted']:,} aborted; "
        f"{stats['sync_records_applied']:,} records repaired",
        *_overlay_lines(r),
        *_scope_lines(r),
        f"quiet (divergence 0 for good) at {(r['quiet_at_ms'] - h.start_ms) / 1000:.0f} s"
        if r["quiet_at_ms"] is not None
        else "never quiet before the final GC",
        f"speed: {timing['node_ops']:,} node-ops in {timing['wall_s']:.1f} s = "
        f"{timing['node_ops_per_s']:,.0f} node-ops/s ({timing['node_ops_per_s_simulating']:,.0f} while simulating, "
        f"{timing.get('node_ops_per_cpu_s', 0):,.0f} per task CPU second; "
        f"oracle {timing['oracle_s']:.1f} s) on {timing['master']}, "
        f"load average {timing['load_avg_1m'][0]:.1f} -> {timing['load_avg_1m'][1]:.1f} "
        f"on {timing['cpus']} CPUs",
        f"memory: shard peak RSS {timing.get('shard_peak_rss_mb', 0):,.0f} MB "
        f"(estimated {timing.get('shard_rss_mb_estimate', 0):,.0f} MB: sim.shards.task_bytes)",
    ]
    if not r["ok"]:
        lines.append(f"seed {h.seed}; replay: {outcome.replay}")
    return "\n".join(lines)


def _overlay_lines(result: dict[str, Any]) -> list[str]:
    """Who synced with whom: the overlay's figures under ``--peering discovery``."""
    o = result.get("overlay")
    if not o:
        return [f"peering: {result.get('peering', 'uniform')} (every node knows every node)"]
    rounds, nodes = max(o["rounds"], 1), max(result["nodes"]["total"], 1)
    return [
        f"peering: discovery — {o['connections'] / rounds * 2 / nodes:.1f} connections per node "
        f"(at most {o['peak_degree']} on one node, before it closed the surplus), "
        f"{o['sessions'] / rounds / nodes:.2f} sessions "
        f"started per node per round; {o['dials']:,} dials ({o['dials_failed']:,} failed), "
        f"{o['closed_surplus']:,} surplus closed, {o['dropped']:,} lost to crashes and cuts, "
        f"{o['exchanges']:,} exchanges ({o['exchange_bytes']:,} bytes)"
    ]


def load_report(path: str | Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data


def _scope_lines(r: dict[str, Any]) -> list[str]:
    """Scoped traces: the per-chat check and what a node holds (issue 33)."""
    scopes = r.get("scopes")
    if not scopes:
        return []
    chats = max(1, scopes["chats"])
    return [
        f"scopes: {scopes['chats']:,} chats, held in full by {scopes['holders_min']} to "
        f"{scopes['holders_sum'] / chats:.1f} (mean) honest live nodes; chats_diverged "
        f"{scopes['chats_diverged']:,}, under_replicated {scopes['under_replicated']:,}; "
        f"{r['stats'].get('gossip_sent_scoped', 0):,} gossip deliveries on shard topics"
    ]
