"""A --scope auto node's scope (sync/serving.py): the users naming it as a home node, their
chats now, pins and the R rule; a shard no longer needed leaves after its grace period —
user shards too: those of served users and the R rule, and those written for, until a
session handed them over to a peer that keeps them, then the grace."""

from __future__ import annotations

from typing import cast

from hypothesis import given
from hypothesis import strategies as st

from sync.scope import shard_of, user_shard_of
from sync.serving import ServedScope

ME, OTHER = b"me-node", b"other-node"
ALICE, BOB = b"\x0a" * 20, b"\x0b" * 20
CHATS = [bytes([i]) * 32 for i in range(1, 9)]
S = 16


def served(**kw: object) -> ServedScope:
    return ServedScope(ME, S, grace_ms=1_000, **kw)  # type: ignore[arg-type]


def test_a_user_naming_us_brings_its_chats_and_others_do_not() -> None:
    scope = served()
    assert scope.see_identity(ALICE, [OTHER, ME])
    assert not scope.see_identity(BOB, [OTHER])
    scope.see_member(CHATS[0], ALICE, True)
    scope.see_member(CHATS[1], BOB, True)  # not ours: Bob names another node
    held, dropped, _ = scope.step(0)
    assert held.shards == {shard_of(CHATS[0], S)} and not dropped


def test_pins_and_rule_shards_are_held_without_any_user() -> None:
    scope = served(pinned_shards=frozenset({3}), rule_shards=frozenset({7}))
    assert scope.step(0)[0].shards == {3, 7}


def test_a_shard_no_longer_needed_leaves_after_its_grace_and_not_before() -> None:
    scope = served()
    scope.see_identity(ALICE, [ME])
    scope.see_member(CHATS[0], ALICE, True)
    shard = shard_of(CHATS[0], S)
    assert scope.step(0)[0].shards == {shard}
    scope.see_member(CHATS[0], ALICE, False)  # removed
    assert scope.step(100).expired == frozenset()  # still held in its grace
    assert scope.step(1_099)[0].shards == {shard} and scope.next_deadline_ms() == 1_100
    held, dropped, _ = scope.step(1_100)
    assert held.shards == frozenset() and dropped == {shard}
    assert scope.next_deadline_ms() is None


def test_a_shard_needed_again_within_its_grace_is_kept() -> None:
    scope = served()
    scope.see_identity(ALICE, [ME])
    scope.see_member(CHATS[0], ALICE, True)
    scope.step(0)
    scope.see_member(CHATS[0], ALICE, False)
    scope.step(10)
    scope.see_member(CHATS[0], ALICE, True)  # added back
    assert scope.step(5_000)[1] == frozenset()
    assert scope.step(5_000)[0].shards == {shard_of(CHATS[0], S)}


def test_a_user_moving_home_elsewhere_releases_its_chats() -> None:
    scope = served()
    scope.see_identity(ALICE, [ME])
    scope.see_member(CHATS[0], ALICE, True)
    scope.step(0)
    assert not scope.see_identity(ALICE, [OTHER])
    assert scope.step(1)[1] == frozenset()  # released now: its grace starts
    assert scope.step(1_001)[1] == {shard_of(CHATS[0], S)}


def test_shards_held_at_start_are_released_unless_needed() -> None:
    scope = served()
    scope.hold({1, 2})
    scope.see_identity(ALICE, [ME])
    scope.see_member(CHATS[0], ALICE, True)
    mine = shard_of(CHATS[0], S)
    assert scope.step(0)[0].shards == {1, 2, mine}
    assert scope.step(1_000)[1] == {1, 2} - {mine}


def test_a_user_shard_written_for_is_kept_until_handed_over_then_for_the_grace() -> None:
    """A cut longer than the grace (issue 33: the lost index entries): no session handed the
    write over, so the user shard stays, however long; once one did, the grace runs."""
    scope = served(rule_shards=frozenset({3}))
    scope.hold((), {3, 9}, 0)  # held at start: 9 is needed by nothing, but not handed over
    scope.wrote_for({5}, 0)
    held, _, expired = scope.step(0)
    assert held.user_shards == {3, 5, 9} and not expired
    assert scope.step(1_000_000).held.user_shards == {3, 5, 9}  # no hand-over: kept
    assert scope.next_deadline_ms() is None
    assert scope.handed_over({5, 9}, 0, 1_000_001) == frozenset()  # started with the write
    assert scope.handed_over({9}, 1, 1_000_001) == {9}
    assert scope.step(1_000_001).held.user_shards == {3, 5, 9}  # 9 in its grace
    assert scope.handed_over({5}, 2, 1_000_500) == {5}
    assert scope.next_deadline_ms() == 1_001_001
    held, _, expired = scope.step(1_001_001)
    assert held.user_shards == {3, 5} and expired == {9}
    held, _, expired = scope.step(1_001_500)
    assert held.user_shards == {3} and expired == {5}  # the R rule's stays


def test_a_write_during_the_hand_over_keeps_the_user_shard_unhanded() -> None:
    scope = served()
    scope.wrote_for({5}, 0)
    assert scope.handed_over({5}, 1, 10) == {5}
    scope.wrote_for({5}, 20)  # written again, in its grace: unhanded again
    assert scope.unhanded() == {5}
    assert scope.handed_over({5}, 15, 30) == frozenset()  # that session began before it
    assert scope.step(5_000).held.user_shards == {5}
    assert scope.handed_over({5}, 21, 5_000) == {5}
    assert scope.step(6_000).expired_users == {5}


def test_a_served_users_shard_is_kept_and_released_when_it_moves_home() -> None:
    scope = served()
    mine = user_shard_of(ALICE, S)
    scope.wrote_for({mine}, 0)  # its identity, put here: indexed first
    scope.see_identity(ALICE, [ME])
    assert scope.handed_over({mine}, 1, 1) == {mine}  # a session carried it to a holder
    assert scope.step(5_000).held.user_shards == {mine}  # served: needed, past the grace
    scope.see_identity(ALICE, [OTHER])
    assert scope.step(5_001).expired_users == frozenset()
    assert scope.step(6_001).expired_users == {mine}


events = st.lists(
    st.one_of(
        st.tuples(st.just("id"), st.sampled_from([ALICE, BOB]), st.booleans()),
        st.tuples(
            st.just("member"), st.sampled_from(CHATS), st.sampled_from([ALICE, BOB]), st.booleans()
        ),
    ),
    max_size=30,
)


@given(events)
def test_the_same_final_identities_and_rows_give_the_same_needed_shards(
    seen: list[tuple[object, ...]],
) -> None:
    """Whatever order the node learns identities and rows in, it needs the shards of the
    chats its served users are members of by the last state of each (as the store holds)."""
    scope = served()
    identity: dict[bytes, bool] = {}
    rows: dict[tuple[bytes, bytes], bool] = {}
    for event in seen:
        if event[0] == "id":
            user, ours = cast(bytes, event[1]), bool(event[2])
            identity[user] = ours
            if scope.see_identity(user, [ME] if ours else [OTHER]):
                for (chat, u), active in rows.items():  # the node rescans the user's rows
                    if u == user:
                        scope.see_member(chat, u, active)
        else:
            chat, user, active = cast(bytes, event[1]), cast(bytes, event[2]), bool(event[3])
            rows[(chat, user)] = active
            scope.see_member(chat, user, active)
    expected = {
        shard_of(chat, S) for (chat, user), active in rows.items() if active and identity.get(user)
    }
    assert scope.needed() == expected
