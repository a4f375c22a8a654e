"""How every benchmark prints: its console, its progress bars, and the cells its tables share.

A benchmark's tables are its result, so a run logged to a file (not a terminal) gets a fixed,
wide console that keeps each table whole instead of the 80 columns rich would assume.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

T = TypeVar("T")


def bench_console(log_width: int) -> Console:
    """The terminal's console, or one ``log_width`` columns wide when output goes to a log."""
    console = Console()
    return console if console.is_terminal else Console(width=log_width)


def bench_progress(console: Console, label_width: int) -> Progress:
    """Progress bars: a label padded to ``label_width``, the bar, done/total, time elapsed."""
    return Progress(
        TextColumn(f"{{task.description:<{label_width}}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def save_report(console: Console, report: dict[str, Any], out: Path) -> None:
    """Write the JSON document to ``out`` (creating its directory) and say where it went."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"saved {out}")


def tracked(progress: Progress, label: str, items: Sequence[T]) -> Iterator[T]:
    """``items`` one by one, behind a progress bar that moves about a hundred times."""
    task = progress.add_task(label, total=len(items))
    step = max(1, len(items) // 100)
    for i, item in enumerate(items):
        yield item
        if i % step == step - 1 or i == len(items) - 1:
            progress.advance(task, i % step + 1)
    progress.remove_task(task)


def red_unless(text: str, ok: bool) -> str:
    """``text``, in red when the figure misses what it should meet."""
    return text if ok else f"[red]{text}[/]"


def check_mark(ok: bool) -> str:
    """A green tick or a red cross."""
    return "[green]✓[/]" if ok else "[red]✗[/]"


def byte_size(value: float | None) -> str:
    """Bytes for a table cell: B below 10,000, then kB, then MB; ``—`` for no figure."""
    if value is None:
        return "—"
    if value < 10_000:
        return f"{value:,.0f} B"
    if value < 1_000_000:
        return f"{value / 1e3:.1f} kB"
    return f"{value / 1e6:.2f} MB"
