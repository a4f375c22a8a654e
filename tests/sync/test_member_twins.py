"""A member op lives in two trees: MEMBERS (its chat's shard) and INDEX (its user's user
shard). A session moves it once when the peer lacks it in both — the peer's one write files
it in both — and in the one tree it lacks when it lacks it in one (SYNC.md, "Scopes")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from store import ChatDb, ChatDbConfig, MsgV1
from store.ops import MembershipOp
from sync.frames import Domain
from sync.loopback import LoopbackResult, run_session
from sync.protocol import SyncConfig
from sync.replica import DbReplica, MemoryReplica
from sync.scope import Scope, shard_of, user_shard_of

from sync_support import CHATS, USERS, member, message, roots

S = 3


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatDb]:
    db = ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=tmp_path / "db")
    yield db
    db.close()


def ops(k: int) -> list[MembershipOp]:
    """k distinct member ops over every chat and user."""
    return [member(i % len(CHATS), i % len(USERS), 2_000 + i) for i in range(k)]


def shipped(result: LoopbackResult) -> int:
    return result.initiator.stats.records_sent + result.responder.stats.records_sent


def record_bytes(result: LoopbackResult) -> int:
    return result.bytes_sent["records"]


@pytest.mark.parametrize("sketch", [True, False], ids=["sketch", "cells"])
@pytest.mark.parametrize("lacking", ["initiator", "responder"])
@pytest.mark.parametrize("k", [1, 7, 40])
def test_full_replicas_ship_each_missing_member_op_once(
    store: ChatDb, sketch: bool, lacking: str, k: int
) -> None:
    """Before: 2k records (each op in MEMBERS and again in INDEX); now k."""
    common: list[MsgV1 | MembershipOp] = [message(n) for n in range(12)]
    common += ops(3)
    missing = ops(3 + k)[3:]
    full = DbReplica(store, admit_all=True)
    full.apply_ops([*common, *missing])
    behind = MemoryReplica(admit_all=True)
    behind.apply_ops(common)
    pair = (behind, full) if lacking == "initiator" else (full, behind)
    result = run_session(*pair, config=SyncConfig(sketch=sketch))
    assert result.converged
    assert shipped(result) == k
    assert record_bytes(result) == sum(len(op.encode()) for op in missing)
    assert roots(behind) == roots(full)
    held = {op.op_id for op in ops(3 + k)}
    assert set(behind.index) == set(behind.member_ops) == held


def scope(chats: tuple[int, ...], users: tuple[int, ...]) -> Scope:
    return Scope(
        frozenset(shard_of(CHATS[c], S) for c in chats),
        S,
        frozenset(user_shard_of(USERS[u], S) for u in users),
    )


def test_scoped_replicas_move_an_op_in_the_trees_of_the_intersection_only(store: ChatDb) -> None:
    """The intersection holds chat 0's shard and user 0's user shard: an op of chat 0 naming
    user 0 moves once (both trees), one of chat 0 naming another user in MEMBERS only, one
    of another chat naming user 0 in INDEX only; each side ends with the union of each
    shared tree, and nothing outside its scope."""
    shards = {c: shard_of(CHATS[c], S) for c in range(3)}
    user_shards = {u: user_shard_of(USERS[u], S) for u in range(4)}
    # a chat and a user sharing neither shard with chat 0 / user 0
    other_chat = next(c for c in range(3) if shards[c] != shards[0])
    other_user = next(u for u in range(4) if user_shards[u] != user_shards[0])
    a_scope = scope((0, other_chat), (0,))
    b_scope = scope((0,), (0, other_user))
    both = a_scope & b_scope
    a = DbReplica(store, admit_all=True, scope=a_scope)
    b = MemoryReplica(admit_all=True, scope=b_scope)
    twin = member(0, 0, 3_000)  # both trees of the intersection
    in_members = member(0, other_user, 3_001)  # chat 0, a user A does not index
    in_index = member(other_chat, 0, 3_002)  # user 0, a chat B does not hold
    a.apply_ops([twin, in_index])
    b.apply_ops([in_members])
    result = run_session(a, b)
    assert result.converged
    # twin and in_index to B (once each), in_members to A (into its MEMBERS only)
    assert result.initiator.stats.records_sent == 2
    assert result.responder.stats.records_sent == 1
    assert set(b.member_ops) == {twin.op_id, in_members.op_id}
    assert set(b.index) == {twin.op_id, in_index.op_id, in_members.op_id}
    a_members = {i for i, _ in store.members.iter_op_chats()}
    a_index = {i for i, _ in store.member_index.iter_users()}
    assert a_members == {twin.op_id, in_index.op_id, in_members.op_id}
    assert a_index == {twin.op_id, in_index.op_id}
    # on the intersection's trees, the two sides agree
    for domain in (Domain.MEMBERS, Domain.INDEX):
        assert a.scope_tree(domain, both).root() == b.scope_tree(domain, both).root()
