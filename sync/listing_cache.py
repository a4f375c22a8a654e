"""The store's id listings of buckets, kept in memory while their tree leaves do not change.

A sketch pass reads every id under the differing depth-3 nodes — at n = 10^6, d = 10^3 about
220,000 ids a side — and a RocksDB range read costs ~0.17 us an id with the block cache warm
(~0.35 cold): more than everything else the sketch path does (SYNC.md, "CPU"). The listing of
a bucket changes only with its tree leaf, and every change of a leaf bumps its counter
(``VersionedTree``), so a listing read at a leaf's count is still the listing while the count
is the same. The counts are read before the store: a write landing between the two leaves
the entry older than its leaf (read again next time), never newer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from store.keys import NUM_BUCKETS, RECORD_ID_LEN

# ids kept at most per domain (32 B each: 64 MiB): past it, listings are read through
DEFAULT_MAX_IDS = 1 << 21


class ListingCache:
    """One domain's listings, per bucket, for one retention cutoff (another cutoff lists
    other ids: the cache starts again). Python lists, not numpy: a sketch region is read as
    ~1,000 runs of ~16 buckets, and numpy's ~5 us a call, several calls a run, cost more
    than comparing 16 list items. One lock: sessions read from worker threads, and a
    listing kept with another read's count could pass for current."""

    def __init__(self, max_ids: int = DEFAULT_MAX_IDS) -> None:
        self.max_ids = max_ids
        self.ids_read = 0  # ids the store listed for this cache (statistics)
        self._cutoff: int | None = None
        self._lock = threading.Lock()
        self._clear()

    def _clear(self) -> None:
        self._blobs: list[bytes] = [b""] * NUM_BUCKETS
        self._versions: list[int] = [-1] * NUM_BUCKETS
        self._filled = np.zeros(NUM_BUCKETS, dtype=bool)  # buckets whose blob is not empty
        self._kept = 0

    def read(
        self,
        versions: list[int],
        start: int,
        end: int,
        cutoff_ms: int | None,
        read_store: Callable[[int, int], bytes],
    ) -> bytes:
        """The ids of buckets ``start <= b < end``, concatenated: ``read_runs`` of one run,
        ``read_store(lo, hi)`` reading one run of buckets."""
        return self.read_runs(
            versions, [(start, end)], cutoff_ms, lambda runs: [read_store(*run) for run in runs]
        )

    def read_runs(
        self,
        versions: list[int],
        runs: Sequence[tuple[int, int]],
        cutoff_ms: int | None,
        read_store: Callable[[list[tuple[int, int]]], list[bytes]],
    ) -> bytes:
        """The ids of the buckets of ``runs`` (ascending, disjoint ``(start, end)``),
        concatenated: kept listings whose leaf ``versions`` are unchanged, the rest read from
        the store and kept — ``read_store`` is given every run of such buckets at once (one
        call a region: a sketch region is ~700 runs, ~1,000 buckets of them changed since
        the last session on a busy node) and answers each run's ids."""
        with self._lock:
            if cutoff_ms != self._cutoff:
                self._cutoff = cutoff_ms
                self._clear()
            stale: list[tuple[int, int]] = []  # runs of buckets to read from the store
            seen_of: list[list[int]] = []  # their versions, read before the store
            kept_versions = self._versions
            for start, end in runs:
                seen = versions[start:end]  # a copy, before the store: see the module's docstring
                kept = kept_versions[start:end]
                if kept == seen:
                    continue
                if kept_versions[start] == -1 and kept == [-1] * len(kept):  # none kept yet
                    changed = [(0, end - start)]
                else:
                    changed = _runs(
                        [k for k, (a, b) in enumerate(zip(kept, seen, strict=True)) if a != b]
                    )
                for lo, hi in changed:
                    stale.append((start + lo, start + hi))
                    seen_of.append(seen[lo:hi])
            if stale and self._kept >= self.max_ids:  # past the bound: read through
                return b"".join(read_store(list(runs)))
            if stale:
                for (lo, hi), blob, seen in zip(stale, read_store(stale), seen_of, strict=True):
                    self.ids_read += len(blob) // RECORD_ID_LEN
                    self._keep(lo, hi, blob, seen)
            blobs = self._blobs
            if len(runs) == 1:
                return b"".join(blobs[runs[0][0] : runs[0][1]])
            out: list[bytes] = []
            for start, end in runs:
                out += blobs[start:end]
            return b"".join(out)

    def _keep(self, lo: int, hi: int, blob: bytes, versions: list[int]) -> None:
        """Keep a run's listing, split by bucket (the store lists by id: by bucket)."""
        if hi - lo == 1:  # one bucket, most re-reads: nothing to split, no numpy calls
            self._kept += (len(blob) - len(self._blobs[lo])) // RECORD_ID_LEN
            self._blobs[lo], self._filled[lo], self._versions[lo] = blob, bool(blob), versions[0]
            return
        buckets = np.frombuffer(blob, dtype=">u2")[:: RECORD_ID_LEN // 2].astype(np.int64)
        if len(buckets) > 1 and bool((buckets[1:] < buckets[:-1]).any()):
            order = np.argsort(buckets, kind="stable")
            rows = np.frombuffer(blob, dtype=np.uint8).reshape(-1, RECORD_ID_LEN)
            blob, buckets = rows[order].tobytes(), buckets[order]
        at = np.searchsorted(buckets, np.arange(lo, hi + 1)) * RECORD_ID_LEN
        sizes, bounds = np.diff(at), at.tolist()
        # only the buckets listing ids now or before: a store of few ids, read whole when
        # the replica opens, is not 65,536 steps
        for k in np.flatnonzero((sizes > 0) | self._filled[lo:hi]).tolist():
            self._kept += (int(sizes[k]) - len(self._blobs[lo + k])) // RECORD_ID_LEN
            self._blobs[lo + k] = blob[bounds[k] : bounds[k + 1]]
        self._filled[lo:hi] = sizes > 0
        self._versions[lo:hi] = versions


def _runs(indexes: list[int]) -> list[tuple[int, int]]:
    """Ascending indexes as half-open runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for k in indexes:
        if runs and runs[-1][1] == k:
            runs[-1] = (runs[-1][0], k + 1)
        else:
            runs.append((k, k + 1))
    return runs
