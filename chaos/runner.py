"""One chaos run, start to end: nodes up, the workload set up, workers, sessions, monitor and
nemesis for the duration, heal, quiescence, the sessions' final reads, the nodes stopped and
read, the oracle, the checker, the report."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaos.checker import Expected, check
from chaos.history import ACKED, History
from chaos.monitor import monitor, wait_quiet
from chaos.nemesis import Nemesis
from chaos.nodes import ChaosNodes
from chaos.oracle import run_oracle
from chaos.report import plot, save, summary_lines
from chaos.schedule import KINDS, ScheduleParams, make_schedule
from chaos.sessions import Session
from chaos.workers import Users, Workload
from store.hlc import DEFAULT_MAX_OFFSET_MS


@dataclass
class ChaosParams:
    nodes: int = 5
    duration_s: float = 300.0
    seed: int = 0
    kinds: tuple[str, ...] = KINDS
    members: int = 4  # member users: one worker thread and one session each
    chats: int = 3
    rate: float = 40.0  # requests per second, all workers together
    batch: int = 12
    durable: bool = True
    plant: str = ""
    plant_nodes: list[int] | None = None  # None: every node
    oracle: bool = True
    quiet_timeout_s: float = 180.0
    disk_mb: int = 256
    min_free_mb: int = 32
    data: Path | None = None  # default: a temporary directory
    out: Path = Path("bench-results/chaos.json")
    extra: dict[str, Any] = field(default_factory=dict)


def run_chaos(params: ChaosParams, say: Callable[[str], None] = print) -> dict[str, Any]:
    faults = make_schedule(
        ScheduleParams(
            params.seed,
            params.nodes,
            params.duration_s,
            params.kinds,
            max_offset_ms=DEFAULT_MAX_OFFSET_MS,
        )
    )
    say(f"seed {params.seed}: {len(faults)} faults over {params.duration_s:g} s on {params.nodes} nodes "
        f"({'durable' if params.durable else 'not durable'}{', plant ' + params.plant if params.plant else ''})")  # fmt: skip
    for fault in faults:
        say(f"  {fault.describe()}")
    base = params.data or Path(tempfile.mkdtemp(prefix="chatsync-chaos-"))
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    history = History(params.nodes, params.seed)
    nodes = ChaosNodes(
        params.nodes, base, durable=params.durable, plant=params.plant,
        plant_nodes=params.plant_nodes, disk_mb=params.disk_mb, min_free_mb=params.min_free_mb,
    )  # fmt: skip
    timing: dict[str, float] = {}
    started = time.monotonic()
    try:
        nodes.start()
        say(
            f"{params.nodes} nodes up in {time.monotonic() - started:.1f} s (disks: {'tmpfs' if nodes.tmpfs else 'no tmpfs: config fallback'})"
        )
        workload = Workload(
            nodes.urls,
            history,
            params.seed,
            Users.make(params.seed, params.members),
            rate=params.rate,
            batch=params.batch,
        )
        workload.setup(params.chats)
        if not wait_quiet(nodes, 0, 60, settle=1):
            say("warning: the setup did not reach every node in 60 s")
        finals, report_expected = _run(params, nodes, workload, history, faults, timing, say)
    finally:
        nodes.close()
        if params.data is None:
            shutil.rmtree(base, ignore_errors=True)
    report = check(history, finals, report_expected)
    result = {
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(params).items()},
        "ok": report.ok,
        "counters": report.counters,
        "stats": report.stats,
        "examples": report.examples,
        "oracle": params.oracle,
        "schedule": [asdict(f) for f in faults],
        "timing": timing | {"total_s": time.monotonic() - started},
    }
    out, history_path = save(result, history, finals, params.out)
    figure = plot(history, faults, report, params.out.with_suffix(".png"))
    for line in summary_lines(report):
        say(line)
    say(f"report {out}, history {history_path}, plot {figure}")
    return result


def _run(
    params: ChaosParams,
    nodes: ChaosNodes,
    workload: Workload,
    history: History,
    faults: list[Any],
    timing: dict[str, float],
    say: Callable[[str], None],
) -> tuple[list[Any], Expected | None]:
    t0 = time.monotonic()
    workload.t0 = t0
    stop_writes, stop_reads, stop_all = threading.Event(), threading.Event(), threading.Event()
    sessions = [
        Session(
            f"s{i}", user, i % params.nodes, nodes.urls[i % params.nodes], history, t0, params.seed
        )
        for i, user in enumerate(workload.users.members)
    ]
    nemesis = Nemesis(nodes, history, faults, t0)
    threads = workload.threads(stop_writes)
    readers = [threading.Thread(target=s.run, args=(stop_reads,), daemon=True) for s in sessions]
    watcher = threading.Thread(target=monitor, args=(nodes, history, t0, stop_all), daemon=True)
    chaos = threading.Thread(target=nemesis.run, args=(stop_all,), daemon=True)
    for thread in [*threads, *readers, watcher, chaos]:
        thread.start()
    try:
        while (elapsed := time.monotonic() - t0) < params.duration_s:
            time.sleep(min(30.0, params.duration_s - elapsed))
            acked = sum(1 for op in history.ops if op.status == ACKED)
            say(
                f"  {time.monotonic() - t0:6.1f} s: {len(history.ops)} ops, {acked} acked, {len(history.faults)} fault actions"
            )
        stop_writes.set()
        for thread in threads:
            thread.join()
        chaos.join(timeout=120)
    finally:
        stop_writes.set()
        stop_all.set()
    nemesis.heal()
    history.heal_s = time.monotonic() - t0
    watcher2 = threading.Thread(target=monitor, args=(nodes, history, t0, stop_reads), daemon=True)
    watcher2.start()
    quiet = wait_quiet(nodes, t0, params.quiet_timeout_s)
    history.quiet_s = time.monotonic() - t0
    say(
        f"healed at {history.heal_s:.1f} s; {'quiet' if quiet else 'NOT quiet'} at {history.quiet_s:.1f} s"
    )
    stop_reads.set()
    for thread in [*readers, watcher2]:
        thread.join()
    for session in sessions:
        session.finish()
    roots = [nodes.roots(i) for i in range(params.nodes)]
    nodes.stop_all()
    users = list(history.users)
    finals = [nodes.final_state(i, history.chats, users, roots[i]) for i in range(params.nodes)]
    timing["quiet_after_heal_s"] = history.quiet_s - history.heal_s
    expected = None
    if params.oracle:
        held = {i for s in finals for d in s.ids.values() for i in d}
        final_ops = [op for op in history.ops if op.status == ACKED or op.id in held]
        started = time.monotonic()
        expected = run_oracle(
            final_ops,
            Path(tempfile.mkdtemp(prefix="chatsync-chaos-oracle-")),
            params.nodes,
            DEFAULT_MAX_OFFSET_MS,
        )
        timing["oracle_s"] = time.monotonic() - started
        say(f"oracle: {len(final_ops)} ops in {timing['oracle_s']:.1f} s")
    return finals, expected
