"""Replicas with different, changing scopes converge on every chat they share and hold
nothing outside their scope (SYNC.md, "Scopes").

Four ``MemoryReplica``s (under the chat rules, or storing every message), each holding a scope of a small network's
shards (or every shard). Records — messages, edits, deletes, reactions, member ops,
identities — reach them one by one, twice or never; any two run sessions, cut short at
random; scopes change (grow, shrink, become full) between steps. Whatever happened:

* at every step, no replica holds (stored, waiting or in a tree) a message, delete or
  member op of a chat outside its scope, nor an index entry of a user outside its user
  shards, and its per-shard trees equal trees rebuilt from what it holds;
* once scopes stop changing and every pair has synced until their sessions converge, every
  two replicas agree on every chat in both their scopes — the same messages, deletes,
  member ops and rows, shown messages and folded views — on the index entries of every
  user shard both hold, and on every identity (the global domain);
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
from sync.scope import EVERYTHING, Scope, shard_of, user_shard_of

from sync_support import (
    CHATS,
    RECORDS,
    USERS,
    assert_trees_match_contents,
    held_keys,
    identity,
    in_domain,
    member,
    message,
)

NUM_SHARDS = 3  # one chat per shard (CHATS), so that scopes overlap and differ often
SHARD = {chat: shard_of(chat, NUM_SHARDS) for chat in CHATS}
SHARD_SUBSETS = st.frozensets(st.integers(0, NUM_SHARDS - 1))
SCOPES: st.SearchStrategy[Scope] = st.one_of(
    st.just(EVERYTHING),
    st.builds(lambda s, u: Scope(s, NUM_SHARDS, u), SHARD_SUBSETS, SHARD_SUBSETS),
)
USER_SHARDS = {user_shard_of(u, NUM_SHARDS) for u in USERS}
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


def assert_within_scope(replica: MemoryReplica | DbReplica) -> None:
    """Nothing held outside the replica's scope, in any scoped domain or waiting; its trees
    (and the trees of scopes within it, summed per shard) as rebuilt from what it holds."""
    scope = replica.scope
    for domain in Domain:
        held = held_keys(replica, domain)
        outside = [k for k in held.values() if not in_domain(domain, k, scope)]
        assert not outside, f"{domain.name}: {len(outside)} held outside {scope}"
        assert replica.tree(domain).root() == MerkleTree.from_ids(held).root(), domain
        for shards in ({0}, {1, 2}, set(range(NUM_SHARDS))):
            within = Scope(frozenset(shards), NUM_SHARDS, frozenset(shards))
            if scope.covers(within):
                ids = [i for i, k in held.items() if in_domain(domain, k, within)]
                tree, expected = replica.scope_tree(domain, within), MerkleTree.from_ids(ids)
                assert tree.root() == expected.root()
                assert tree.root_check() == expected.root_check()  # the summed HELLO cell's
    assert all(scope.holds_chat(m.chat_id) for m in replica.waiting.waiting())
    if isinstance(replica, MemoryReplica):
        assert_trees_match_contents(replica)


def of_key(replica: MemoryReplica | DbReplica, domain: Domain, key: bytes) -> list[bytes]:
    return sorted(i for i, k in held_keys(replica, domain).items() if k == key)


def chat_state(replica: MemoryReplica | DbReplica, chat: bytes) -> tuple[object, ...]:
    return (
        *(of_key(replica, d, chat) for d in (Domain.MESSAGES, Domain.DELETES, Domain.MEMBERS)),
        sorted(replica.visible_ids(chat)),
        replica.view(chat),
    )


def user_shard_state(replica: MemoryReplica | DbReplica, user_shard: int) -> list[list[bytes]]:
    """The index entries and identities of a user shard's users."""
    return [
        sorted(
            i
            for i, u in held_keys(replica, d).items()
            if user_shard_of(u, NUM_SHARDS) == user_shard
        )
        for d in (Domain.INDEX, Domain.IDENTITY)
    ]


def rows_of(replica: MemoryReplica, chat: bytes) -> list[object]:
    return sorted((k, v) for k, v in replica.members.items() if k[0] == chat)


def assert_agree(a: MemoryReplica | DbReplica, b: MemoryReplica | DbReplica) -> None:
    """On every chat and user shard both hold."""
    for chat in CHATS:
        if a.scope.holds_chat(chat) and b.scope.holds_chat(chat):
            assert chat_state(a, chat) == chat_state(b, chat)
            if isinstance(a, MemoryReplica) and isinstance(b, MemoryReplica):
                assert rows_of(a, chat) == rows_of(b, chat)
    for shard in USER_SHARDS:
        if a.scope.holds_user_shard(shard) and b.scope.holds_user_shard(shard):
            assert user_shard_state(a, shard) == user_shard_state(b, shard)


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
        assert_agree(a, b)

    # a full replica given everything, synced last: each scoped replica holds its scope of it
    full = MemoryReplica(admit_all=admit_all)
    full.apply_ops(given_any)
    sync_until_converged([full, *replicas])
    for replica in replicas:
        assert_within_scope(replica)
        assert_agree(replica, full)


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

SHARD_SETS = st.builds(lambda s, u: Scope(s, NUM_SHARDS, u), SHARD_SUBSETS, SHARD_SUBSETS)


def rescope(replica: MemoryReplica | DbReplica, scope: Scope) -> None:
    """What a node does when its scope changes: leave the chat and user shards it no longer
    needs (their rows dropped: a chat's messages, deletes and member ops; a user's index
    entries and identity), then hold the wider sets (later sessions fill them)."""
    if isinstance(replica, MemoryReplica):
        replica.set_scope(scope)
        return
    old = replica.scope
    assert old.shards is not None and old.user_shards is not None
    assert scope.shards is not None and scope.user_shards is not None
    gone, gone_users = old.shards - scope.shards, old.user_shards - scope.user_shards
    if gone or gone_users:
        replica.drop_shards(gone, gone_users)
    replica.widen_scope(scope)


ALL_SHARDS = Scope(frozenset(range(NUM_SHARDS)), NUM_SHARDS, frozenset(range(NUM_SHARDS)))
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
@example(  # a store indexes every user, leaves two user shards (every chat kept), joins again
    [ALL_SHARDS] * REPLICAS,
    [
        ("deliver", 0, ALL_ADMITS + [identity(u, 1_000 + u, u) for u in range(4)]),
        ("sync", 0, 1, None),
        ("rescope", 0, Scope(frozenset(range(NUM_SHARDS)), NUM_SHARDS, frozenset({0}))),
        ("deliver", 0, ALL_ADMITS),
        ("sync", 0, 2, None),
        ("rescope", 1, Scope(frozenset({2}), NUM_SHARDS, frozenset({1, 2}))),
        ("sync", 1, 0, None),
        ("rescope", 0, ALL_SHARDS),
    ],
    True,
)
@given(
    st.lists(SHARD_SETS, min_size=REPLICAS, max_size=REPLICAS),
    st.lists(STEPS, min_size=4, max_size=25),
    st.booleans(),
)
def test_stores_leaving_and_joining_shards_converge_and_hold_nothing_else(
    scopes: list[Scope], steps: list[Step], admit_all: bool
) -> None:
    """Two RocksDB stores and two memory replicas: scopes change by leaving chat and user
    shards (their rows dropped: ``DbReplica.drop_shards``) and joining others — user shards
    widen and narrow as a node's writes for users come and go (sync/serving.py); the same
    guarantees."""
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
                assert_within_scope(replicas[i])
            elif step[0] == "sync":
                _, i, j, cut = step
                if i != j:
                    assert run_session(replicas[i], replicas[j], cut_after=cut).error is None
                    assert_within_scope(replicas[i])
                    assert_within_scope(replicas[j])
            else:
                _, i, scope = step
                rescope(replicas[i], ALL_SHARDS if scope.is_full else scope)
                assert_within_scope(replicas[i])

        full = MemoryReplica(admit_all=admit_all)
        full.apply_ops(given_any)
        sync_until_converged([full, *replicas])  # type: ignore[list-item]
        for replica in replicas:
            assert_within_scope(replica)
            assert_agree(replica, full)
