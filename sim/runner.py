"""``chatsync sim run``: oracle, shard tasks on Spark, and the combined check.

1. The oracle job (``sim.oracle``) computes the expected final state from the trace.
2. One Spark task per shard (``sim.engine.run_shard``) simulates every node over
   that shard's records and checks its replicas against the oracle's slice.
3. The driver combines the shards: per node, roots by XOR and sum, counters by
   sum; converged means one root per domain among the honest live nodes, equal
   to the oracle's; the run passes if also nothing is lost, extra, stale,
   resurrected, wrongly active, shown unauthorized or hidden though authorized, and no
   member of a group is left without the key of a message sent to them nor a removed one
   given the key of a message whose sender knew of the removal (the oracle's group keys).

``result`` holds only what the trace, the shard count and the planted bug decide
(it is identical on any master and any number of executors); wall-clock figures
live in ``timing``.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import shlex
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark import SparkFiles
from pyspark.sql import SparkSession

from sim import engine
from sim.oracle import Oracle, compute_oracle, oracle_summary
from sim.schedule import UNIFORM
from sim.scope_check import WANT_DOMAINS
from sim.shards import shards_for, task_bytes
from sim.spark import LOOPBACK, ProgressServer, is_local_master
from store import trace as tr
from sync.frames import Domain


@dataclass
class RunOutcome:
    header: tr.TraceHeader
    result: dict[str, Any]
    timing: dict[str, Any]
    command: str
    replay: str
    shard_results: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.result["ok"])

    def report(self) -> dict[str, Any]:
        return {
            "trace": self.header.__dict__,
            "run": {"command": self.command, "replay": self.replay},
            "result": self.result,
            "timing": self.timing,
        }


def _run_task(task: engine.ShardTask) -> dict[str, Any]:
    """Executor side: find the shipped trace, simulate the shard."""
    local = Path(task.trace_file)
    if not local.exists():
        task.trace_file = SparkFiles.get(local.name)
    return engine.run_shard(task)


def _ship(spark: SparkSession, trace_path: Path, workdir: Path) -> str:
    """Register the trace with addFile under a content-derived name (names must be unique)."""
    digest = hashlib.blake2b(trace_path.read_bytes(), digest_size=12).hexdigest()
    name = f"trace-{digest}.parquet"
    copy = workdir / name
    if not copy.exists():
        shutil.copyfile(trace_path, copy)
    try:
        spark.sparkContext.addFile(str(copy))
    except Exception as exc:  # the same content added before in this context: fine
        if "already registered" not in str(exc) and "already been added" not in str(exc):
            raise
    return name


def run_command(
    trace: Path,
    shards: int,
    plant: str | None,
    master: str | None = None,
    peering: str = UNIFORM,
) -> str:
    parts = ["chatsync sim run", shlex.quote(str(trace)), f"--shards {shards}"]
    if master:
        parts.append(f"--master {shlex.quote(master)}")
    if peering != UNIFORM:
        parts.append(f"--peering {peering}")
    if plant:
        parts.append(f"--plant {plant}")
    return " ".join(parts)


def run_simulation(
    spark: SparkSession,
    trace_path: str | Path,
    *,
    shards: int | None = None,
    plant: str | None = None,
    peering: str = UNIFORM,
    on_progress: Callable[[float, str], None] | None = None,
) -> RunOutcome:
    """Replay a trace on ``spark``: ``shards`` tasks (None: ``shards_for`` the trace's size
    and the session's cores)."""
    trace_path = Path(trace_path).resolve()
    header = tr.read_header(trace_path)
    if shards is None:
        shards = shards_for(header.nodes, header.ops, spark.sparkContext.defaultParallelism)
    wall0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    note = on_progress or (lambda fraction, what: None)
    note(0.0, "oracle")
    oracle = compute_oracle(spark, str(trace_path), header)
    t_oracle = time.perf_counter() - wall0

    sc = spark.sparkContext
    master = str(sc.master)
    workdir = Path(tempfile.gettempdir()) / "chatsync-sim-files"
    workdir.mkdir(exist_ok=True)
    name = _ship(spark, trace_path, workdir)
    host = LOOPBACK if is_local_master(master) else sc.getConf().get("spark.driver.host", LOOPBACK)
    server = ProgressServer(host, shards)
    tasks = [
        engine.ShardTask(
            shard=s,
            shards=shards,
            trace_file=name,
            plant=plant,
            expected=oracle.for_shard(s, shards),
            progress=server.address,
            peering=peering,
        )
        for s in range(shards)
    ]
    results: list[dict[str, Any]] = []
    failure: list[BaseException] = []

    def job() -> None:
        try:
            rdd = sc.parallelize(tasks, len(tasks))
            results.extend(rdd.map(_run_task).collect())
        except BaseException as exc:
            failure.append(exc)

    t1 = time.perf_counter()
    worker = threading.Thread(target=job, daemon=True)
    worker.start()
    op_offsets = _op_offsets(trace_path, header)
    while worker.is_alive():
        worker.join(0.25)
        elapsed = time.perf_counter() - t1
        note(server.fraction(), progress_text(header, op_offsets, server.done_ms(), elapsed))
    server.close()
    if failure:
        raise failure[0]
    t_sim = time.perf_counter() - t1
    note(1.0, "checking")
    results.sort(key=lambda r: r["shard"])
    result = combine(header, oracle, results, shards=shards, plant=plant, peering=peering)
    wall = time.perf_counter() - wall0
    node_ops = header.nodes * (result["oracle"]["valid_ops"] + result["oracle"]["invalid_ops"])
    timing = {
        "wall_s": round(wall, 3),
        "oracle_s": round(t_oracle, 3),
        "simulate_s": round(t_sim, 3),
        "shard_wall_s_max": round(max(r["wall_s"] for r in results), 3),
        "shard_wall_s_sum": round(sum(r["wall_s"] for r in results), 3),
        "shard_cpu_s_sum": round(sum(r.get("cpu_s", 0.0) for r in results), 3),
        "shard_peak_rss_mb": round(max(r.get("peak_rss_mb", 0.0) for r in results), 1),
        "shard_rss_mb_estimate": round(task_bytes(header.nodes, header.ops, shards) / 1e6, 1),
        "node_ops": node_ops,
        "node_ops_per_s": round(node_ops / wall, 1),
        "node_ops_per_s_simulating": round(node_ops / max(t_sim, 1e-9), 1),
        # Per CPU second of the shard tasks: what a machine to ourselves would give per core.
        "node_ops_per_cpu_s": round(
            node_ops / max(sum(r.get("cpu_s", 0.0) for r in results), 1e-9), 1
        ),
        "master": master,
        "default_parallelism": sc.defaultParallelism,
        "cpus": os.cpu_count() or 0,
        "load_avg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],  # at start, at end
    }
    command = run_command(
        trace_path, shards, plant, None if master.startswith("local") else master, peering
    )
    replay = (
        f"{header.command} && {run_command(trace_path, shards, plant, peering=peering)}"
        if header.command
        else command
    )
    return RunOutcome(header, result, timing, command, replay, results)


def _op_offsets(trace_path: Path, header: tr.TraceHeader) -> list[int]:
    """Each op's time from the trace's start, in order: how far a shard's simulated time is
    through the work (ops come unevenly; the quiescence after the heal has none)."""
    table = tr.read_trace(trace_path, ["kind"]).table
    kinds = table.column("kind").to_pylist()
    times = table.column("t_ms").to_pylist()
    return [t - header.start_ms for t, k in zip(times, kinds, strict=True) if k in tr.OP_CODES]


def progress_text(
    header: tr.TraceHeader, op_offsets: list[int], done_ms: list[int], elapsed_s: float
) -> str:
    """The progress line: simulated time (the slowest shard's), node-ops per second so far
    (node-ops: nodes x ops made up to each shard's time, averaged over the shards) and the
    time left at that rate."""
    span_s = (header.end_ms - header.start_ms) / 1000
    sim_s = min(done_ms, default=0) / 1000
    shards = max(1, len(done_ms))
    ops_done = sum(bisect.bisect_right(op_offsets, d) for d in done_ms) / shards
    node_ops = header.nodes * ops_done
    rate = node_ops / elapsed_s if elapsed_s > 0 else 0.0
    left = header.nodes * len(op_offsets) - node_ops
    eta = "?" if rate <= 0 else _clock(left / rate)
    return (
        f"simulating: {sim_s:,.0f} of {span_s:,.0f} s simulated, {rate:,.0f} node-ops/s, ETA {eta}"
    )


def _clock(seconds: float) -> str:
    minutes, s = divmod(int(seconds + 0.5), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}:{m:02d}:{s:02d}" if hours else f"{m}:{s:02d}"


# --- combining the shards ---------------------------------------------------------------------


def combine(
    header: tr.TraceHeader,
    oracle: Oracle,
    results: list[dict[str, Any]],
    *,
    shards: int,
    plant: str | None,
    peering: str = UNIFORM,
) -> dict[str, Any]:
    n = header.nodes
    scoped = bool(header.params.get("scope_shards"))
    counters = (*engine.CHECK_COUNTERS, *(engine.SCOPE_COUNTERS if scoped else ()))
    roots = [[[0, 0] for _ in Domain] for _ in range(n)]
    # scoped: what each node's messages and deletes roots should be over its own scope
    want = [[[0, 0] for _ in WANT_DOMAINS] for _ in range(n)]
    nodes: list[dict[str, Any]] = [
        {"node": i, **dict.fromkeys(counters, 0), "clock_ahead_ms": -(1 << 62)} for i in range(n)
    ]
    chat_checks: dict[str, int] = {}
    stats: dict[str, int] = {}
    aborts: dict[str, int] = {}
    for r in results:
        for row in r["nodes"]:
            i = row["node"]
            node = nodes[i]
            node["alive"], node["honest"] = row["alive"], row["honest"]
            for c in counters:
                node[c] += row[c]
            for d, (xor, count) in enumerate(row.get("want_roots", ())):
                want[i][d][0] ^= xor
                want[i][d][1] += count
            node["clock_ahead_ms"] = max(node["clock_ahead_ms"], row["clock_ahead_ms"])
            for d, (xor, count) in enumerate(row["roots"]):
                roots[i][d][0] ^= xor
                roots[i][d][1] += count
        for k, v in r["stats"].items():
            stats[k] = stats.get(k, 0) + v
        for k, v in r["abort_reasons"].items():
            aborts[k] = aborts.get(k, 0) + v
        for k, v in (r.get("scoped") or {}).items():  # summed; the fewest holders: min
            merged = min(chat_checks.get(k, v), v) if k == "holders_min" else v
            chat_checks[k] = merged if k == "holders_min" else chat_checks.get(k, 0) + v
    oracle_roots = oracle.roots()
    checked = [i for i in range(n) if nodes[i]["alive"] and nodes[i]["honest"]]
    domains: dict[str, Any] = {}
    converged = bool(checked)
    for d in Domain:
        distinct = {tuple(roots[i][d]) for i in checked}
        oracle_root = oracle_roots[d]
        if scoped:  # each node on its own scope
            w = WANT_DOMAINS.index(d)
            equal = all(roots[i][d] == want[i][w] for i in checked)
        else:
            equal = distinct == {oracle_root}
        converged &= equal
        domains[d.name.lower()] = {
            "distinct_roots": len(distinct),
            "equals_oracle": equal,
            "oracle_root": _root_hex(oracle_root),
            "oracle_count": oracle_root[1],
            "node_counts": sorted({c for _, c in distinct}),
        }
    totals = {c: sum(nodes[i][c] for i in checked) for c in counters}
    if scoped:
        totals.update({c: chat_checks.get(c, 0) for c in engine.SCOPE_CHAT_COUNTERS})
    clock_jumps = sum(1 for i in checked if nodes[i]["clock_ahead_ms"] > header.max_offset_ms)
    failing = [
        {k: nodes[i][k] for k in ("node", *counters, "clock_ahead_ms")}
        for i in checked
        if any(nodes[i][c] for c in counters)
    ][:20]
    rounds = _combine_rounds(results)
    quiet = _first_quiet_round(rounds, header.heal_ms)
    keys = oracle.keys  # group keys: the oracle's count, from the trace (sim.key_oracle)
    group_keys = {
        "undecryptable_for_member": keys.undecryptable_for_member,
        "readable_by_removed": keys.readable_by_removed,
    }
    ok = (
        converged and not any(totals.values()) and clock_jumps == 0 and not any(group_keys.values())
    )
    return {
        "ok": ok,
        "converged": converged,
        "seed": header.seed,
        "shards": shards,
        "plant": plant,
        "peering": peering,
        "overlay": results[0].get("overlay") if results else None,
        "nodes": {
            "total": n,
            "checked": len(checked),
            "poisoned": [i for i in range(n) if not nodes[i]["honest"]],
            "down_at_end": [i for i in range(n) if not nodes[i]["alive"]],
        },
        "domains": domains,
        "scopes": chat_checks or None,  # scoped: chats, holders (min, sum), per-chat checks
        "check": {**totals, "honest_clocks_pushed_ahead": clock_jumps, **group_keys},
        "failing_nodes": failing,
        "oracle": oracle_summary(oracle),
        "stats": stats,
        "abort_reasons": aborts,
        "rounds": rounds,
        "quiet_at_ms": quiet,
        "rounds_digest": engine.digest_rows(rounds["rows"]),
    }


def _root_hex(root: tuple[int, int]) -> str:
    return f"{root[0]:064x}:{root[1]}"


def _combine_rounds(results: list[dict[str, Any]]) -> dict[str, Any]:
    count = min(len(r["rounds"]) for r in results) if results else 0
    rows = []
    for k in range(count):
        t = results[0]["rounds"][k][0]
        sums = [sum(r["rounds"][k][j] for r in results) for j in range(1, len(engine.ROUND_FIELDS))]
        rows.append([t, *sums])
    return {"fields": list(engine.ROUND_FIELDS), "rows": rows}


def _first_quiet_round(rounds: dict[str, Any], heal_ms: int) -> int | None:
    """The first round at or after heal from which divergence stays 0."""
    quiet = None
    for row in rounds["rows"]:
        if row[0] < heal_ms:
            continue
        quiet = (row[0] if quiet is None else quiet) if row[1] == 0 else None
    return quiet
