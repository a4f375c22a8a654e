"""The IBLT over salted short ids (sync.sketch): encode, subtract, peel, and failure detected."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sync.sketch import (
    HASHES,
    Sketch,
    SketchKey,
    bucket_of_short,
    cell_len,
    cells_for,
    decode_listing,
    encode_listing,
    listed_difference,
    lookup,
    short_id,
    short_id_width,
    short_ids,
)

KEY = SketchKey.derive(b"s" * 16, 0, 5)


def _ids(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(32) for _ in range(count)]


def _sketch(ids: list[bytes], m: int, key: SketchKey = KEY) -> Sketch:
    return Sketch.of(key, m, short_ids(key, b"".join(ids)))


def test_short_ids_match_one_by_one_and_depend_on_the_salt() -> None:
    ids = _ids(50, 1)
    bulk = short_ids(KEY, b"".join(ids))
    assert [short_id(KEY, i) for i in ids] == bulk.tolist()
    other = short_ids(SketchKey.derive(b"t" * 16, 0, KEY.width), b"".join(ids))
    assert bulk.tolist() != other.tolist()
    assert [bucket_of_short(s, KEY.width) for s in bulk.tolist()] == [
        (i[0] << 8) | i[1] for i in ids
    ]


def test_encode_decode_round_trip() -> None:
    sketch = _sketch(_ids(200, 2), cells_for(40))
    blob = sketch.encode()
    assert len(blob) == sketch.m * cell_len(KEY.width)
    back = Sketch.decode(KEY, sketch.m, blob)
    assert back.encode() == blob


@settings(max_examples=60, deadline=None)
@given(
    shared=st.integers(0, 300),
    only_a=st.integers(0, 40),
    only_b=st.integers(0, 40),
    seed=st.integers(0, 2**32),
)
def test_subtract_and_peel_names_exactly_the_difference(
    shared: int, only_a: int, only_b: int, seed: int
) -> None:
    ids = _ids(shared + only_a + only_b, seed)
    common, a_extra, b_extra = ids[:shared], ids[shared : shared + only_a], ids[shared + only_a :]
    m = cells_for(only_a + only_b)
    a = _sketch(common + a_extra, m)
    b = Sketch.decode(KEY, m, _sketch(common + b_extra, m).encode())
    peeled = a.subtract(b).peel()
    if peeled.complete:  # 1.5x cells: almost always; never a wrong answer either way
        assert sorted(peeled.mine) == sorted(short_id(KEY, i) for i in a_extra)
        assert sorted(peeled.theirs) == sorted(short_id(KEY, i) for i in b_extra)


def test_peeling_succeeds_at_the_planned_size() -> None:
    failures = 0
    for seed in range(40):
        ids = _ids(1_100, seed)
        a, b = ids[:1_000], ids[100:]
        m = cells_for(200)
        failures += not _sketch(a, m).subtract(_sketch(b, m)).peel().complete
    assert failures <= 2


def test_an_undersized_sketch_says_it_did_not_decode() -> None:
    ids = _ids(400, 3)
    m = cells_for(20)  # 42 cells for a difference of 300
    peeled = _sketch(ids[:300], m).subtract(_sketch(ids[300:], m)).peel()
    assert not peeled.complete


def test_garbage_cells_never_peel_past_the_bound() -> None:
    rng = random.Random(4)
    m = cells_for(30)
    blob = rng.randbytes(m * cell_len(KEY.width))
    peeled = Sketch.decode(KEY, m, blob).subtract(_sketch([], m)).peel(max_items=10)
    assert len(peeled.mine) + len(peeled.theirs) <= 10
    assert not peeled.complete


def test_tiny_short_ids_collide_and_lookup_returns_every_holder() -> None:
    key = SketchKey.derive(b"s" * 16, 0, width=3)  # 256 short ids per bucket: collisions certain
    ids = [b"\x07\x07" + i[2:] for i in _ids(600, 5)]  # all in one bucket
    shorts = short_ids(key, b"".join(ids))
    target = Counter(shorts.tolist()).most_common(1)[0][0]
    holders = [i for i, s in zip(ids, shorts.tolist(), strict=True) if s == target]
    assert len(holders) >= 2
    assert sorted(lookup(shorts, b"".join(ids), [target])) == sorted(holders)


def test_equal_sets_subtract_to_zero() -> None:
    ids = _ids(500, 6)
    m = cells_for(10)
    diff = _sketch(ids, m).subtract(_sketch(list(reversed(ids)), m))
    assert not diff.keys.any() and not diff.checks.any()
    peeled = diff.peel()
    assert peeled.complete and not peeled.mine and not peeled.theirs


def test_sizes_are_multiples_of_the_hashes() -> None:
    for d in (0, 1, 7, 1_000, 123_457):
        m = cells_for(d)
        assert m % HASHES == 0 and m >= 1.4 * d


def test_short_ids_are_sized_by_the_estimate_and_the_buckets() -> None:
    """The bucket and as many salted bits as keep a differing id sharing its short id with
    another of its bucket under 2^-8 a pass: wider for more differences or fuller buckets."""
    assert short_id_width(1, 1.5) == 4  # 2^-16 of a spare record
    assert short_id_width(1_000, 15.3) == 5  # n = 10^6, d = 10^3: 2^-16 x 15,300 = 0.23
    assert short_id_width(100_000, 15.3) == 6
    assert short_id_width(1e12, 1e6) == 8  # never wider than 8 bytes
    widths = [short_id_width(d, 15.3) for d in (1, 10, 100, 1_000, 10**4, 10**5, 10**6)]
    assert widths == sorted(widths)


def test_one_id_on_either_side_peels_with_its_sign() -> None:
    """No count on the wire: a pure cell's sign is whichever of its sums, as they are or
    negated, passes the check."""
    ids = _ids(101, 7)
    m = cells_for(1)
    mine = _sketch(ids, m).subtract(_sketch(ids[:100], m)).peel()
    theirs = _sketch(ids[:100], m).subtract(_sketch(ids, m)).peel()
    assert mine.complete and mine.mine == [short_id(KEY, ids[100])] and not mine.theirs
    assert theirs.complete and theirs.theirs == [short_id(KEY, ids[100])] and not theirs.mine


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 3_000), st.floats(0.3, 2.0), st.integers(0, 2**32))
def test_peeling_in_rounds_decodes_what_one_by_one_does(d: int, load: float, seed: int) -> None:
    """The numpy rounds are a faster order of the same peeling: the same ids, the same verdict
    (an undersized sketch stops short in both)."""
    ids = _ids(200 + d, seed)
    m = max(HASHES, int(d * load) // HASHES * HASHES)
    mine = ids[: 200 + d // 3]
    diff = _sketch(mine, m).subtract(_sketch(ids[:200] + ids[200 + d // 3 :], m))
    rounds = diff.peel()
    every = np.flatnonzero(diff.keys | diff.checks)
    one_by_one = diff._peel_one_by_one(diff.keys, diff.checks, every, m)
    assert rounds.complete == one_by_one.complete
    if rounds.complete:
        assert sorted(rounds.mine) == sorted(one_by_one.mine)
        assert sorted(rounds.theirs) == sorted(one_by_one.theirs)


@settings(max_examples=60)
@given(st.integers(3, 8), st.lists(st.integers(0, 2**64 - 1), max_size=40), st.data())
def test_a_listing_round_trips_and_decodes_to_the_set_difference(
    width: int, values: list[int], data: st.DataObject
) -> None:
    mask = (1 << (8 * width)) - 1
    ours = np.asarray([v & mask for v in values], dtype=np.uint64)
    theirs_list = data.draw(st.lists(st.sampled_from(values) if values else st.nothing()))
    theirs_list += data.draw(st.lists(st.integers(0, mask), max_size=10))
    theirs = np.asarray([v & mask for v in theirs_list], dtype=np.uint64)
    blob = encode_listing(theirs, width)
    assert len(blob) == width * len(set(theirs.tolist()))
    assert decode_listing(blob, width).tolist() == sorted(set(theirs.tolist()))
    peeled = listed_difference(ours, decode_listing(blob, width))
    assert peeled.complete
    assert peeled.mine == sorted(set(ours.tolist()) - set(theirs.tolist()))
    assert peeled.theirs == sorted(set(theirs.tolist()) - set(ours.tolist()))


@pytest.mark.parametrize("count", [10, 1_024, 1_025, 5_000])
def test_lookup_finds_the_same_holders_with_or_without_its_table(count: int) -> None:
    """Up to 1,024 short ids lookup searches them directly; above, through its table."""
    ids = _ids(count, count)
    shorts = short_ids(KEY, b"".join(ids))
    rng = random.Random(count)
    wanted = [*rng.sample(shorts.tolist(), min(20, count)), 12345]  # and one nobody holds
    expected = sorted(i for i, s in zip(ids, shorts.tolist(), strict=True) if s in set(wanted))
    assert sorted(lookup(shorts, b"".join(ids), wanted)) == expected
