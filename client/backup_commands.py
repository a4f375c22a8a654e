"""``chatsync export`` and ``chatsync import``: a user's history as dm3 storage containers
(``client.backup``, ``dm3.containers``), with a progress bar and a one-line summary.

Import opens and checks every container and every op before it submits the first one: a
tampered, truncated or incomplete export, or another user's, is one red line and nothing is
written. Failures are one line and exit status 1, as in ``client.commands``.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from client.backup import (
    check_empty_dir,
    fetch_history,
    read_containers,
    submission_order,
    submit,
    write_containers,
)
from client.http import ChatsyncClient
from client.shell import DEFAULT_KEY_FILE, DEFAULT_NODE, clear_errors, console, load_key
from dm3.containers import (
    DEFAULT_CHUNK_BYTES,
    build_containers,
    check_chunk_limit,
    open_containers,
)

KEY = typer.Option(DEFAULT_KEY_FILE, "--key", help="Your key file.")
NODE = typer.Option(DEFAULT_NODE, "--node", help="Node HTTP URL.")


def progress_bar() -> Progress:
    """A bar on a terminal, gone when done; nothing when piped (the summary line stays)."""
    return Progress(
        TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal,
    )  # fmt: skip


def export(
    out: str = typer.Option(..., "--out", help="A new or empty directory for the containers."),
    key_file: str = KEY,
    node: str = NODE,
    max_chunk_bytes: int = typer.Option(
        DEFAULT_CHUNK_BYTES, "--max-chunk-bytes", help="Largest chunk file: 500000..10000000."
    ),
) -> None:
    """Write your history (chats, messages, membership, identity) as dm3 storage containers,
    encrypted with a key derived from yours."""
    key = load_key(key_file)
    with clear_errors():
        check_chunk_limit(max_chunk_bytes)
        check_empty_dir(Path(out))
        with ChatsyncClient(node, key=key.signing_key) as client, progress_bar() as bar:
            chats = bar.add_task("reading chats")

            def chat_read(done: int, total: int) -> None:
                bar.update(chats, completed=done, total=total)

            history = fetch_history(client, key.signing_key, chat_read)
            files = build_containers(key.signing_key, history, os.urandom, max_chunk_bytes)
            writing = bar.add_task("writing files", total=len(files))
            write_containers(Path(out), files, lambda: bar.advance(writing))
    chunks = len(files) - 1 - sum(1 for ops in history.chats.values() if ops)  # - root, convs
    size = sum(map(len, files.values()))
    console.print(
        f"exported {len(history.chats)} chats, {history.op_count} ops in {chunks} chunks "
        f"({size:,} bytes) to {out}",
        soft_wrap=True,
    )


def import_(
    source: str = typer.Option(..., "--from", help="The directory of an export."),
    key_file: str = KEY,
    node: str = NODE,
) -> None:
    """Restore your history from an export: check every container, then re-submit the signed
    originals (ids unchanged; what the node holds already is not duplicated)."""
    key = load_key(key_file)
    with clear_errors():
        opened = open_containers(read_containers(Path(source)), key.signing_key)
        phases = submission_order(opened.history)
        with ChatsyncClient(node, key=key.signing_key) as client, progress_bar() as bar:
            sending = bar.add_task("submitting ops", total=opened.history.op_count)
            new = submit(client, phases, lambda n: bar.advance(sending, n))
    console.print(
        f"imported {len(opened.history.chats)} chats, {opened.history.op_count} ops ({new} new) from "
        f"{opened.chunks} chunks ({opened.bytes:,} bytes)",
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    app.command("export")(export)
    app.command("import")(import_)
