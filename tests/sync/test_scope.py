"""Scopes (sync/scope.py): the algebra, and replicas that hold everything serve only that."""

from __future__ import annotations

from pathlib import Path

import pytest

from store import ChatDb
from sync.frames import Domain
from sync.protocol import SessionRole, SyncConfig, SyncSession
from sync.replica import DbReplica, MemoryReplica
from sync.scope import EVERYTHING, Scope, ScopeNotServed

A, B, C = b"\x0a" * 32, b"\x0b" * 32, b"\x0c" * 32


def test_everything_holds_and_covers_every_scope() -> None:
    assert EVERYTHING.holds(A) and EVERYTHING.covers(Scope(frozenset({A, B})))
    assert EVERYTHING.covers(EVERYTHING)
    assert not Scope(frozenset({A})).covers(EVERYTHING)


def test_chat_scopes_cover_and_intersect() -> None:
    ab, bc = Scope(frozenset({A, B})), Scope(frozenset({B, C}))
    assert ab.holds(A) and not ab.holds(C)
    assert ab.covers(Scope(frozenset({B}))) and not ab.covers(bc)
    assert ab & bc == Scope(frozenset({B}))
    assert ab & EVERYTHING == ab and EVERYTHING & bc == bc


@pytest.mark.parametrize("kind", ["memory", "db"])
def test_a_replica_of_everything_serves_no_narrower_scope(kind: str, tmp_path: Path) -> None:
    db = ChatDb(path=tmp_path / "db") if kind == "db" else None
    try:
        replica = DbReplica(db) if db is not None else MemoryReplica()
        narrow = Scope(frozenset({A}))
        assert (
            replica.tree(Domain.MESSAGES, EVERYTHING).root() == replica.tree(Domain.MESSAGES).root()
        )
        assert replica.bucket_ids(Domain.MESSAGES, 0, None, EVERYTHING) == []
        with pytest.raises(ScopeNotServed):
            replica.tree(Domain.MESSAGES, narrow)
        with pytest.raises(ScopeNotServed):
            replica.bucket_ids(Domain.MESSAGES, 0, None, narrow)
        with pytest.raises(ScopeNotServed):
            replica.get_records(Domain.MESSAGES, [bytes(32)], None, None, narrow)
    finally:
        if db is not None:
            db.close()


def test_a_session_over_a_scope_its_replica_does_not_serve_is_a_local_error() -> None:
    """Our own misuse (LocalProtocolError), not the peer's fault: nothing is sent."""
    config = SyncConfig(scope=Scope(frozenset({A})))
    session = SyncSession(SessionRole.INITIATOR, MemoryReplica(), now_ms=0, config=config)
    with pytest.raises(ScopeNotServed):
        session.start(0)
