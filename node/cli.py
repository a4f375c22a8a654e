"""The ``chatsync`` command line (typer).

Node operators: ``chatsync node run``, ``chatsync demo``, ``chatsync bench ...``.
Users (``node.user_cli``): ``keygen``, ``publish``, ``send``, ``history``, ``status``.
"""

from __future__ import annotations

import typer

from node.bench.cli import bench_app
from node.demo import store_demo
from node.user_cli import register as register_user_commands
from sim.cli import sim_app

app = typer.Typer(
    name="chatsync",
    help="Peer-to-peer sync node for chat data.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(bench_app, name="bench")
app.add_typer(sim_app, name="sim")
node_app = typer.Typer(help="Run a node.", no_args_is_help=True)
app.add_typer(node_app, name="node")
register_user_commands(app)


@node_app.command("run")
def node_run(
    data: str = typer.Option(None, help="RocksDB directory [default: ./chatdb-data]."),
    listen: str = typer.Option(None, help="libp2p listen multiaddr, e.g. /ip4/127.0.0.1/tcp/4001."),
    http: str = typer.Option(None, help="HTTP API host:port, e.g. 127.0.0.1:8080."),
    bootstrap: list[str] = typer.Option(None, help="Peer multiaddr with /p2p/ id; repeatable."),
    key: str = typer.Option(None, help="libp2p identity file [default: DATA/node.key]."),
    config: str = typer.Option(None, help="TOML file with a [node] table; flags override it."),
    durable: bool = typer.Option(
        None, "--durable/--no-durable", help="Ack writes only once in the WAL."
    ),
    sync_interval: float = typer.Option(None, help="Seconds between anti-entropy rounds per peer."),
    retention_days: float = typer.Option(None, help="Expire messages older than this (0: keep)."),
    max_storage_mb: int = typer.Option(
        None, help="Expire oldest messages above this size (0: no cap)."
    ),
    gc_interval: float = typer.Option(None, help="Seconds between retention GC cycles."),
    min_free_disk_mb: int = typer.Option(None, help="Refuse writes below this much free disk."),
    trace_out: str = typer.Option(
        None, help="Record the ops clients submit as a simulator trace (Parquet; SIM.md)."
    ),
    log_level: str = typer.Option("INFO", help="Logging level."),
) -> None:
    """Run a node until SIGINT/SIGTERM (then: tasks cancelled, writer drained, RocksDB closed)."""
    from node.config import load_config
    from node.run import run_node

    overrides = {
        "data": data, "listen": listen, "http": http, "bootstrap": bootstrap or None,
        "key": key, "durable": durable, "sync_interval_s": sync_interval,
        "retention_days": retention_days, "max_storage_mb": max_storage_mb,
        "gc_interval_s": gc_interval,
        "min_free_disk_mb": min_free_disk_mb, "trace_out": trace_out,
    }  # fmt: skip
    try:
        cfg = load_config(config, overrides)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from None
    run_node(cfg, log_level)


@app.command("demo")
def demo(
    data: str = typer.Option("./demo-data", help="RocksDB directory (wiped first)."),
    messages: int = typer.Option(10_000, min=1, help="Messages to write."),
    chats: int = typer.Option(20, min=1, help="Chats to spread them over."),
) -> None:
    """Store demo: write signed messages, members and identities, then page and list them."""
    store_demo(data, messages=messages, chats=chats)


@app.command("cluster")
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
) -> None:
    """Run N nodes on loopback (until Ctrl-C), or the scripted scenario with --scenario."""
    import shutil
    import time
    from pathlib import Path

    from node.cluster import Cluster
    from node.scenario import run_scenario

    shutil.rmtree(data, ignore_errors=True)
    if scenario:
        result = run_scenario(nodes, Path(data), per_phase=messages, out=Path(out))
        raise typer.Exit(0 if result["converged"] and result["diverged_during_partition"] else 1)
    with Cluster(nodes, Path(data), log_level="INFO") as running:
        running.start()
        for node in running.nodes:
            typer.echo(f"node {node.index}: {node.url}  {node.multiaddr}  (log {node.log_path})")
        typer.echo("Ctrl-C stops the cluster.")
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            typer.echo("stopping")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
