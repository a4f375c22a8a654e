"""``chatsync cluster``: N nodes on loopback until Ctrl-C or SIGTERM, or the scripted scenario.

The data directory is the cluster's: it is wiped at each start, so a directory the command
did not make (no MARKER file in it) is refused unless empty or ``--wipe`` is given. SIGTERM
stops it as Ctrl-C does: every node it started is stopped before it exits. A node that dies
meanwhile stops the rest too (exit status 1): a cluster short of a node is not the one asked
for, and the line says where its log is.
"""

from __future__ import annotations

import re
import shutil
import signal
import time
from pathlib import Path
from types import FrameType

import typer

MARKER = ".chatsync-cluster"  # written into the data directory this command makes
NODE_ENTRY = re.compile(r"node\d+(\.log|\.toml)?")


def cluster(
    nodes: int = typer.Option(3, min=1, max=50, help="Node processes to run on loopback."),
    data: str = typer.Option(
        "./cluster-data", help="Directory for the nodes' data: made (and wiped) by this command."
    ),
    wipe: bool = typer.Option(
        False, "--wipe", help="Wipe --data even if this command did not make it."
    ),
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
    """Run N nodes on loopback (until Ctrl-C or SIGTERM), or the scripted scenario with
    --scenario."""
    from cluster.local import Cluster
    from cluster.scenario import run_scenario

    data_dir = Path(data)
    fresh_data_dir(data_dir, wipe=wipe)
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    if scenario:
        result = run_scenario(nodes, data_dir, per_phase=messages, out=Path(out))
        raise typer.Exit(0 if result["converged"] and result["diverged_during_partition"] else 1)
    died = None
    with Cluster(
        nodes, data_dir, log_level="INFO", bootstrap_nodes=bootstrap_nodes or None
    ) as running:
        try:
            running.start()
            for node in running.nodes:
                pid = node.proc.pid if node.proc is not None else "-"
                typer.echo(
                    f"node {node.index}: {node.url}  {node.multiaddr}  "
                    f"(pid {pid}, log {node.log_path})"
                )
            typer.echo("Ctrl-C stops the cluster.")
            while (died := next((n for n in running.nodes if not n.alive), None)) is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            typer.echo("stopping")
        except (RuntimeError, TimeoutError) as exc:  # a node that did not start
            typer.echo(f"error: {exc}; stopping the cluster", err=True)
            raise typer.Exit(1) from None
        finally:  # the nodes stop in Cluster.__exit__; a second signal must not cut that short
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if died is not None:
        code = died.proc.returncode if died.proc is not None else None
        typer.echo(
            f"error: node {died.index} exited (status {code}; log {died.log_path}); "
            "stopped the others",
            err=True,
        )
        raise typer.Exit(1)


def stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # the same way out as Ctrl-C: the nodes are stopped


def fresh_data_dir(path: Path, *, wipe: bool) -> None:
    """``path`` empty but for MARKER; refused (one line, exit 1) when it holds what this
    command did not put there, unless ``wipe``."""
    if path.exists() and not path.is_dir():
        fail_with(f"--data {path} is a file, not a directory")
    if path.is_dir() and any(path.iterdir()):
        if not made_here(path) and not wipe:
            fail_with(
                f"--data {path} is not empty and was not made by `chatsync cluster`; "
                "pass --wipe to delete what is in it, or name another directory"
            )
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).write_text("made by `chatsync cluster`: wiped at each start\n")


def made_here(path: Path) -> bool:
    """MARKER in it, or only what a cluster writes (nodeN/, nodeN.log, nodeN.toml): a data
    directory of this command from before it wrote the marker."""
    if (path / MARKER).exists():
        return True
    return all(NODE_ENTRY.fullmatch(entry.name) for entry in path.iterdir())


def fail_with(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)
