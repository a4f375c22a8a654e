"""A node's scope (SYNC.md, "Scopes"): ``--scope`` / ``--full`` and the config keys, refused
when they cannot be, and a store holding chats outside the scope refused at start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from node.config import load_config, parse_scope
from node.errors import StartupRefused
from node.intake import OpIntake, OutsideScope, refuse_outside_scope
from node.limits import AuthorRates
from node.metrics import Metrics
from node.node import open_replica
from store import ChatDb, ChatDbConfig, Hlc, MsgV1
from store.plan import ADMIT_ALL
from store.signing import key_from_seed
from sync.scope import DEFAULT_SHARDS, EVERYTHING, Scope, shard_of

CHAT = b"\x11" * 32


def test_full_is_the_default_and_a_scope_is_a_set_of_shards(tmp_path: Path) -> None:
    assert load_config(None, {}).scope == EVERYTHING
    config = load_config(None, {"scope_shards": (3, 1), "network_shards": 64})
    assert config.scope == Scope(frozenset({1, 3}), 64)
    toml = tmp_path / "node.toml"
    toml.write_text("[node]\nscope_shards = [0, 7]\nnetwork_shards = 8\n")
    assert load_config(str(toml), {}).scope == Scope(frozenset({0, 7}), 8)


@pytest.mark.parametrize(
    "overrides",
    [
        {"scope_shards": (DEFAULT_SHARDS,)},  # out of range
        {"network_shards": 1_000_000},  # a million shards
        {"network_shards": 0},
    ],
)
def test_a_scope_that_cannot_be_is_refused_at_load(overrides: dict[str, object]) -> None:
    with pytest.raises(StartupRefused, match="scope_shards and network_shards"):
        load_config(None, overrides)


def test_the_scope_flag_parses_shard_numbers() -> None:
    assert parse_scope("17, 0,5,5") == (0, 5, 17)
    for bad in ("a", "1;2", "-1", "½"):
        with pytest.raises(StartupRefused, match="--scope"):
            parse_scope(bad)


def test_full_and_scope_together_are_refused(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "node.cli", "run", "--full", "--scope", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == "chatsync: --full and --scope: choose one\n"


def test_a_store_holding_chats_outside_the_scope_is_refused(tmp_path: Path) -> None:
    db = ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=tmp_path / "db")
    try:
        msg = MsgV1.create(key_from_seed(b"\x01" * 32), CHAT, Hlc(1_000), b"hi")
        db.apply_ops([msg], rules=ADMIT_ALL)  # stored, members or not
        home = shard_of(CHAT, DEFAULT_SHARDS)
        inside = load_config(None, {"scope_shards": (home,), "data": str(tmp_path / "db")})
        assert open_replica(db, inside).scope == inside.scope
        other = (home + 1) % DEFAULT_SHARDS
        outside = load_config(None, {"scope_shards": (other,), "data": str(tmp_path / "db")})
        with pytest.raises(StartupRefused, match="narrowing is not built"):
            open_replica(db, outside)
    finally:
        db.close()


def test_the_api_refuses_a_message_of_a_chat_outside_the_scope(tmp_path: Path) -> None:
    """A scoped node's intake refuses (``out_of_scope``) what its store would not write,
    instead of acknowledging a message it drops; chats inside the scope pass this check."""
    db = ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=tmp_path / "db")
    try:
        home = shard_of(CHAT, DEFAULT_SHARDS)
        metrics = Metrics()
        intake = OpIntake(
            db, None, None, AuthorRates(1_000.0, 1_000.0), metrics, None,  # type: ignore[arg-type]
            max_offset_ms=60_000, scope=Scope(frozenset({(home + 1) % DEFAULT_SHARDS})),
        )  # fmt: skip
        msg = MsgV1.create(key_from_seed(b"\x01" * 32), CHAT, Hlc(1_000), b"hi")
        with pytest.raises(OutsideScope, match=f"shard {home}") as info:
            intake.check([msg], now_ms=1_000)
        assert info.value.reason == "out_of_scope"
        intake.scope = Scope(frozenset({home}))
        intake.check([msg], now_ms=1_000)  # inside: this check passes
        refuse_outside_scope(EVERYTHING, [msg])  # a full node holds every chat
    finally:
        db.close()
