"""CRDT merge rules (pure): member join semilattice, identity LWW, ChatMeta aggregation."""

from __future__ import annotations

import operator
from functools import reduce
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store import ChatMeta, Hlc, MemberInfo, Role
from store.hlc import HLC_ZERO
from store.merge import (
    add_op_state,
    identity_wins,
    merge_member_states,
    meta_after_membership,
    meta_after_message,
    remove_op_state,
)

from store_support import (
    fold_members,
    member_infos,
    member_ops,
    op_state,
    optional_member_infos,
    roles,
    small_hlcs,
)

bin32 = st.binary(min_size=32, max_size=32)

# --- member merge: a join semilattice -----------------------------------------------------


@given(optional_member_infos, optional_member_infos)
def test_member_merge_is_commutative(a: MemberInfo | None, b: MemberInfo | None) -> None:
    assert merge_member_states(a, b) == merge_member_states(b, a)


@given(optional_member_infos, optional_member_infos, optional_member_infos)
def test_member_merge_is_associative(
    a: MemberInfo | None, b: MemberInfo | None, c: MemberInfo | None
) -> None:
    left = merge_member_states(merge_member_states(a, b), c)
    right = merge_member_states(a, merge_member_states(b, c))
    assert left == right


@given(optional_member_infos)
def test_member_merge_is_idempotent(a: MemberInfo | None) -> None:
    assert merge_member_states(a, a) == a
    assert merge_member_states(a, None) == a
    assert merge_member_states(None, a) == a


@given(optional_member_infos, optional_member_infos)
def test_member_merge_absorbs(a: MemberInfo | None, b: MemberInfo | None) -> None:
    """Merging a state already contained in the join changes nothing (a ⊔ (a ⊔ b) = a ⊔ b)."""
    joined = merge_member_states(a, b)
    assert merge_member_states(a, joined) == joined
    assert merge_member_states(joined, b) == joined


@given(member_infos, member_infos)
def test_member_merge_takes_each_maximum(a: MemberInfo, b: MemberInfo) -> None:
    merged = merge_member_states(a, b)
    assert merged is not None
    assert merged.added_at == max(a.added_at, b.added_at)
    assert (merged.added_at, merged.role) == max((a.added_at, a.role), (b.added_at, b.role))
    removed = [r for r in (a.removed_at, b.removed_at) if r is not None]
    assert merged.removed_at == (max(removed) if removed else None)


@given(small_hlcs(), roles, roles)
def test_equal_added_at_with_different_roles_takes_the_higher_role(
    stamp: Hlc, r1: Role, r2: Role
) -> None:
    a, b = MemberInfo(r1, stamp), MemberInfo(r2, stamp)
    merged = merge_member_states(a, b)
    assert merged == merge_member_states(b, a)
    assert merged is not None
    assert merged.role == max(r1, r2)


def test_member_merge_examples() -> None:
    added = MemberInfo(Role.ADMIN, Hlc(10))
    removed = remove_op_state(Hlc(12))
    assert merge_member_states(added, removed) == MemberInfo(Role.ADMIN, Hlc(10), Hlc(12))
    readded = add_op_state(Role.PARTICIPANT, Hlc(15))
    assert merge_member_states(merge_member_states(added, removed), readded) == MemberInfo(
        Role.PARTICIPANT, Hlc(15), Hlc(12)
    )
    # an older add does not bring an old role back
    assert merge_member_states(readded, added) == readded


@given(st.lists(member_ops, min_size=1, max_size=12), st.data())
def test_any_order_or_duplication_of_ops_folds_to_one_state(
    ops: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    states = [op_state(op) for op in ops]
    expected = fold_members(states)
    shuffled = data.draw(st.permutations(states))
    duplicated = shuffled + data.draw(st.lists(st.sampled_from(states), max_size=6))
    duplicated = data.draw(st.permutations(duplicated))
    assert fold_members(shuffled) == expected
    assert fold_members(duplicated) == expected
    # regrouping: fold two halves separately (two replicas), then merge the results
    cut = data.draw(st.integers(0, len(duplicated)))
    halves = merge_member_states(fold_members(duplicated[:cut]), fold_members(duplicated[cut:]))
    assert halves == expected


@given(st.lists(member_ops, min_size=1, max_size=12))
def test_folded_ops_match_their_maxima(ops: list[tuple[Any, ...]]) -> None:
    state = fold_members([op_state(op) for op in ops])
    assert state is not None
    adds = [op[2] for op in ops if op[0] == "add"] + [
        op[1].added_at for op in ops if op[0] == "record"
    ]
    removes = [op[1] for op in ops if op[0] == "remove"] + [
        op[1].removed_at for op in ops if op[0] == "record" and op[1].removed_at is not None
    ]
    assert state.added_at == max(adds, default=HLC_ZERO)
    assert state.removed_at == (max(removes) if removes else None)


@given(member_infos)
def test_active_iff_removed_before_added(info: MemberInfo) -> None:
    expected = info.removed_at is None or info.removed_at < info.added_at
    assert info.active == expected


def test_active_examples() -> None:
    assert MemberInfo(Role.PARTICIPANT, Hlc(5)).active
    assert MemberInfo(Role.PARTICIPANT, Hlc(5), Hlc(4, 9)).active
    assert not MemberInfo(Role.PARTICIPANT, Hlc(5), Hlc(5)).active  # a tie removes
    assert not MemberInfo(Role.PARTICIPANT, Hlc(5), Hlc(5, 1)).active
    assert not remove_op_state(Hlc(1)).active
    assert add_op_state(Role.ADMIN, Hlc(1)) == MemberInfo(Role.ADMIN, Hlc(1), None)
    assert remove_op_state(Hlc(3)) == MemberInfo(Role.PARTICIPANT, HLC_ZERO, Hlc(3))


def test_a_remove_at_zero_is_rejected() -> None:
    """ZERO is no clock's stamp; as removed_at it would be an inactive spelling of None."""
    with pytest.raises(ValueError, match="removed_at"):
        remove_op_state(HLC_ZERO)


def test_remove_then_older_add_stays_removed() -> None:
    state = fold_members([remove_op_state(Hlc(10)), add_op_state(Role.ADMIN, Hlc(9))])
    assert state is not None and not state.active
    state = fold_members([remove_op_state(Hlc(10)), add_op_state(Role.ADMIN, Hlc(11))])
    assert state is not None and state.active


# --- identity LWW -------------------------------------------------------------------------

identity_candidates = st.tuples(small_hlcs(3, 1), st.binary(max_size=2))


def _lww(candidates: list[tuple[Hlc, bytes]]) -> tuple[Hlc, bytes] | None:
    stored: tuple[Hlc, bytes] | None = None
    for incoming in candidates:
        if identity_wins(incoming, stored):
            stored = incoming
    return stored


@given(st.lists(identity_candidates, min_size=1, max_size=10), st.data())
def test_identity_winner_is_order_independent(
    candidates: list[tuple[Hlc, bytes]], data: st.DataObject
) -> None:
    winner = _lww(candidates)
    assert winner == max(candidates)
    shuffled = data.draw(st.permutations(candidates + candidates[:3]))
    assert _lww(shuffled) == winner


@given(identity_candidates, identity_candidates)
def test_identity_wins_is_a_strict_total_order(a: tuple[Hlc, bytes], b: tuple[Hlc, bytes]) -> None:
    assert identity_wins(a, None)
    assert not identity_wins(a, a)
    if a != b:
        assert identity_wins(a, b) != identity_wins(b, a)


def test_identity_tie_is_broken_by_blob_bytes() -> None:
    assert identity_wins((Hlc(5), b"b"), (Hlc(5), b"a"))
    assert not identity_wins((Hlc(5), b"a"), (Hlc(5), b"b"))
    assert identity_wins((Hlc(5, 1), b"a"), (Hlc(5), b"zzz"))
    assert not identity_wins((Hlc(4), b"zzz"), (Hlc(5), b""))


# --- ChatMeta -----------------------------------------------------------------------------


@given(
    st.lists(
        st.tuples(bin32, small_hlcs(3, 1)),
        min_size=1,
        max_size=10,
        unique_by=operator.itemgetter(0),
    ),
    st.data(),
)
def test_meta_last_message_is_order_independent(
    entries: list[tuple[bytes, Hlc]], data: st.DataObject
) -> None:
    def fold(items: list[tuple[bytes, Hlc]]) -> ChatMeta:
        return reduce(lambda meta, e: meta_after_message(meta, e[0], e[1]), items, ChatMeta())

    meta = fold(entries)
    newest_hlc, newest_id = max((hlc, msg_id) for msg_id, hlc in entries)
    assert meta.last_msg_id == newest_id
    assert meta.last_msg_ts == newest_hlc.pack()
    assert meta.last_ts == newest_hlc.physical_ms
    assert meta.last_seq == len(entries)  # a local counter: counts, in arrival order

    other = fold(data.draw(st.permutations(entries)))
    assert (other.last_msg_id, other.last_msg_ts, other.last_ts, other.last_seq) == (
        meta.last_msg_id,
        meta.last_msg_ts,
        meta.last_ts,
        meta.last_seq,
    )


def test_meta_after_message_keeps_other_fields() -> None:
    base = ChatMeta(members=(b"\x01" * 20,), membership_hash=b"\x01" * 32, last_announced_ms=9)
    after = meta_after_message(base, b"\x07" * 32, Hlc(100, 3))
    assert after.members == base.members
    assert after.membership_hash == base.membership_hash
    assert after.last_announced_ms == 9
    assert after.last_seq == 1
    assert after.last_msg_ts == Hlc(100, 3).pack()
    # an older message only bumps the counter
    older = meta_after_message(after, b"\xff" * 32, Hlc(99))
    assert older == ChatMeta(
        last_ts=100,
        last_seq=2,
        last_msg_id=b"\x07" * 32,
        members=base.members,
        last_msg_ts=Hlc(100, 3).pack(),
        last_announced_ms=9,
        membership_hash=base.membership_hash,
    )


users = st.binary(min_size=20, max_size=20)


@given(
    st.lists(
        st.tuples(st.sampled_from([b"\x01" * 20, b"\x02" * 20, b"\x83" * 20]), st.booleans()),
        max_size=12,
    ),
    st.data(),
)
def test_meta_membership_is_a_function_of_the_final_active_set(
    changes: list[tuple[bytes, bool]], data: st.DataObject
) -> None:
    meta = reduce(lambda m, c: meta_after_membership(m, c[0], c[1]), changes, ChatMeta())
    final: dict[bytes, bool] = {}
    for user, active in changes:
        final[user] = active
    active_set = sorted(u for u, a in final.items() if a)
    assert list(meta.members) == active_set
    expected_hash = reduce(operator.xor, (int.from_bytes(u, "big") for u in active_set), 0)
    assert meta.membership_hash == expected_hash.to_bytes(32, "big")
    # the same final states in another order give the same meta
    reordered = data.draw(st.permutations(list(final.items())))
    other = reduce(lambda m, c: meta_after_membership(m, c[0], c[1]), reordered, ChatMeta())
    assert other == meta
