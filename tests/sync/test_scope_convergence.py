"""Replicas with different, changing scopes converge on every chat they share and hold
nothing outside their scope (SYNC.md, "Scopes").

Four ``MemoryReplica``s (under the chat rules, or storing every message), each holding a scope of a small network's
shards (or every shard). Records — messages, edits, deletes, reactions, member ops,
identities — reach them one by one, twice or never; any two run sessions, cut short at
random; scopes change (grow, shrink, become full) between steps. Whatever happened:

* at every step, no replica holds (stored, waiting or in a tree) a message or a delete of a
  chat outside its scope, and its per-shard trees equal trees rebuilt from what it holds;
* once scopes stop changing and every pair has synced until their sessions converge, every
  two replicas agree on every chat in both their scopes — the same messages, deletes,
  shown messages and folded views — and on every member op and identity (global domains);
* and, against a fifth, full replica given every record any of them was given and synced
  last: each scoped replica holds exactly the full replica's records of its scope.
"""

from __future__ import annotations

import contextlib
import tempfile
from itertools import combinations
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from store import ChatDb, ChatDbConfig
from store.records import MsgV1
from sync.frames import Domain
from sync.loopback import run_session
from sync.merkle import MerkleTree
from sync.replica import DbReplica, MemoryReplica, Record
from sync.scope import EVERYTHING, Scope, shard_of
from sync.shards import SCOPED

from sync_support import CHATS, RECORDS, assert_trees_match_contents, member, message

NUM_SHARDS = 3  # one chat per shard (CHATS), so that scopes overlap and differ often
SHARD = {chat: shard_of(chat, NUM_SHARDS) for chat in CHATS}
SCOPES: st.SearchStrategy[Scope] = st.one_of(
    st.just(EVERYTHING),
    st.frozensets(st.integers(0, NUM_SHARDS - 1)).map(lambda s: Scope(s, NUM_SHARDS)),
)
REPLICAS = 4

# Any record, and more often plain messages, or the creator's adds of every user (stamped
# before every message) at once, so that most messages are admitted and stored, not left
# waiting for ops.
ALL_ADMITS = [member(chat, user, 990) for chat in range(3) for user in range(4)]
SOME_RECORDS = st.one_of(
    st.lists(st.integers(0, 60).map(message), min_size=1, max_size=8),
    st.lists(RECORDS, max_size=5),
    st.just(ALL_ADMITS),
)

Step = tuple[Any, ...]
STEPS: st.SearchStrategy[Step] = st.one_of(
    st.tuples(st.just("deliver"), st.integers(0, REPLICAS - 1), SOME_RECORDS),
    st.tuples(
        st.just("sync"),
        st.integers(0, REPLICAS - 1),
        st.integers(0, REPLICAS - 1),
        st.one_of(st.none(), st.integers(1, 8)),  # cut after this many frames
    ),
    st.tuples(st.just("rescope"), st.integers(0, REPLICAS - 1), SCOPES),
)


def held_chats(replica: MemoryReplica) -> set[bytes]:
    held = [*replica.messages.values(), *replica.deletes.values(), *replica.waiting.waiting()]
    return {m.chat_id for m in held}


def assert_within_scope(replica: MemoryReplica) -> None:
    outside = {c for c in held_chats(replica) if not replica.scope.holds_chat(c)}
    assert not outside, f"held outside {replica.scope}: {len(outside)} chats"
    assert_trees_match_contents(replica)
    for shards in ({0}, {1, 2}, set(range(NUM_SHARDS))):  # the tree of a scope, summed
        scope = Scope(frozenset(shards), NUM_SHARDS)
        for domain in SCOPED:
            held = replica.messages if domain is Domain.MESSAGES else replica.deletes
            ids = [i for i, m in held.items() if scope.holds_chat(m.chat_id)]
            if replica.scope.covers(scope):
                tree, expected = replica.scope_tree(domain, scope), MerkleTree.from_ids(ids)
                assert tree.root() == expected.root()
                assert tree.root_check() == expected.root_check()  # the summed HELLO cell's


def chat_state(replica: MemoryReplica, chat: bytes) -> tuple[object, ...]:
    return (
        sorted(i for i, m in replica.messages.items() if m.chat_id == chat),
        sorted(i for i, d in replica.deletes.items() if d.chat_id == chat),
        sorted(replica.visible_ids(chat)),
        replica.view(chat),
    )


def global_state(replica: MemoryReplica) -> tuple[object, ...]:
    return (
        sorted(replica.member_ops),
        sorted(replica.members.items()),
        sorted(replica.identities.items()),
    )


def sync_until_converged(replicas: list[MemoryReplica], rounds: int = 4) -> None:
    for _ in range(rounds):
        results = [run_session(a, b) for a, b in combinations(replicas, 2)]
        results += [run_session(b, a) for a, b in combinations(replicas, 2)]
        if all(r.converged for r in results):
            return
    raise AssertionError("sessions did not converge")


def deliver(replica: MemoryReplica, records: list[Record]) -> None:
    replica.apply_ops(records)
    assert_within_scope(replica)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(SCOPES, min_size=REPLICAS, max_size=REPLICAS),
    st.lists(STEPS, min_size=4, max_size=30),
    st.booleans(),
)
def test_scoped_replicas_converge_on_what_they_share_and_hold_nothing_else(
    scopes: list[Scope], steps: list[Step], admit_all: bool
) -> None:
    """``admit_all``: every message stored on arrival (the sync engine alone), else the chat
    rules decide (messages wait for the ops that admit them)."""
    replicas = [MemoryReplica(scope=s, admit_all=admit_all) for s in scopes]
    given_any: list[Record] = []
    for step in steps:
        if step[0] == "deliver":
            _, i, records = step
            given_any.extend(records)
            deliver(replicas[i], records)
        elif step[0] == "sync":
            _, i, j, cut = step
            if i != j:
                result = run_session(replicas[i], replicas[j], cut_after=cut)
                assert result.error is None
                assert_within_scope(replicas[i])
                assert_within_scope(replicas[j])
        else:
            _, i, scope = step
            replicas[i].set_scope(scope)
            assert_within_scope(replicas[i])

    sync_until_converged(replicas)
    for a, b in combinations(replicas, 2):
        assert global_state(a) == global_state(b)
        for chat in CHATS:
            if a.scope.holds_chat(chat) and b.scope.holds_chat(chat):
                assert chat_state(a, chat) == chat_state(b, chat)

    # a full replica given everything, synced last: each scoped replica holds its scope of it
    full = MemoryReplica(admit_all=admit_all)
    full.apply_ops(given_any)
    sync_until_converged([full, *replicas])
    for replica in replicas:
        assert_within_scope(replica)
        assert global_state(replica) == global_state(full)
        for chat in CHATS:
            if replica.scope.holds_chat(chat):
                assert chat_state(replica, chat) == chat_state(full, chat)


def test_a_session_ships_only_the_intersection() -> None:
    """Two replicas holding every chat's records, scoped to overlapping shards: a session
    moves records of the shared shards only, in both directions."""
    msgs: list[MsgV1] = [message(n) for n in range(30)]
    shards = sorted(set(SHARD.values()))
    a_scope = Scope(frozenset(shards[:2]), NUM_SHARDS)
    b_scope = Scope(frozenset(shards[1:]), NUM_SHARDS)
    a, b = (
        MemoryReplica(scope=a_scope, admit_all=True),
        MemoryReplica(scope=b_scope, admit_all=True),
    )
    a.apply_ops(msgs[0::2])
    b.apply_ops(msgs[1::2])
    result = run_session(a, b)
    assert result.converged
    shared = a_scope & b_scope
    for replica in (a, b):
        assert all(replica.scope.holds_chat(m.chat_id) for m in replica.messages.values())
        assert {i for i, m in replica.messages.items() if shared.holds_chat(m.chat_id)} == {
            m.msg_id for m in msgs if shared.holds_chat(m.chat_id)
        }


# --- the same on RocksDB: stores that leave shards (drop their rows) and join them again ---

SHARD_SETS = st.frozensets(st.integers(0, NUM_SHARDS - 1)).map(lambda s: Scope(s, NUM_SHARDS))


def held_ids(replica: MemoryReplica | DbReplica, domain: Domain) -> dict[bytes, bytes]:
    """Record id -> chat of what the replica holds in a scoped domain."""
    if isinstance(replica, DbReplica):
        db = replica.db
        return dict(db.iter_msg_chats() if domain is Domain.MESSAGES else db.iter_delete_chats())
    rows = replica.messages if domain is Domain.MESSAGES else replica.deletes
    return {i: m.chat_id for i, m in rows.items()}


def assert_store_within_scope(replica: MemoryReplica | DbReplica) -> None:
    for domain in SCOPED:
        held = held_ids(replica, domain)
        assert all(replica.scope.holds_chat(c) for c in held.values()), domain
        assert replica.tree(domain).root() == MerkleTree.from_ids(held).root(), domain
    assert all(replica.scope.holds_chat(m.chat_id) for m in replica.waiting.waiting())


def any_chat_state(replica: MemoryReplica | DbReplica, chat: bytes) -> tuple[object, ...]:
    return (
        sorted(i for i, c in held_ids(replica, Domain.MESSAGES).items() if c == chat),
        sorted(i for i, c in held_ids(replica, Domain.DELETES).items() if c == chat),
        sorted(replica.visible_ids(chat)),
        replica.view(chat),
    )


def global_roots(replica: MemoryReplica | DbReplica) -> tuple[object, ...]:
    return tuple(replica.tree(d).root() for d in (Domain.MEMBERS, Domain.IDENTITY))


def rescope(replica: MemoryReplica | DbReplica, scope: Scope) -> None:
    """What a node does when its scope changes: leave the shards it no longer needs (their
    rows dropped), then hold the wider set (later sessions fill it)."""
    if isinstance(replica, MemoryReplica):
        replica.set_scope(scope)
        return
    old = replica.scope.shards or frozenset()
    new = scope.shards or frozenset()
    if old - new:
        replica.drop_shards(old - new)
    replica.widen_scope(Scope(new, NUM_SHARDS))


ALL_SHARDS = Scope(frozenset(range(NUM_SHARDS)), NUM_SHARDS)
MESSAGES = [message(n) for n in range(0, 60, 3)]


@settings(max_examples=40, deadline=None)
@example(  # a store fills every shard, leaves two, syncs, joins them again
    [ALL_SHARDS] * REPLICAS,
    [
        ("deliver", 0, ALL_ADMITS),
        ("deliver", 0, MESSAGES),
        ("sync", 0, 1, None),
        ("rescope", 0, Scope(frozenset({0}), NUM_SHARDS)),
        ("sync", 2, 0, None),
        ("rescope", 1, Scope(frozenset({1}), NUM_SHARDS)),
        ("sync", 0, 1, None),
        ("rescope", 0, ALL_SHARDS),
    ],
    False,
)
@given(
    st.lists(SHARD_SETS, min_size=REPLICAS, max_size=REPLICAS),
    st.lists(STEPS, min_size=4, max_size=25),
    st.booleans(),
)
def test_stores_leaving_and_joining_shards_converge_and_hold_nothing_else(
    scopes: list[Scope], steps: list[Step], admit_all: bool
) -> None:
    """Two RocksDB stores and two memory replicas: scopes change by leaving shards (their
    rows dropped: ``DbReplica.drop_shards``) and joining others; the same guarantees."""
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        dbs = [
            stack.enter_context(
                ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=f"{tmp}/{i}")
            )
            for i in range(2)
        ]
        replicas: list[MemoryReplica | DbReplica] = [
            DbReplica(dbs[0], admit_all=admit_all, scope=scopes[0]),
            DbReplica(dbs[1], admit_all=admit_all, scope=scopes[1]),
            MemoryReplica(scope=scopes[2], admit_all=admit_all),
            MemoryReplica(scope=scopes[3], admit_all=admit_all),
        ]
        given_any: list[Record] = []
        for step in steps:
            if step[0] == "deliver":
                _, i, records = step
                given_any.extend(records)
                replicas[i].apply_ops(records)
                assert_store_within_scope(replicas[i])
            elif step[0] == "sync":
                _, i, j, cut = step
                if i != j:
                    assert run_session(replicas[i], replicas[j], cut_after=cut).error is None
                    assert_store_within_scope(replicas[i])
                    assert_store_within_scope(replicas[j])
            else:
                _, i, scope = step
                rescope(
                    replicas[i],
                    scope
                    if scope.shards is not None
                    else Scope(frozenset(range(NUM_SHARDS)), NUM_SHARDS),
                )
                assert_store_within_scope(replicas[i])

        full = MemoryReplica(admit_all=admit_all)
        full.apply_ops(given_any)
        sync_until_converged([full, *replicas])  # type: ignore[list-item]
        for replica in replicas:
            assert_store_within_scope(replica)
            assert global_roots(replica) == global_roots(full)
            for chat in CHATS:
                if replica.scope.holds_chat(chat):
                    assert any_chat_state(replica, chat) == any_chat_state(full, chat)
