"""``chatsync cluster``: N nodes on loopback until Ctrl-C, or the scripted scenario."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import typer


def cluster(
    nodes: int = typer.Option(3, min=1, max=50, help="Node processes to run on loopback."),
    data: str = typer.Option("./cluster-data", help="Directory for the nodes' data (wiped first)."),
    scenario: bool = typer.Option(
        False, help="Run the scripted partition/heal scenario, then exit."
    ),
    messages: int = typer.Option(300, min=1, help="Messages per scenario phase."),
    out: str = typer.Option(
        "bench-results/cluster.json", help="Where the scenario saves its figures."
    ),
    bootstrap_nodes: int = typer.Option(
        1,
        min=0,
        help="Later nodes know only the first this many; the rest they find by "
        "peer exchange (0: every node before them).",
    ),
) -> None:
    """Run N nodes on loopback (until Ctrl-C), or the scripted scenario with --scenario."""
    from cluster.local import Cluster
    from cluster.scenario import run_scenario

    shutil.rmtree(data, ignore_errors=True)
    if scenario:
        result = run_scenario(nodes, Path(data), per_phase=messages, out=Path(out))
        raise typer.Exit(0 if result["converged"] and result["diverged_during_partition"] else 1)
    with Cluster(
        nodes, Path(data), log_level="INFO", bootstrap_nodes=bootstrap_nodes or None
    ) as running:
        running.start()
        for node in running.nodes:
            typer.echo(f"node {node.index}: {node.url}  {node.multiaddr}  (log {node.log_path})")
        typer.echo("Ctrl-C stops the cluster.")
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            typer.echo("stopping")
