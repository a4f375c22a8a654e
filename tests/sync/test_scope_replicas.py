"""Scoped replicas on RocksDB and in memory: what they refuse, the trees of a scope they
answer with (summed from per-shard leaves, kept in step with every write and the GC), and a
scoped store filled by sessions with a full peer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from store import ChatDb, ChatDbConfig, IdentityRecord, MsgV1
from store.leaving import BY_CHAT
from store.ops import MembershipOp
from sync.frames import Domain
from sync.loopback import run_session
from sync.merkle import MerkleTree
from sync.replica import DbReplica, MemoryReplica
from sync.scope import EVERYTHING, Scope, ScopeError, shard_of, user_shard_of
from sync.shards import domain_shards, shard_in

from sync_support import CHATS, USERS, delete_of, held_keys, identity, member, message

S = 3  # one of CHATS per shard
SHARDS = [shard_of(c, S) for c in CHATS]
# member ops of every chat, naming users of every user shard
OPS: list[MembershipOp] = [member(c, u, 990 + u) for c in range(3) for u in range(1, 4)]
IDENTITIES = [identity(u, 1_000 + u, u) for u in range(len(USERS))]  # placed by user shard
RECORDS: list[MsgV1 | MembershipOp | IdentityRecord] = (
    [message(n) for n in range(24)] + [delete_of(n, 0, 3) for n in (0, 1, 5)] + OPS + IDENTITIES
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatDb]:
    db = ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=tmp_path / "db")
    yield db
    db.close()


def scope_of(*chats: int, users: tuple[int, ...] = ()) -> Scope:
    """The shards of CHATS[c], and the user shards of USERS[u]."""
    return Scope(
        frozenset(SHARDS[c] for c in chats), S, frozenset(user_shard_of(USERS[u], S) for u in users)
    )


def in_scope(domain: Domain, key: bytes, scope: Scope) -> bool:
    shards = domain_shards(domain, scope)
    return shards is None or shard_in(domain, key, S) in shards


def test_both_replicas_refuse_what_lies_outside_their_scope_alike(store: ChatDb) -> None:
    scope = scope_of(0, 2)
    memory = MemoryReplica(scope=scope, admit_all=True)
    db = DbReplica(store, admit_all=True, scope=scope)
    applied = [r.apply_ops(RECORDS) for r in (memory, db)]
    assert applied[0].new == applied[1].new
    # no user indexed: other chats' records and every identity
    outside = sum(
        not scope.holds_chat(r.chat_id) for r in RECORDS if not isinstance(r, IdentityRecord)
    )
    outside += len(IDENTITIES)
    assert memory.refused_out_of_scope == db.refused_out_of_scope == outside > 0
    for domain in Domain:
        assert memory.tree(domain).root() == db.tree(domain).root()
    assert all(scope.holds_chat(c) for _, c in store.iter_msg_chats())


def held_chats(replica: MemoryReplica | DbReplica, domain: Domain) -> dict[bytes, bytes]:
    return held_keys(replica, domain)


@pytest.mark.parametrize("kind", ["memory", "db"])
def test_a_full_replica_answers_for_any_scope_as_if_it_held_only_that(
    kind: str, store: ChatDb
) -> None:
    replica = (
        MemoryReplica(admit_all=True) if kind == "memory" else DbReplica(store, admit_all=True)
    )
    replica.apply_ops(RECORDS[:12])
    narrow = scope_of(1)
    for domain in Domain:  # builds the per-shard leaves, and caches levels and checks
        replica.scope_tree(domain, narrow).root_check()
        replica.scope_tree(domain, narrow).root()
    replica.apply_ops(RECORDS[12:])  # kept in step from here (the caches emptied)
    for domain in Domain:
        held = held_chats(replica, domain)  # deletes erased some messages: what is held
        assert len(held) >= 3
        for scope in (narrow, scope_of(0, 2, users=(1,)), scope_of(users=(2, 3)), scope_of()):
            ids = [i for i, key in held.items() if in_scope(domain, key, scope)]
            tree, expected = replica.scope_tree(domain, scope), MerkleTree.from_ids(ids)
            assert tree.root() == expected.root()
            # what the sketch path reads: the root's check, the leaf counts, a range listing
            assert tree.root_check() == expected.root_check()
            every_bucket = range(1 << 16)
            assert tree.leaf_counts(every_bucket) == expected.leaf_counts(every_bucket)
            in_range = replica.ids_in_range(domain, 0, 1 << 16, None, scope)
            assert sorted(in_range[k : k + 32] for k in range(0, len(in_range), 32)) == sorted(ids)
            listed = {
                i
                for bucket in {(i[0] << 8) | i[1] for i in held}
                for i in replica.bucket_ids(domain, bucket, None, scope)
            }
            assert listed == set(ids)
            others = list(held)
            got = replica.get_records(domain, others, None, None, scope)
            assert {i for i, blob in zip(others, got, strict=True) if blob} == set(ids)
        assert replica.scope_tree(domain, EVERYTHING) is replica.tree(domain)


def test_the_gc_keeps_the_trees_of_a_scope_true(store: ChatDb) -> None:
    replica = DbReplica(store, admit_all=True)
    replica.apply_ops(RECORDS)
    narrow = scope_of(0)
    replica.scope_tree(Domain.MESSAGES, narrow)
    cutoff = message(11).hlc.physical_ms
    replica.expire_messages(cutoff)
    held = held_chats(replica, Domain.MESSAGES)
    assert held and all(store.get_message(i).hlc.physical_ms > cutoff for i in held)
    expected = MerkleTree.from_ids(i for i, c in held.items() if narrow.holds_chat(c)).root()
    assert replica.scope_tree(Domain.MESSAGES, narrow).root() == expected


def held_all(replica: MemoryReplica) -> dict[bytes, bytes]:
    return held_chats(replica, Domain.MESSAGES) | held_chats(replica, Domain.DELETES)


def test_a_scoped_store_is_filled_by_sessions_and_widened(store: ChatDb) -> None:
    full = MemoryReplica(admit_all=True)
    full.apply_ops(RECORDS)
    db = DbReplica(store, admit_all=True, scope=scope_of(1))
    result = run_session(db, full)
    assert result.converged and result.initiator.scope == scope_of(1)
    held = {i for i, _ in store.iter_msg_chats()} | {i for i, _ in store.iter_delete_chats()}
    assert held == {i for i in held_all(full) if scope_of(1).holds_chat(held_all(full)[i])}
    with pytest.raises(ScopeError):
        db.widen_scope(scope_of(0))  # dropping a shard from the store is not built
    db.widen_scope(scope_of(0, 1))
    assert run_session(full, db).converged  # the full side initiates this time
    held = {i for i, _ in store.iter_msg_chats()} | {i for i, _ in store.iter_delete_chats()}
    assert held == {i for i in held_all(full) if scope_of(0, 1).holds_chat(held_all(full)[i])}
    assert run_session(db, full).frames == 2  # nothing left: HELLO, DONE


def rows_of(store: ChatDb, chat: bytes) -> dict[str, int]:
    """How many rows keyed by ``chat`` each chat-keyed column family holds."""
    return {cf: sum(1 for _ in store.rocks.iter_prefix(cf, chat)) for cf in BY_CHAT}


def held_all_db(replica: DbReplica) -> dict[bytes, bytes]:
    """Id -> chat of every message, delete and member op held (what follows a chat)."""
    by_chat = (Domain.MESSAGES, Domain.DELETES, Domain.MEMBERS)
    return {i: c for d in by_chat for i, c in held_chats(replica, d).items()}


def test_leaving_a_shard_drops_its_rows_and_trees_and_a_later_join_refills_it(
    store: ChatDb,
) -> None:
    full = MemoryReplica(admit_all=True)
    full.apply_ops(RECORDS)
    db = DbReplica(store, admit_all=True, scope=scope_of(0, 1))
    assert run_session(db, full).converged
    assert sum(rows_of(store, CHATS[0]).values()) > 0
    kept_before = rows_of(store, CHATS[1])

    leaving = {i for i, chat in held_all_db(db).items() if scope_of(0).holds_chat(chat)}
    assert db.drop_shards(frozenset({SHARDS[0]})) == len(leaving) > 0
    assert not leaving & set(held_all_db(db))
    assert db.scope == scope_of(1)
    assert rows_of(store, CHATS[0]) == dict.fromkeys(BY_CHAT, 0)  # nothing of it on disk
    assert rows_of(store, CHATS[1]) == kept_before  # the other shard untouched
    memory = MemoryReplica(admit_all=True, scope=scope_of(1))
    memory.apply_ops(RECORDS)
    for domain in Domain:  # the trees as a replica that never held the shard, and as rebuilt
        assert db.tree(domain).root() == memory.tree(domain).root()
        assert db.tree(domain).root() == DbReplica(store, scope=scope_of(1)).tree(domain).root()
    assert db.apply_ops([RECORDS[0]]).new == [False]  # refused from now on
    assert db.refused_out_of_scope == 1

    db.widen_scope(scope_of(0, 1))  # a served user needs it again
    assert run_session(db, full).converged
    held = {i for i, _ in store.iter_msg_chats()} | {i for i, _ in store.iter_delete_chats()}
    assert held == {i for i in held_all(full) if scope_of(0, 1).holds_chat(held_all(full)[i])}


def test_a_full_replica_leaves_no_shard(store: ChatDb) -> None:
    with pytest.raises(ScopeError):
        DbReplica(store).drop_shards(frozenset({0}))
