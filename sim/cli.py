"""``chatsync sim``: generate a trace, replay it on Spark, print the planted-bug table.

Mounted by the root command (``cli/main.py``), which imports this module only when a
``sim`` command runs (PySpark takes seconds to load); ``sim`` itself never imports ``node``.
"""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from pyspark.sql import SparkSession
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sim.bugs import GENERATOR_BUGS, Bug, PeeringBug
from sim.generate import FAULTS, GenParams, generate, parse_faults
from sim.schedule import DISCOVERY, UNIFORM
from sim.shards import MAX_SIM_SHARDS, TASK_BUDGET_BYTES
from sync.scope import MAX_SHARDS

sim_app = typer.Typer(
    help="Spark simulator: replay multi-node traces through store/ and sync/, check convergence.",
    no_args_is_help=True,
)

DEFAULT_OUT = Path("sim-results")


class Peering(StrEnum):
    UNIFORM = UNIFORM
    DISCOVERY = DISCOVERY


@sim_app.command("generate")
def generate_cmd(
    out: Annotated[Path, typer.Option("-o", "--out", help="Trace file to write (Parquet).")],
    nodes: Annotated[int, typer.Option(min=1, help="Nodes.")] = 10,
    users: Annotated[int, typer.Option(min=1, help="Users (each signs with its own key).")] = 50,
    chats: Annotated[int, typer.Option(min=1, help="Chats.")] = 20,
    ops: Annotated[
        int, typer.Option(min=0, help="Ops (messages, member changes, identities).")
    ] = 10_000,
    faults: Annotated[
        str, typer.Option(help=f"all, none, or a comma list of: {', '.join(FAULTS)}.")
    ] = "all",
    duration_s: Annotated[
        float, typer.Option(min=1, help="Simulated seconds of workload.")
    ] = 600.0,
    retention_s: Annotated[
        float | None, typer.Option(help="Retention (default: the final GC keeps about half).")
    ] = None,
    anti_entropy_s: Annotated[
        float, typer.Option(min=0.1, help="Seconds between sessions.")
    ] = 10.0,
    tie_rate: Annotated[
        float, typer.Option(min=0, max=1, help="Share of same-stamp twins.")
    ] = 0.05,
    seed: Annotated[int, typer.Option(min=0, help="Seed: same seed, same trace.")] = 1,
    plant: Annotated[
        Bug | None,
        typer.Option(hidden=True, help="Test only: a planted bug of the generator's clients."),
    ] = None,
    scope_shards: Annotated[
        int,
        typer.Option(
            min=0, max=MAX_SHARDS, help="Partial replication: S shards (0: every node full)."
        ),
    ] = 0,
    replication: Annotated[
        int, typer.Option(min=1, help="Scoped: each shard pinned on this many nodes.")
    ] = 3,
) -> None:
    """Write a trace of real signed ops and a fault schedule."""
    if plant is not None and plant not in GENERATOR_BUGS:
        raise typer.BadParameter(f"{plant.value} is planted in the nodes: sim run --plant")
    try:
        kinds = parse_faults(faults)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    params = GenParams(
        nodes=nodes,
        users=users,
        chats=chats,
        ops=ops,
        seed=seed,
        faults=kinds,
        duration_s=duration_s,
        retention_s=retention_s,
        anti_entropy_ms=int(anti_entropy_s * 1000),
        tie_rate=tie_rate,
        plant=plant.value if plant else None,
        scope_shards=scope_shards,
        replication=replication,
    )
    t0 = time.perf_counter()
    result = generate(params, out)
    took = time.perf_counter() - t0
    Console().print(
        f"wrote {out}: {result.ops:,} ops, {result.faults:,} fault events, {nodes} nodes "
        f"in {took:.1f} s ({result.ops / max(took, 1e-9):,.0f} ops/s)"
        + (f"; far-future clock on node {result.poisoned}" if result.poisoned else "")
    )


@sim_app.command("run")
def run_cmd(
    trace: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Trace file.")],
    master: Annotated[str, typer.Option(help="Spark master URL.")] = "local[*]",
    shards: Annotated[
        int,
        typer.Option(
            min=0,
            max=MAX_SIM_SHARDS,
            help="Shards: ranges of chats and users, one Spark task each. 0: one a core, more"
            f" where a task would pass {TASK_BUDGET_BYTES / 1e9:g} GB (the report says how many).",
        ),
    ] = 0,
    out: Annotated[Path | None, typer.Option(help="Report directory.")] = None,
    plant: Annotated[
        Bug | None, typer.Option(hidden=True, help="Test only: plant a bug in the simulated nodes.")
    ] = None,
    peering: Annotated[
        Peering,
        typer.Option(
            help="Who syncs with whom: uniform (any node, hashed) or discovery (the overlay)."
        ),
    ] = Peering.UNIFORM,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Replay TRACE on Spark, check every live node against the oracle, write the report."""
    from sim.report import summary, write_report
    from sim.runner import run_simulation
    from sim.spark import spark_session

    console = Console(stderr=True)
    out = out or DEFAULT_OUT / trace.stem
    warnings.filterwarnings("ignore", module="pyspark")
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%"),
        TimeElapsedColumn(),
        console=console,
        disable=not progress,
        transient=True,
    ) as bar:
        task = bar.add_task("starting Spark", total=1.0)
        owned = SparkSession.getActiveSession() is None  # in-process callers keep theirs
        spark = spark_session(master)
        log = _ProgressLog(enabled=progress and not console.is_terminal)

        def show(fraction: float, what: str) -> None:
            bar.update(task, completed=fraction, description=what)
            log(f"{fraction:6.1%} {what}")

        outcome = run_simulation(
            spark,
            trace,
            shards=shards or None,
            plant=plant.value if plant else None,
            peering=peering.value,
            on_progress=show,
        )
    paths = write_report(outcome, out)
    print(summary(outcome))
    print(f"report: {paths['json']}, {paths['png']}, {paths['summary']}")
    if owned:
        spark.stop()
    if not outcome.ok:
        print(
            f"FAILED — seed {outcome.header.seed}; replay with:\n  {outcome.replay}",
            file=sys.stderr,
        )
        raise typer.Exit(1)


class _ProgressLog:
    """Progress as plain lines on stderr where no terminal shows the bar (a log file, a
    pipe): a run of hours otherwise says nothing until its end."""

    every_s = 60.0

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._last = -math.inf

    def __call__(self, what: str) -> None:
        now = time.monotonic()
        if self.enabled and now - self._last >= self.every_s:
            self._last = now
            print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


@sim_app.command("workers")
def workers_cmd(
    trace: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Trace file.")],
    workers: Annotated[
        str, typer.Option(help="Worker counts to compare, comma-separated.")
    ] = "1,2",
    cores: Annotated[int, typer.Option(min=1, help="Cores per worker.")] = 1,
    memory: Annotated[str, typer.Option(help="Memory per worker (its executors' JVMs).")] = "2g",
    shards: Annotated[
        int,
        typer.Option(
            min=1,
            max=MAX_SIM_SHARDS,
            help="Shards: ranges of chats and users, one Spark task each.",
        ),
    ] = 8,
    out: Annotated[Path | None, typer.Option(help="Report directory.")] = None,
) -> None:
    """Replay TRACE on a standalone cluster on this machine (master and workers from
    pyspark's own scripts) once per worker count: does another executor add speed?"""
    from sim.workers import COLUMNS, measure_workers, problems, table_rows, write_report

    counts = _int_list(workers, "--workers", 1)
    console = Console(width=max(Console().width, 120))
    warnings.filterwarnings("ignore", module="pyspark")
    log = _ProgressLog(enabled=not console.is_terminal)
    with console.status("starting") as status:

        def note(what: str) -> None:
            status.update(what)
            log(what)

        runs = measure_workers(trace, counts, shards=shards, cores=cores, memory=memory, note=note)
    for run in runs:
        console.print(f"[bold]{run.workers} worker(s)[/bold]\n{run.summary}", highlight=False)
    title = f"{trace.name}: {shards} shards on standalone clusters of {workers} worker(s)"
    _print_table(console, title, COLUMNS, table_rows(runs))
    command = (
        f"chatsync sim workers {trace} --workers {workers} --cores {cores} "
        f"--memory {memory} --shards {shards}"
    )
    path = write_report(runs, out or DEFAULT_OUT / trace.stem, command)
    found = problems(runs)
    console.print(
        "OK: every run gave the same result" if not found else "FAILED: " + "; ".join(found)
    )
    console.print(f"report: {path}")
    if found:
        raise typer.Exit(1)


@sim_app.command("bugs")
def bugs_cmd(
    max_seeds: Annotated[int, typer.Option(min=1, help="Seeds to try per bug.")] = 200,
    master: Annotated[str, typer.Option(help="Spark master URL.")] = "local[*]",
    out: Annotated[Path | None, typer.Option(help="Also write the table as JSON here.")] = None,
    only: Annotated[
        str | None, typer.Option(help="Hunt these bugs only (comma-separated names).")
    ] = None,
) -> None:
    """The planted-bug table: for each bug, the seeds tried until the check caught it."""
    from sim.hunt import SCOPED_SMALL, SMALL, hunt

    chosen = list(Bug) if only is None else [Bug(name.strip()) for name in only.split(",")]
    from sim.spark import spark_session

    console = Console()
    warnings.filterwarnings("ignore", module="pyspark")
    owned = SparkSession.getActiveSession() is None
    spark = spark_session(master)
    rows = []
    with console.status("hunting") as status:
        for bug in chosen:
            found = hunt(
                spark,
                bug,
                max_seeds=max_seeds,
                on_seed=lambda b, s: status.update(f"{b.value}: seed {s}"),
            )
            rows.append(found)
    if owned:
        spark.stop()
    table = Table(
        title=f"planted bugs (small traces: {SMALL}, all faults; scope bugs: {SCOPED_SMALL})"
    )
    for column in ("bug", "seeds tried until caught", "what the check saw"):
        table.add_column(column)
    for r in rows:
        table.add_row(r.bug, str(r.caught_at) if r.caught_at else f"not in {r.seeds_tried}", r.why)
    console.print(table)
    if out is not None:
        out.write_text(json.dumps([r.__dict__ for r in rows], indent=1) + "\n")
    if any(r.caught_at is None for r in rows):
        raise typer.Exit(1)


@sim_app.command("scale")
def scale_cmd(
    nodes: Annotated[
        str, typer.Option(help="Network sizes, comma-separated.")
    ] = "100,300,1000,3000,10000",
    seed: Annotated[int, typer.Option(min=0, help="Seed: same seed, same runs.")] = 1,
    sample: Annotated[int, typer.Option(min=0, help="Real sync sessions measured per round.")] = 12,
    heal_sample: Annotated[
        int, typer.Option(min=0, help="... per round after the heal (replicas of ~N records).")
    ] = 8,
    out: Annotated[Path, typer.Option(help="Report directory.")] = DEFAULT_OUT / "scale",
    plant: Annotated[
        PeeringBug | None, typer.Option(hidden=True, help="Test only: plant a peering bug.")
    ] = None,
    turnover: Annotated[
        bool, typer.Option(help="One more dial per exchange between the waters (node/peers.py).")
    ] = True,
) -> None:
    """Peering by discovery as the network grows: per-node cost, and rounds to converge after
    a partition heals (SIM.md, "Peering by discovery"). Plain Python, no Spark."""
    from sim.scale import ScaleParams, run_scale
    from sim.scale_report import TABLE_CAPTION, TABLE_COLUMNS, table_rows, verdict, write_report

    sizes = _int_list(nodes, "--nodes", 8)
    console = Console(width=max(Console().width, 120))
    results = []
    with console.status("starting") as status:
        for n in sizes:
            params = ScaleParams(
                nodes=n,
                seed=seed,
                sample=sample,
                heal_sample=heal_sample,
                plant=plant.value if plant else None,
                turnover=turnover,
            )

            def note(phase: str, number: int, n: int = n) -> None:
                status.update(f"N={n:,}: {phase}, round {number}")

            results.append(run_scale(params, note))
    title = "peering by discovery: per node per round (steady), and after a partition heals"
    title += f" — planted bug {plant.value}" if plant else ""
    _print_table(console, title, TABLE_COLUMNS, table_rows(results), TABLE_CAPTION)
    command = (
        f"chatsync sim scale --nodes {nodes} --seed {seed} --sample {sample} "
        f"--heal-sample {heal_sample}"
        + (f" --plant {plant.value}" if plant else "")
        + ("" if turnover else " --no-turnover")
    )
    paths = write_report(results, out, command)
    ok, problems = verdict(results)
    mismatches = sum(r.model_mismatches for r in results)
    sampled = sum(r.sampled_sessions for r in results)
    console.print(
        f"{sampled:,} real sessions sampled, {mismatches} moved other records than the set model"
    )
    console.print("OK" if ok else "FAILED: " + "; ".join(problems))
    console.print(f"report: {paths['json']}, {paths['png']}")
    if not ok or mismatches:
        raise typer.Exit(1)


def _int_list(text: str, option: str, least: int) -> list[int]:
    """A comma-separated list of integers, each at least ``least``, or a clear error."""
    try:
        values = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"{option}: comma-separated integers, got {text!r}") from None
    if not values or min(values) < least:
        raise typer.BadParameter(f"{option}: at least one value, each >= {least}, got {text!r}")
    return values


def _print_table(
    console: Console,
    title: str,
    columns: Iterable[str],
    rows: Iterable[list[str]],
    caption: str | None = None,
) -> None:
    table = Table(title=title, caption=caption)
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)


@sim_app.command("merge")
def merge_cmd(
    recordings: Annotated[
        list[Path], typer.Argument(exists=True, dir_okay=False, help="Node i's --trace-out file.")
    ],
    out: Annotated[Path, typer.Option("-o", "--out", help="The merged trace.")] = Path(
        "recorded.parquet"
    ),
) -> None:
    """Join several nodes' --trace-out recordings into one trace (node i = the i-th file)."""
    from store.trace import merge_traces

    try:
        header = merge_traces(recordings, out)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    print(f"{out}: {header.nodes} nodes, {header.ops:,} ops; replay: chatsync sim run {out}")


@sim_app.command("info")
def info_cmd(trace: Annotated[Path, typer.Argument(exists=True, dir_okay=False)]) -> None:
    """Print a trace's header and its events by kind."""
    from store.trace import read_trace

    t = read_trace(trace, columns=["kind"])
    counts = t.table.group_by("kind").aggregate([("kind", "count")]).to_pylist()
    print(json.dumps(t.header.__dict__, indent=1, sort_keys=True))
    for row in sorted(counts, key=lambda r: r["kind"]):
        print(f"{row['kind']:>18}  {row['kind_count']:,}")
