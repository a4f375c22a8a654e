"""Record ids filed by their bucket (the first two bytes), for reading a run of buckets.

A session reads the ids of runs of buckets (``ids_in_range``): thousands of buckets a run
where a shard holds a few thousand ids, so walking the run bucket by bucket spends its time
on empty ones. The filled buckets are kept in order beside the map, and a run is read from
them alone.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Collection, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from store.keys import bucket_of


def runs_of(indexes: Sequence[int]) -> list[tuple[int, int]]:
    """Ascending indexes as half-open runs ``[lo, hi)`` of consecutive ones (in numpy: a
    depth-3 region is ~14,000 buckets in ~900 runs)."""
    if not indexes:
        return []
    at = np.asarray(indexes, dtype=np.int64)
    breaks = np.flatnonzero(np.diff(at) != 1) + 1
    starts = at[np.concatenate(([0], breaks))]
    ends = at[np.concatenate((breaks - 1, [len(at) - 1]))] + 1
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def in_runs(values: npt.NDArray[np.intp], runs: Sequence[tuple[int, int]]) -> npt.NDArray[np.bool_]:
    """Which of ``values`` lie in ``runs`` (ascending, disjoint ``[lo, hi)``): a bisect each."""
    if not runs:
        return np.zeros(len(values), dtype=bool)
    bounds = np.asarray(runs, dtype=np.intp)
    at = np.searchsorted(bounds[:, 0], values, side="right") - 1
    return np.asarray((at >= 0) & (values < bounds[np.maximum(at, 0), 1]))


class RunSet:
    """Buckets as ascending, disjoint runs ``[lo, hi)``: a region of up to 65,536 buckets
    (a whole domain) in a run or a few hundred, never a set of each."""

    __slots__ = ("_size", "_starts", "runs")

    def __init__(self, runs: list[tuple[int, int]]) -> None:
        self.runs = runs
        self._starts = [lo for lo, _ in runs]
        self._size = sum(hi - lo for lo, hi in runs)

    def __contains__(self, bucket: object) -> bool:
        if not isinstance(bucket, int):
            return False
        i = bisect_right(self._starts, bucket) - 1
        return i >= 0 and bucket < self.runs[i][1]

    def __len__(self) -> int:
        return self._size

    def without(self, buckets: Collection[int]) -> RunSet:
        """These runs less ``buckets`` (a few: the buckets a listing found inconsistent)."""
        cuts = sorted(b for b in buckets if b in self)
        if not cuts:
            return self
        out, j = [], 0
        for lo, hi in self.runs:
            while j < len(cuts) and cuts[j] < hi:
                if cuts[j] > lo:
                    out.append((lo, cuts[j]))
                lo, j = cuts[j] + 1, j + 1
            if lo < hi:
                out.append((lo, hi))
        return RunSet(out)


class Buckets:
    """bucket -> ids. An id may stay after its record left (readers check what is held);
    an emptied bucket stays in the order (reading it costs one empty set)."""

    __slots__ = ("_filled", "_ids")

    def __init__(self) -> None:
        self._ids: dict[int, set[bytes]] = {}
        self._filled: list[int] = []

    def add(self, record_id: bytes) -> None:
        bucket = bucket_of(record_id)
        ids = self._ids.get(bucket)
        if ids is None:
            ids = self._ids[bucket] = set()
            insort(self._filled, bucket)
        ids.add(record_id)

    def discard(self, record_id: bytes) -> None:
        ids = self._ids.get(bucket_of(record_id))
        if ids is not None:
            ids.discard(record_id)

    def of(self, bucket: int) -> set[bytes] | tuple[()]:
        return self._ids.get(bucket, ())

    def in_range(self, start: int, end: int) -> Iterator[set[bytes]]:
        """The id sets of the filled buckets in ``[start, end)``, in bucket order."""
        filled = self._filled
        lo = bisect_left(filled, start)
        hi = bisect_left(filled, end, lo)
        ids = self._ids
        return (ids[b] for b in filled[lo:hi])
