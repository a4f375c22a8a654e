"""``chatsync chaos``: fault injection on real node processes, and the checker (issue 38)."""

from __future__ import annotations

import random
import signal
from pathlib import Path
from types import FrameType

import typer

from chaos.schedule import KINDS, check_kinds


def chaos(
    nodes: int = typer.Option(5, min=2, max=9, help="Node processes."),
    duration: float = typer.Option(300.0, min=5, help="Seconds of workload and faults."),
    seed: int = typer.Option(
        None, help="The schedule's and workload's seed (printed; default: random)."
    ),
    nemesis: str = typer.Option(
        ",".join(KINDS), help=f"Fault kinds, comma-separated: {', '.join(KINDS)}."
    ),
    durable: bool = typer.Option(
        True, "--durable/--no-durable", help="Nodes ack only after the WAL sync."
    ),
    rate: float = typer.Option(40.0, min=0.1, help="Requests per second, all workers together."),
    batch: int = typer.Option(12, min=1, max=100, help="Ops per request, at most."),
    members: int = typer.Option(
        4, min=1, max=20, help="Member users (a worker and a session each)."
    ),
    chats: int = typer.Option(3, min=1, max=20, help="Group chats."),
    plant: str = typer.Option(
        "", help="A planted fault: ack-before-wal, drop-one-in-N (node/plants.py)."
    ),
    plant_nodes: str = typer.Option(
        "", help="Nodes that get the plant, comma-separated (default: all)."
    ),
    oracle: bool = typer.Option(
        True, "--oracle/--no-oracle", help="Check views against the simulator's oracle (Spark)."
    ),
    data: Path = typer.Option(
        None, help="Directory for the nodes' data (wiped first, kept); default: temporary."
    ),
    out: Path = typer.Option(
        Path("bench-results/chaos.json"), help="JSON report (the plot: .png beside it)."
    ),
) -> None:
    """Real nodes under kill -9, pauses, partitions, clock skew and full disks; a checker that
    nothing acknowledged is lost. Exit status 1 if any counter is not 0."""
    from chaos.runner import ChaosParams, run_chaos

    kinds = tuple(k.strip() for k in nemesis.split(",") if k.strip())
    try:
        check_kinds(kinds)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    params = ChaosParams(
        nodes=nodes, duration_s=duration, seed=random.randrange(2**31) if seed is None else seed,
        kinds=kinds, members=members, chats=chats, rate=rate, batch=batch, durable=durable,
        plant=plant, plant_nodes=[int(x) for x in plant_nodes.split(",")] if plant_nodes else None,
        oracle=oracle, data=data, out=out,
    )  # fmt: skip
    signal.signal(signal.SIGTERM, _interrupt)  # stop and clean up (nodes, tmpfs) as on Ctrl-C
    result = run_chaos(params, typer.echo)
    raise typer.Exit(0 if result["ok"] else 1)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
