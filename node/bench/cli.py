"""``chatsync bench`` subcommands."""

from __future__ import annotations

import typer

bench_app = typer.Typer(help="Benchmarks: side-by-side figures saved as JSON.", no_args_is_help=True)
