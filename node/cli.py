"""``chatsync node``: the daemon's command line (``chatsync node run``).

The root ``chatsync`` command (``cli/main.py``) mounts ``node_app`` as ``node``; the
daemon runs on its own as ``python -m node.cli run ...`` (how ``cluster/local.py``
starts node processes), without the benchmarks, the client or the simulator.
"""

from __future__ import annotations

import dataclasses

import typer

node_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)


@node_app.callback()
def node() -> None:
    """Run a node."""


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
    scope: str = typer.Option(
        None, help="Hold only these shards, e.g. 0,5,17 (SYNC.md, Scopes) [default: --full]."
    ),
    full: bool = typer.Option(False, "--full", help="Hold every shard (the default)."),
    network_shards: int = typer.Option(None, help="The network's number of shards [256]."),
    log_level: str = typer.Option("INFO", help="Logging level."),
) -> None:
    """Run a node until SIGINT/SIGTERM (then: tasks cancelled, writer drained, RocksDB closed)."""
    from node.config import load_config, parse_scope
    from node.errors import StartupRefused

    overrides: dict[str, object] = {
        "data": data, "listen": listen, "http": http, "bootstrap": bootstrap or None,
        "key": key, "durable": durable, "sync_interval_s": sync_interval,
        "retention_days": retention_days, "max_storage_mb": max_storage_mb,
        "gc_interval_s": gc_interval,
        "min_free_disk_mb": min_free_disk_mb, "trace_out": trace_out,
        "network_shards": network_shards,
    }  # fmt: skip
    try:
        if full and scope is not None:
            raise StartupRefused("--full and --scope: choose one")
        overrides["scope_shards"] = parse_scope(scope) if scope is not None else None
        cfg = load_config(config, overrides)
        if full:  # over a config file's scope_shards
            cfg = dataclasses.replace(cfg, scope_shards=None)
        from node.run import run_node  # loads libp2p (1.6 s): after the config is checked

        run_node(cfg, log_level)
    except StartupRefused as exc:  # one line, no traceback (docs/OPERATING.md)
        typer.echo(f"chatsync: {exc}", err=True)
        raise typer.Exit(2) from None


if __name__ == "__main__":
    node_app(prog_name="chatsync node")
