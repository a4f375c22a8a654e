"""Scopes (sync/scope.py): the model, its wire form, its bounds, and how a node's scope is
derived from the users it serves."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sync.scope import (
    DEFAULT_SHARDS,
    EVERYTHING,
    MAX_SHARDS,
    Scope,
    ScopeError,
    scope_for,
    served_users,
    shard_of,
    shards_scope,
    split_by_scope,
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
    assert Scope.from_bitmap(num_shards, wire[1]) == scope  # type: ignore[arg-type]


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


def test_split_by_scope_keeps_global_records_and_refuses_other_chats() -> None:
    inside = message(0)  # CHATS[0]
    outside = next(message(n) for n in (1, 2) if shard_of(CHATS[n], 64) != shard_of(CHATS[0], 64))
    scope = shards_scope({shard_of(CHATS[0], 64)}, 64)
    op = member(1, 1, 1_000)
    ident = identity(1, 1, 1)
    kept, refused = split_by_scope([inside, outside, op, ident], scope)
    assert kept == [inside, op, ident] and refused == [outside]
    assert split_by_scope([outside], EVERYTHING) == ([outside], [])
