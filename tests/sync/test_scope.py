"""Scopes (sync/scope.py): the model, its wire form, its bounds, and how a node's scope is
derived from the users it serves."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sync.scope import (
    DEFAULT_SHARDS,
    EVERYTHING,
    MAX_SHARDS,
    Scope,
    ScopeError,
    assign_shards,
    chat_holders,
    holders,
    in_chat_scope,
    in_index,
    load_cap,
    rendezvous_score,
    replica_shards,
    rule_shards,
    scope_for,
    served_users,
    shard_of,
    shards_scope,
    user_shard_of,
)

from sync_support import CHATS, USERS, identity, member, message

A, B, C = b"\x0a" * 32, b"\x0b" * 32, b"\x0c" * 32


def test_everything_holds_and_covers_every_scope() -> None:
    assert EVERYTHING.holds_chat(A) and EVERYTHING.covers(shards_scope({1, 2}))
    assert EVERYTHING.covers(EVERYTHING) and EVERYTHING.is_full
    assert not shards_scope({1}).covers(EVERYTHING)


def test_shard_scopes_cover_and_intersect() -> None:
    ab, bc = shards_scope({1, 2}), shards_scope({2, 3})
    assert ab.holds_shard(1) and not ab.holds_shard(3)
    assert ab.covers(shards_scope({2})) and not ab.covers(bc)
    assert ab & bc == shards_scope({2})
    assert ab & EVERYTHING == ab and EVERYTHING & bc == bc


def test_a_chat_lives_in_one_shard_and_a_scope_holds_it_by_that_shard() -> None:
    shard = shard_of(A, DEFAULT_SHARDS)
    assert shard == shard_of(A, DEFAULT_SHARDS) and 0 <= shard < DEFAULT_SHARDS
    assert shards_scope({shard}).holds_chat(A)
    assert not shards_scope(set(range(DEFAULT_SHARDS)) - {shard}).holds_chat(A)


def test_scopes_of_different_networks_do_not_meet() -> None:
    with pytest.raises(ScopeError):
        _ = shards_scope({1}, 256) & shards_scope({1}, 512)


@pytest.mark.parametrize("num_shards", [0, MAX_SHARDS + 1, 1_000_000])
def test_a_network_of_too_many_or_no_shards_is_refused(num_shards: int) -> None:
    with pytest.raises(ScopeError):
        Scope(frozenset(), num_shards)
    with pytest.raises(ScopeError):
        Scope.from_bitmap(num_shards, b"")


def test_a_shard_out_of_range_is_refused() -> None:
    with pytest.raises(ScopeError):
        shards_scope({DEFAULT_SHARDS})


@given(
    st.integers(1, 300).flatmap(
        lambda n: st.tuples(st.just(n), st.frozensets(st.integers(0, n - 1)))
    )
)
def test_the_wire_form_round_trips(case: tuple[int, frozenset[int]]) -> None:
    num_shards, shards = case
    scope = Scope(shards, num_shards)
    wire = scope.to_wire()
    assert wire is not None and len(wire[1]) == (num_shards + 7) // 8  # type: ignore[arg-type]
    assert len(wire) == 2  # no user shards: today's two fields
    assert Scope.from_bitmap(num_shards, wire[1]) == scope  # type: ignore[arg-type]


@given(
    st.integers(1, 300).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.frozensets(st.integers(0, n - 1)),
            st.frozensets(st.integers(0, n - 1), min_size=1),
        )
    )
)
def test_the_wire_form_with_user_shards_round_trips(
    case: tuple[int, frozenset[int], frozenset[int]],
) -> None:
    num_shards, shards, users = case
    scope = Scope(shards, num_shards, users)
    wire = scope.to_wire()
    assert wire is not None and len(wire) == 3
    assert Scope.from_bitmap(num_shards, wire[1], wire[2]) == scope  # type: ignore[arg-type]


def test_user_shards_are_a_namespace_of_their_own_and_intersect_with_chat_shards() -> None:
    users = [bytes([i]) * 32 for i in range(64)]
    assert any(user_shard_of(u, DEFAULT_SHARDS) != shard_of(u, DEFAULT_SHARDS) for u in users)
    assert all(0 <= user_shard_of(u, 7) < 7 for u in users)
    mine = Scope(frozenset({1, 2}), DEFAULT_SHARDS, frozenset({user_shard_of(A, DEFAULT_SHARDS)}))
    assert mine.indexes_user(A) and EVERYTHING.indexes_user(A)
    assert not shards_scope({1, 2}).indexes_user(A)  # chat shards only: no user indexed
    peer = Scope(frozenset({2, 3}), DEFAULT_SHARDS, frozenset(range(DEFAULT_SHARDS)))
    both = mine & peer
    assert both.shards == {2} and both.user_shards == mine.user_shards
    assert peer.covers(Scope(frozenset({2}), DEFAULT_SHARDS, mine.user_shards))
    assert not shards_scope({1, 2}).covers(mine)  # the same chats, fewer users indexed


def test_a_full_scope_takes_no_user_shards_and_a_user_shard_out_of_range_is_refused() -> None:
    with pytest.raises(ScopeError):
        Scope(None, DEFAULT_SHARDS, frozenset({1}))
    with pytest.raises(ScopeError):
        Scope(frozenset(), 4, frozenset({4}))


def test_a_bitmap_with_bits_past_the_last_shard_is_refused() -> None:
    with pytest.raises(ScopeError):
        Scope.from_bitmap(4, b"\x08")  # bit 4 of a 4-shard network
    with pytest.raises(ScopeError):
        Scope.from_bitmap(16, b"\x00")  # one byte short


def test_a_node_holds_the_chats_its_users_are_added_to_and_what_is_pinned() -> None:
    ops = [member(0, 1, 1_000), member(1, 2, 1_000), member(2, 1, 1_000, remove=True)]
    # USERS[1] is added to CHATS[0]; a removal alone adds no chat
    scope = scope_for([USERS[1]], ops, pinned_chats=[CHATS[2]], pinned_shards=[7])
    expected = {shard_of(CHATS[0], DEFAULT_SHARDS), shard_of(CHATS[2], DEFAULT_SHARDS), 7}
    assert scope.shards == expected
    # deterministic: the same ops in any order give the same scope
    same = scope_for([USERS[1]], ops[::-1], pinned_chats=[CHATS[2]], pinned_shards=[7])
    assert same == scope


def test_served_users_are_those_whose_home_nodes_name_the_node() -> None:
    homes = {A: [b"n1", b"n2"], B: [b"n3"], C: []}
    assert served_users(b"n1", homes) == {A} and served_users(b"n9", homes) == set()


def test_a_scope_holds_its_chats_records_and_its_users_identities_and_index() -> None:
    other = next(n for n in (1, 2) if shard_of(CHATS[n], 64) != shard_of(CHATS[0], 64))
    inside, outside = message(0), message(other)  # CHATS[0], another shard's chat
    scope = shards_scope({shard_of(CHATS[0], 64)}, 64)
    op_inside, op_outside = member(0, 1, 1_000), member(other, 1, 1_000)
    records = [inside, outside, op_inside, op_outside, identity(1, 1, 1)]
    # chat shards only: no user indexed, so no identity held
    assert [in_chat_scope(r, scope) for r in records] == [True, False, True, False, False]
    assert not any(in_index(r, scope) for r in records)
    assert all(in_chat_scope(r, EVERYTHING) for r in records)
    assert all(in_index(r, EVERYTHING) for r in records[2:4])
    # a user shard indexed: every op naming that user is in the index, whatever its chat,
    # and the user's identity is held
    indexing = Scope(scope.shards, 64, frozenset({user_shard_of(USERS[1], 64)}))
    assert [in_index(r, indexing) for r in records] == [False, False, True, True, False]
    assert [in_chat_scope(r, indexing) for r in records] == [True, False, True, False, True]
    assert not in_chat_scope(identity(2, 1, 1), indexing) or (
        user_shard_of(USERS[2], 64) == user_shard_of(USERS[1], 64)
    )


# --- the replication factor: holders(shard, nodes, R) ------------------------------------

node_ids = st.sets(st.binary(min_size=1, max_size=40), min_size=1, max_size=12)


@given(node_ids, st.integers(1, 5), st.sampled_from([1, 3, 16, 64]), st.randoms())
def test_every_shard_has_r_holders_nearest_first_and_no_node_more_than_the_cap(
    nodes: set[bytes], r: int, num_shards: int, rnd: random.Random
) -> None:
    listed = sorted(nodes)
    rnd.shuffle(listed)
    every = assign_shards(listed + listed[:2], r, num_shards)  # duplicates count once
    assert every == assign_shards(sorted(nodes), r, num_shards)  # any order
    load = Counter(n for chosen in every for n in chosen)
    cap, k = load_cap(len(nodes), r, num_shards), min(r, len(nodes))
    assert sum(load.values()) == k * num_shards
    if (len(nodes) - k + 1) * cap >= k * num_shards:  # then k nodes are always below the cap
        assert max(load.values()) <= cap
    for shard, chosen in enumerate(every):
        assert len(set(chosen)) == len(chosen) == min(r, len(nodes)) and set(chosen) <= nodes
        assert chosen == holders(shard, nodes, r, num_shards)
        # nearest first; a nearer node passed over was full (loads only grow: it ends full)
        scores = [rendezvous_score(shard, n, num_shards) for n in chosen]
        assert scores == sorted(scores)
        passed = [
            n for n in nodes - set(chosen) if rendezvous_score(shard, n, num_shards) < scores[-1]
        ]
        assert all(load[n] >= cap for n in passed)
    assert (
        every[0]
        == tuple(sorted(nodes, key=lambda n: (rendezvous_score(0, n, num_shards), n)))[
            : min(r, len(nodes))
        ]
    )  # the first shard: plain rendezvous hashing, no node full yet


def test_the_cap_spreads_a_few_shards_evenly() -> None:
    """3 shards, R = 3, 9 nodes (``chatsync bench scope``): one shard each, where plain
    rendezvous hashing gave some nodes two and some none; 1,000 nodes and 4,096 shards: at
    most 16 each (mean 12.3; rendezvous hashing alone: 23)."""
    nine = [bytes([i]) * 32 for i in range(9)]
    assert sorted(len(s) for s in rule_shards(nine, 3, 3).values()) == [1] * 9
    assert load_cap(1_000, 3, 4_096) == 16 and load_cap(9, 3, 3) == 1 and load_cap(2, 3, 16) == 20


def test_a_node_leaving_moves_about_its_own_shards() -> None:
    """Not only its own, as plain rendezvous hashing (a holder it displaced by the cap may
    come back): measured over 10 networks of 30 nodes and 512 shards, the holders that change
    are at most 1.25x the slots the node held."""
    rnd = random.Random(7)
    for _ in range(10):
        nodes = [rnd.randbytes(8) for _ in range(30)]
        gone = nodes[rnd.randrange(30)]
        before, after = assign_shards(nodes, 3, 512), assign_shards(set(nodes) - {gone}, 3, 512)
        own = sum(gone in chosen for chosen in before)
        moved = sum(len(set(b) - set(a)) for b, a in zip(before, after, strict=True))
        assert own <= moved <= 1.25 * own


def test_replica_shards_are_the_shards_a_node_is_a_holder_of_and_spread_evenly() -> None:
    nodes = [bytes([i]) * 32 for i in range(9)]
    per_node = {n: replica_shards(n, nodes, 3, 64) for n in nodes}
    for shard in range(64):  # every shard exactly R holders, each of which counts it
        assert {n for n in nodes if shard in per_node[n]} == set(holders(shard, nodes, 3, 64))
    assert all(10 <= len(s) <= 32 for s in per_node.values())  # ~ R·S/N = 21 each


def test_a_chat_is_held_by_its_members_home_nodes_and_its_shards_r_holders() -> None:
    nodes = [bytes([i]) * 32 for i in range(6)]
    home = b"\xee" * 32  # a home node need not be among the live nodes we know
    held = chat_holders(A, nodes, home_nodes=[home], r=3, num_shards=16)
    assert held == {home, *holders(shard_of(A, 16), nodes, 3, 16)} and len(held) == 4
    assert chat_holders(A, nodes[:2], r=3, num_shards=16) == set(nodes[:2])  # fewer than R: all


def test_holders_of_a_shard_outside_the_network_are_refused() -> None:
    with pytest.raises(ScopeError):
        holders(16, [A], 3, 16)
    assert holders(0, [A, B], 0) == ()


def test_every_nodes_rule_shards_at_once_are_each_nodes_replica_shards() -> None:
    nodes = [bytes([i]) * 8 for i in range(12)]
    every = rule_shards(nodes, 3, 64)
    assert every == {n: replica_shards(n, nodes, 3, 64) for n in nodes}
    assert sum(len(s) for s in every.values()) == 3 * 64  # each shard R holders
    assert rule_shards([], 3, 64) == {}
