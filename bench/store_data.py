"""The store benchmark's data: its parameters and the rates it measures (plain dataclasses).

Shared by the run (``store_bench``) and the report (``store_report``), so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StoreBenchParams:
    messages: int = 200_000
    chats: int = 100
    batch: int = 1000
    payload: int = 200
    single: int = 20_000  # messages for the one-at-a-time runs (capped at ``messages``)
    page: int = 50
    range_chats: int = 25  # whole chats walked by each range reader
    list_calls: int = 2_000
    out: Path = Path("bench-results/store.json")
    data: Path | None = None  # None: a temporary directory, removed afterwards


@dataclass(frozen=True)
class Rate:
    count: int
    seconds: float
    unit: str
    items: int = 0  # messages returned, for page reads

    @property
    def per_s(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0


Rates = dict[str, dict[str, Rate]]  # operation -> contender -> rate
