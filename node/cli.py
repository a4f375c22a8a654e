"""The ``chatsync`` command line (typer)."""

from __future__ import annotations

import typer

from node.bench.cli import bench_app
from node.demo import store_demo

app = typer.Typer(
    name="chatsync",
    help="Peer-to-peer sync node for chat data.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(bench_app, name="bench")


@app.command("demo")
def demo(
    data: str = typer.Option("./demo-data", help="RocksDB directory (wiped first)."),
    messages: int = typer.Option(10_000, min=1, help="Messages to write."),
    chats: int = typer.Option(20, min=1, help="Chats to spread them over."),
) -> None:
    """Store demo: write signed messages, members and identities, then page and list them."""
    store_demo(data, messages=messages, chats=chats)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
