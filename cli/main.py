"""The root ``chatsync`` command: it only composes the sub-apps of the other packages.

``node`` (``node.cli``), ``bench`` and ``demo`` (``bench.cli``), ``cluster``
(``cluster.cli``), ``chaos`` (``chaos.cli``), the user commands ``keygen``, ``publish``, ``send``, ``history``,
``chats``, ``status`` (``client.commands``), ``edit``, ``delete``, ``react``, ``read``
(``client.edits``), ``export``, ``import`` (``client.backup_commands``), ``group``
(``client.groups``), ``dm3`` (``client.dm3``), and ``sim``
(``sim.cli``). ``sim`` is imported only when a ``sim`` command runs: it loads PySpark,
seconds of start-up no other command needs; otherwise an empty placeholder with the same
help stands in its place in ``--help``.

Help text is plain (``rich_markup_mode=None``, inherited by every sub-app mounted here), so
``[node]`` or ``[default: ...]`` in a help string is shown as written.
"""

from __future__ import annotations

import importlib.metadata
import sys

import typer

from bench.cli import bench_app, demo
from chaos.cli import chaos
from client.backup_commands import register as register_backup_commands
from client.commands import register as register_user_commands
from client.dm3 import dm3_app
from client.edits import register as register_edit_commands
from client.groups import group_app
from client.watch import register as register_watch
from cluster.cli import cluster
from node.cli import node_app

SIM_HELP = "Spark simulator: replay multi-node traces through store/ and sync/, check convergence."


def sim_app(*, load: bool) -> typer.Typer:
    """The simulator's sub-app if ``load``, else the placeholder that lists it in ``--help``."""
    if not load:
        return typer.Typer()
    from sim.cli import sim_app as real

    return real


def build_app(*, with_sim: bool = False) -> typer.Typer:
    """The ``chatsync`` app; ``with_sim`` imports the simulator (and PySpark)."""
    app = typer.Typer(
        name="chatsync",
        help="Peer-to-peer sync node for chat data.",
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode=None,
    )
    app.add_typer(bench_app, name="bench")
    app.add_typer(sim_app(load=with_sim), name="sim", help=SIM_HELP)
    app.add_typer(node_app, name="node")
    register_user_commands(app)
    register_edit_commands(app)
    register_watch(app)
    register_backup_commands(app)
    app.add_typer(group_app, name="group")
    app.add_typer(dm3_app, name="dm3")
    app.command("demo")(demo)
    app.command("cluster")(cluster)
    app.command("chaos")(chaos)
    app.callback()(root)
    return app


def print_version(value: bool) -> None:
    if value:  # eager: before the missing-command check, like --help
        typer.echo(f"chatsync {importlib.metadata.version('chatsync')}")
        raise typer.Exit()


def root(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=print_version, help="Print the version."
    ),
) -> None:
    """Peer-to-peer sync node for chat data."""


def main() -> None:
    build_app(with_sim=sys.argv[1:2] == ["sim"])()


if __name__ == "__main__":
    main()
