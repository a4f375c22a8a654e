"""sync.buckets: a run of buckets read from the filled ones lists what a walk of every bucket
in the run lists."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from store.keys import NUM_BUCKETS, bucket_of
from sync.buckets import Buckets, RunSet, in_runs, runs_of

ids = st.binary(min_size=32, max_size=32)


@given(
    added=st.lists(ids, max_size=60),
    removed=st.lists(st.integers(0, 59), max_size=20),
    start=st.integers(0, NUM_BUCKETS),
    length=st.integers(0, NUM_BUCKETS),
)
def test_a_range_lists_what_every_bucket_in_it_holds(
    added: list[bytes], removed: list[int], start: int, length: int
) -> None:
    index, held = Buckets(), set()
    for record_id in added:
        index.add(record_id)
        held.add(record_id)
    for k in removed:
        if k < len(added):
            index.discard(added[k])
            held.discard(added[k])
    end = min(NUM_BUCKETS, start + length)
    listed = [i for ids_ in index.in_range(start, end) for i in ids_]
    assert sorted(listed) == sorted(i for i in held if start <= bucket_of(i) < end)
    assert [bucket_of(i) for i in listed] == sorted(bucket_of(i) for i in listed)  # in order
    for record_id in held:
        assert record_id in index.of(bucket_of(record_id))


def test_an_emptied_bucket_lists_nothing_and_an_unknown_one_reads_empty() -> None:
    index = Buckets()
    record_id = bytes([1, 2]) + bytes(30)
    index.add(record_id)
    index.discard(record_id)
    index.discard(bytes(32))  # never added: nothing to do
    assert [set(s) for s in index.in_range(0, NUM_BUCKETS)] == [set()]
    assert index.of(0) == ()


@given(st.sets(st.integers(0, NUM_BUCKETS - 1), max_size=300))
def test_runs_of_ascending_buckets_cover_them_and_nothing_else_in_maximal_runs(
    chosen: set[int],
) -> None:
    runs = runs_of(sorted(chosen))
    covered = [b for lo, hi in runs for b in range(lo, hi)]
    assert covered == sorted(chosen)
    # ascending, disjoint and maximal: a gap between every two runs
    assert all(hi < lo for (_, hi), (lo, _) in itertools.pairwise(runs))


@given(
    st.sets(st.integers(0, NUM_BUCKETS - 1), max_size=300),
    st.lists(st.integers(-5, NUM_BUCKETS + 5), max_size=100),
)
def test_in_runs_says_which_values_lie_in_the_runs(chosen: set[int], values: list[int]) -> None:
    inside = in_runs(np.asarray(values, dtype=np.intp), runs_of(sorted(chosen)))
    assert inside.tolist() == [v in chosen for v in values]


@given(
    st.sets(st.integers(0, NUM_BUCKETS - 1), max_size=300),
    st.sets(st.integers(0, NUM_BUCKETS - 1), max_size=20),
    st.lists(st.integers(0, NUM_BUCKETS - 1), max_size=30),
)
def test_a_run_set_holds_its_buckets_and_less_what_it_is_without(
    buckets: set[int], removed: set[int], probes: list[int]
) -> None:
    runs = RunSet(runs_of(sorted(buckets)))
    assert len(runs) == len(buckets)
    less = runs.without(removed | set(probes[:3]))
    kept = buckets - removed - set(probes[:3])
    assert len(less) == len(kept)
    for b in [*probes, *buckets, *removed]:
        assert (b in runs) == (b in buckets)
        assert (b in less) == (b in kept)
    assert all(lo < hi for lo, hi in less.runs)
    assert "a bucket" not in runs  # not an int: never a member
