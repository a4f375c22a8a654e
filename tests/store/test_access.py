"""Who may post (store/access.py): admissible and visible as functions of the member ops.

The properties restate SECURITY.md "Who may post" directly on lists of stamps (the greatest
add at or before t beats the greatest remove at or before t; a tie goes to the remove) and
compare it with ``MemberHistory``, which keeps sorted tuples and bisects them.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from store.access import NO_HISTORY, Access, MemberHistory, admissible, is_party, visible
from store.hlc import Hlc
from store.records import MessageKind, MsgV1

from store_support import small_hlcs

CHAT = bytes([0x77]) * 32
ALICE, BOB, CAROL = (bytes([0x10 + i]) * 20 for i in range(3))

ops = st.lists(st.tuples(small_hlcs(), st.booleans()), max_size=12)  # (stamp, is_add)


def message(sender: bytes, hlc: Hlc) -> MsgV1:
    # Unsigned: admission reads only the sender and the stamp (signatures are checked before).
    return MsgV1(CHAT, sender, hlc, MessageKind.NEW, b"hi", None, bytes(32), bytes(64))


def active_by_definition(stamps: list[tuple[Hlc, bool]], t: Hlc) -> bool:
    adds = [s for s, is_add in stamps if is_add and s <= t]
    removes = [s for s, is_add in stamps if not is_add and s <= t]
    return bool(adds) and (not removes or max(removes) < max(adds))


@given(ops, small_hlcs())
def test_active_at_is_the_greatest_add_beating_the_greatest_remove(
    stamps: list[tuple[Hlc, bool]], t: Hlc
) -> None:
    history = MemberHistory.of(stamps)
    assert history.active_at(t) == active_by_definition(stamps, t)
    adds = [s for s, is_add in stamps if is_add]
    assert history.first_add() == (min(adds) if adds else None)


@given(ops, st.randoms())
def test_a_history_is_the_same_in_any_order_and_grown_one_op_at_a_time(
    stamps: list[tuple[Hlc, bool]], rnd
) -> None:  # type: ignore[no-untyped-def]
    history = MemberHistory.of(stamps)
    assert list(history.adds) == sorted({s for s, is_add in stamps if is_add})
    assert list(history.removes) == sorted({s for s, is_add in stamps if not is_add})
    shuffled = stamps + stamps[:3]  # duplicates change nothing
    rnd.shuffle(shuffled)
    assert MemberHistory.of(shuffled) == history
    grown = NO_HISTORY
    for stamp, is_add in shuffled:
        grown = grown.with_op(stamp, is_add)
    assert grown == history


def test_a_tie_goes_to_the_remove_and_a_later_add_comes_back() -> None:
    t = Hlc(5)
    history = MemberHistory.of([(t, True), (t, False)])
    assert not history.active_at(t)
    readded = history.with_op(Hlc(5, 1), True)
    assert not readded.active_at(t) and readded.active_at(Hlc(5, 1))
    assert not NO_HISTORY.active_at(Hlc(1 << 40)) and NO_HISTORY.first_add() is None


@given(ops, small_hlcs(), st.sampled_from([ALICE, BOB]))
def test_a_group_message_is_admissible_after_an_add_and_visible_while_active(
    stamps: list[tuple[Hlc, bool]], t: Hlc, sender: bytes
) -> None:
    history = MemberHistory.of(stamps)
    msg = message(sender, t)
    access = Access(history)
    added_by_then = any(is_add and s <= t for s, is_add in stamps)
    assert admissible(msg, access) == added_by_then
    if added_by_then:  # visible assumes admissible
        assert visible(msg, access) == active_by_definition(stamps, t)


@given(ops, small_hlcs(), st.sampled_from([ALICE, BOB, CAROL]))
def test_a_dm_admits_and_shows_its_two_parties_whatever_the_ops(
    stamps: list[tuple[Hlc, bool]], t: Hlc, sender: bytes
) -> None:
    access = Access(MemberHistory.of(stamps), dm_parties=min(ALICE, BOB) + max(ALICE, BOB))
    msg = message(sender, t)
    assert admissible(msg, access) == (sender in (ALICE, BOB))
    assert visible(msg, access)


def test_is_party_checks_both_halves_exactly() -> None:
    parties = ALICE + BOB
    assert is_party(ALICE, parties) and is_party(BOB, parties)
    assert not is_party(CAROL, parties)
    assert not is_party(ALICE[:-1], parties) and not is_party(parties, parties)
    assert not is_party(ALICE[1:] + BOB[:1], parties)  # straddling the middle
