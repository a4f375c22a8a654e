"""The session's small parts and its bounds, each at its exact edge (sync/protocol.py).

test_protocol runs whole sessions; a session that converges can still hide an off-by-one in
a bitmap's padding, a budget, or which of two cutoffs wins. These tests pin those down.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sync.errors import RemoteProtocolError
from sync.frames import ID_PREFIX_LEN, IdList, PrefixWant
from sync.merkle import check_hash
from sync.protocol import (
    SessionStats,
    _decode_cell,
    _encode_cell,
    _later,
    _split,
    _take_within,
    decode_pure_cell,
    read_flags,
    salted_prefix,
    verify_each,
    write_flags,
)

from sync_support import message


@given(st.lists(st.integers(0, 1000), unique=True, max_size=40), st.data())
def test_flags_mark_exactly_the_chosen_items_msb_first(items: list[int], data) -> None:  # type: ignore[no-untyped-def]
    chosen = data.draw(st.sets(st.sampled_from(items)) if items else st.just(set()))
    flags = write_flags(items, chosen)
    assert len(flags) == (len(items) + 7) // 8
    assert read_flags(items, flags) == [i for i in items if i in chosen]
    for position, item in enumerate(items):  # bit 7 of byte 0 is the first item
        assert bool(flags[position // 8] >> (7 - position % 8) & 1) == (item in chosen)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 15])
def test_flags_of_the_wrong_length_or_past_the_end_are_refused(n: int) -> None:
    items = list(range(n))
    for flags in (bytes((n + 7) // 8 + 1), bytes((n + 7) // 8 - 1)):
        with pytest.raises(RemoteProtocolError) as info:
            read_flags(items, flags)
        assert info.value.reason == "bad_flags"
    padding = (8 - n % 8) % 8
    last = bytearray(write_flags(items, set(items)))
    assert read_flags(items, bytes(last)) == items  # every item set, no padding bit
    if padding:
        last[-1] |= 1  # the last padding bit
        with pytest.raises(RemoteProtocolError) as info:
            read_flags(items, bytes(last))
        assert info.value.reason == "bad_flags"


@given(st.none() | st.integers(-5, 50), st.integers(0, 50))
def test_the_session_cutoff_is_the_later_of_two_and_zero_means_none(
    own: int | None, peer: int
) -> None:
    present = [c for c in (own, peer) if c is not None and c > 0]
    assert _later(own, peer) == (max(present) if present else None)


@given(st.lists(st.integers(0, 5), max_size=8), st.integers(0, 12))
def test_id_lists_are_taken_from_the_front_while_they_fit(sizes: list[int], budget: int) -> None:
    items = [IdList(i, True, bytes(ID_PREFIX_LEN * n)) for i, n in enumerate(sizes)]
    pending = list(items)
    taken = _take_within(pending, budget)
    assert taken + pending == items  # in order, nothing lost
    assert sum(sizes[: len(taken)]) <= budget
    if pending:  # the next one would not have fit
        assert sum(sizes[: len(taken) + 1]) > budget
    wants = [PrefixWant(1, bytes(ID_PREFIX_LEN))]
    assert _take_within(wants, 1) == [PrefixWant(1, bytes(ID_PREFIX_LEN))] and wants == []


@given(st.integers(0, 1 << 40), st.integers(0, (1 << 256) - 1), st.integers(0, (1 << 32) - 1))
def test_cells_round_trip_and_counts_saturate_at_u32(count: int, xor: int, check: int) -> None:
    blob = _encode_cell(count, xor, check)
    assert len(blob) == 40
    assert _decode_cell(blob) == (min(count, (1 << 32) - 1), xor, check)


def test_a_pure_cell_must_name_an_id_of_its_own_bucket() -> None:
    record_id = bytes([0, 7]) + bytes(range(30))
    mine, theirs = (0, 0, 0), (1, int.from_bytes(record_id, "big"), check_hash(record_id))
    assert decode_pure_cell(7, mine, theirs) == (1, record_id)
    assert decode_pure_cell(8, mine, theirs) is None  # the XOR names an id of bucket 7
    assert decode_pure_cell(7, theirs, mine) == (-1, record_id)
    assert decode_pure_cell(7, mine, (2, theirs[1], theirs[2])) is None


def test_salted_prefixes_and_splits() -> None:
    record_id = bytes(range(32))
    prefix = salted_prefix(b"a" * 16, record_id)
    assert len(prefix) == ID_PREFIX_LEN and prefix != salted_prefix(b"b" * 16, record_id)
    assert _split(b"abcdefg", 3) == [b"abc", b"def", b"g"] and _split(b"", 3) == []


def test_reconciliation_bytes_count_both_ways_but_not_the_records() -> None:
    stats = SessionStats()
    stats.bytes_sent.update(tree=1, ids=2, records=1000, control=4)
    stats.bytes_received.update(tree=10, ids=20, records=5000, control=40)
    assert stats.reconciliation_bytes() == 77


def test_verify_each_answers_per_message() -> None:
    good = message(1)
    bad = message(2)
    forged = type(good)(*(getattr(good, f) for f in good.__dataclass_fields__))
    object.__setattr__(forged, "sig", bad.sig)  # another message's signature
    errors = verify_each([good, forged, bad])
    assert errors[0] is None and errors[2] is None
    assert errors[1] is not None and errors[1].reason == "bad_signature"
