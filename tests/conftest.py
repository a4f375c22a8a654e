"""Shared pytest setup: Hypothesis profiles and a real ChatDb in a temporary directory."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from store import ChatDb, ChatDbConfig

# dev (default): quick local runs; ci: more examples. Tests that open RocksDB per example
# pin their own, smaller max_examples with @settings and inherit deadline=None from here.
settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile("ci", max_examples=300, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture
def db(tmp_path: Path) -> Iterator[ChatDb]:
    """A fresh ChatDb on real RocksDB with small caches, closed after the test."""
    chat_db = ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=tmp_path / "chatdb")
    yield chat_db
    chat_db.close()
