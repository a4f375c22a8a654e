"""The store's id listings of buckets, kept in memory while their tree leaves do not change.

A sketch pass reads every id under the differing depth-3 nodes — at n = 10^6, d = 10^3 about
220,000 ids a side — and a RocksDB range read costs ~0.17 us an id with the block cache warm
(~0.35 cold): more than everything else the sketch path does (SYNC.md, "CPU"). The listing of
a bucket changes only with its tree leaf, and every change of a leaf bumps its counter
(``VersionedTree``), so a listing read at a leaf's count is still the listing while the count
is the same. The counts are read before the store: a write landing between the two leaves
the entry older than its leaf (read again next time), never newer.

The replica's own writes keep a listing current instead of dropping it (``track``): the
writer changes the tree through the cache, which, under the lock the reads take, bumps the
leaf's count and applies the same add or removal to the listing if it was current just
before — so the next session reads nothing from the store for that bucket. The patches are
idempotent (an add of a listed id, a removal of an unlisted one, change nothing): a read
that landed between the writer's store write and its tree change already lists the write's
result, and each id's last change wins either way. With a retention cutoff each id's stamp
is kept beside it, so a later cutoff filters the kept listings instead of dropping them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from store.keys import NUM_BUCKETS, RECORD_ID_LEN
from sync.buckets import runs_of

if TYPE_CHECKING:
    from sync.merkle import VersionedTree

STAMP_LEN = 8  # a kept stamp: the id's HLC physical ms, big-endian (what a cutoff filters on)
NO_STAMP = 1 << 64  # the oldest stamp of a bucket listing none
# a change the replica makes: (id leaving, id entering, the entering id's stamp)
Change = tuple[bytes | None, bytes | None, int | None]
# one run's listing with its ids' stamps, in the same order
Stamped = tuple[bytes, bytes]

# ids kept at most per domain (32 B each: 64 MiB): past it, listings are read through
DEFAULT_MAX_IDS = 1 << 21


class ListingCache:
    """One domain's listings, per bucket, for one retention cutoff: a later cutoff filters
    them by the stamps kept with a cutoff, another (earlier, none, or no stamps kept)
    starts them again. Python lists, not numpy: a sketch region is read as
    ~1,000 runs of ~16 buckets, and numpy's ~5 us a call, several calls a run, cost more
    than comparing 16 list items. One lock: sessions read from worker threads, and a
    listing kept with another read's count could pass for current."""

    def __init__(self, max_ids: int = DEFAULT_MAX_IDS) -> None:
        self.max_ids = max_ids
        self.ids_read = 0  # ids the store listed for this cache (statistics)
        self._cutoff: int | None = None
        self._lock = threading.Lock()
        self._clear()

    @property
    def cutoff_ms(self) -> int | None:
        """The retention cutoff the kept listings are filtered by."""
        return self._cutoff

    def _clear(self, stamped: bool = False) -> None:
        self._blobs: list[bytes] = [b""] * NUM_BUCKETS
        self._versions: list[int] = [-1] * NUM_BUCKETS
        self._filled = np.zeros(NUM_BUCKETS, dtype=bool)  # buckets whose blob is not empty
        self._kept = 0
        # with a cutoff and a stamped store read: each id's stamp, in its blob's order, and
        # each bucket's oldest (a later cutoff filters only the buckets it reaches)
        self._stamps: list[bytes] | None = [b""] * NUM_BUCKETS if stamped else None
        self._oldest: list[int] = [NO_STAMP] * NUM_BUCKETS if stamped else []

    def _set_cutoff(self, cutoff_ms: int | None, stamped: bool) -> None:
        """Listings for ``cutoff_ms`` from now on: the kept ones filtered if it is later
        than theirs and their stamps are kept, else none."""
        old = self._cutoff
        self._cutoff = cutoff_ms
        if old is None or cutoff_ms is None or cutoff_ms < old or self._stamps is None:
            self._clear(stamped and cutoff_ms is not None)
            return
        for bucket in [b for b, oldest in enumerate(self._oldest) if oldest <= cutoff_ms]:
            self._filter(bucket, cutoff_ms)

    def _filter(self, bucket: int, cutoff_ms: int) -> None:
        assert self._stamps is not None
        ids, stamps = self._blobs[bucket], self._stamps[bucket]
        kept = [
            k
            for k in range(len(stamps) // STAMP_LEN)
            if int.from_bytes(stamps[k * STAMP_LEN : (k + 1) * STAMP_LEN], "big") > cutoff_ms
        ]
        self._kept -= len(ids) // RECORD_ID_LEN - len(kept)
        self._blobs[bucket] = b"".join(
            ids[k * RECORD_ID_LEN : (k + 1) * RECORD_ID_LEN] for k in kept
        )
        self._stamps[bucket] = b"".join(stamps[k * STAMP_LEN : (k + 1) * STAMP_LEN] for k in kept)
        self._filled[bucket] = bool(kept)
        self._oldest[bucket] = _oldest(self._stamps[bucket])

    def track(self, tree: VersionedTree, changes: Iterable[Change]) -> None:
        """Carry the replica's changes into ``tree`` (which must be the tree whose counts
        the reads are given) and into the kept listings: each leaf's count bumped with the
        listing patched, if it was current, under the reads' lock (the module's docstring).
        A patch this cannot make (no room, no stamp for an add under a cutoff) leaves the
        listing behind its leaf: read again next time."""
        with self._lock:
            for old, new, stamp in changes:
                if old == new:
                    continue
                if old is not None:
                    self._toggle(tree, old, None)
                if new is not None:
                    self._toggle(tree, new, -1 if stamp is None else stamp)

    def _toggle(self, tree: VersionedTree, record_id: bytes, stamp: int | None) -> None:
        """``record_id`` into the tree and the kept listing (``stamp``: its stamp, -1 unknown)
        or out of both (``stamp`` None)."""
        bucket = (record_id[0] << 8) | record_id[1]
        current = self._versions[bucket] == tree.versions[bucket]
        if stamp is None:
            tree.remove(record_id)
        else:
            tree.insert(record_id)
        if current and self._patch(bucket, record_id, stamp):
            self._versions[bucket] = tree.versions[bucket]

    def _patch(self, bucket: int, record_id: bytes, stamp: int | None) -> bool:
        blob = self._blobs[bucket]
        at = _find(blob, record_id)
        stamps = self._stamps
        if stamp is None:  # a removal
            if at < 0:
                return True
            self._blobs[bucket] = blob[:at] + blob[at + RECORD_ID_LEN :]
            if stamps is not None:
                k = at // RECORD_ID_LEN * STAMP_LEN
                stamps[bucket] = stamps[bucket][:k] + stamps[bucket][k + STAMP_LEN :]
                self._oldest[bucket] = _oldest(stamps[bucket])
            self._kept -= 1
            self._filled[bucket] = len(blob) > RECORD_ID_LEN
            return True
        if at >= 0:
            return True
        if self._cutoff is not None:
            if stamps is None or stamp < 0:
                return False  # no stamps kept, or an add whose stamp is unknown
            if stamp <= self._cutoff:
                return True  # filtered: not listed
        if self._kept >= self.max_ids:
            return False
        self._blobs[bucket] = blob + record_id
        if stamps is not None:
            stamps[bucket] += stamp.to_bytes(STAMP_LEN, "big")
            self._oldest[bucket] = min(self._oldest[bucket], stamp)
        self._kept += 1
        self._filled[bucket] = True
        return True

    def read(
        self,
        versions: list[int],
        start: int,
        end: int,
        cutoff_ms: int | None,
        read_store: Callable[[int, int], bytes],
        read_stamped: Callable[[int, int], Stamped] | None = None,
    ) -> bytes:
        """The ids of buckets ``start <= b < end``, concatenated: ``read_runs`` of one run,
        ``read_store(lo, hi)`` reading one run of buckets (``read_stamped`` with stamps)."""
        stamped = read_stamped
        return self.read_runs(
            versions,
            [(start, end)],
            cutoff_ms,
            lambda runs: [read_store(*run) for run in runs],
            None if stamped is None else lambda runs: [stamped(*run) for run in runs],
        )

    def read_runs(
        self,
        versions: list[int],
        runs: Sequence[tuple[int, int]],
        cutoff_ms: int | None,
        read_store: Callable[[list[tuple[int, int]]], list[bytes]],
        read_stamped: Callable[[list[tuple[int, int]]], list[Stamped]] | None = None,
    ) -> bytes:
        """The ids of the buckets of ``runs`` (ascending, disjoint ``(start, end)``),
        concatenated: kept listings whose leaf ``versions`` are unchanged, the rest read from
        the store and kept — ``read_store`` is given every run of such buckets at once (one
        call a region: a sketch region is ~700 runs, ~1,000 buckets of them changed since
        the last session on a busy node) and answers each run's ids. ``read_stamped``
        answers each run's ids and their stamps (8 bytes each, big-endian): given, listings
        under a cutoff keep their stamps, so a later cutoff filters them and the replica's
        adds patch them (``track``)."""
        with self._lock:
            stamped = read_stamped is not None and cutoff_ms is not None
            if cutoff_ms != self._cutoff:
                self._set_cutoff(cutoff_ms, stamped)
            if (self._stamps is not None) != stamped:  # kept with(out) stamps, read without
                self._clear(stamped)
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
                    changed = runs_of(
                        [k for k, (a, b) in enumerate(zip(kept, seen, strict=True)) if a != b]
                    )
                for lo, hi in changed:
                    stale.append((start + lo, start + hi))
                    seen_of.append(seen[lo:hi])
            if stale and self._kept >= self.max_ids:  # past the bound: read through
                return b"".join(read_store(list(runs)))
            if stale:
                if read_stamped is not None and stamped:
                    listed = read_stamped(stale)
                else:
                    listed = [(blob, b"") for blob in read_store(stale)]
                for (lo, hi), (blob, stamps), seen in zip(stale, listed, seen_of, strict=True):
                    self.ids_read += len(blob) // RECORD_ID_LEN
                    self._keep(lo, hi, blob, stamps, seen)
            blobs = self._blobs
            if len(runs) == 1:
                return b"".join(blobs[runs[0][0] : runs[0][1]])
            out: list[bytes] = []
            for start, end in runs:
                out += blobs[start:end]
            return b"".join(out)

    def _keep(self, lo: int, hi: int, blob: bytes, stamps: bytes, versions: list[int]) -> None:
        """Keep a run's listing (and its stamps, if kept), split by bucket (the store lists
        by id: by bucket)."""
        kept_stamps = self._stamps
        if hi - lo == 1:  # one bucket, most re-reads: nothing to split, no numpy calls
            self._kept += (len(blob) - len(self._blobs[lo])) // RECORD_ID_LEN
            self._blobs[lo], self._filled[lo], self._versions[lo] = blob, bool(blob), versions[0]
            if kept_stamps is not None:
                kept_stamps[lo], self._oldest[lo] = stamps, _oldest(stamps)
            return
        buckets = np.frombuffer(blob, dtype=">u2")[:: RECORD_ID_LEN // 2].astype(np.int64)
        if len(buckets) > 1 and bool((buckets[1:] < buckets[:-1]).any()):
            order = np.argsort(buckets, kind="stable")
            rows = np.frombuffer(blob, dtype=np.uint8).reshape(-1, RECORD_ID_LEN)
            blob, buckets = rows[order].tobytes(), buckets[order]
            if kept_stamps is not None:
                stamps = np.frombuffer(stamps, dtype=">u8")[order].tobytes()
        at = np.searchsorted(buckets, np.arange(lo, hi + 1))
        sizes, bounds = np.diff(at), at.tolist()
        # only the buckets listing ids now or before: a store of few ids, read whole when
        # the replica opens, is not 65,536 steps
        for k in np.flatnonzero((sizes > 0) | self._filled[lo:hi]).tolist():
            a, b = bounds[k], bounds[k + 1]
            self._kept += b - a - len(self._blobs[lo + k]) // RECORD_ID_LEN
            self._blobs[lo + k] = blob[a * RECORD_ID_LEN : b * RECORD_ID_LEN]
            if kept_stamps is not None:
                kept_stamps[lo + k] = stamps[a * STAMP_LEN : b * STAMP_LEN]
                self._oldest[lo + k] = _oldest(kept_stamps[lo + k])
        self._filled[lo:hi] = sizes > 0
        self._versions[lo:hi] = versions

    def listing(self, bucket: int) -> bytes | None:
        """The kept listing of ``bucket``, None if none is kept (tests: a listing kept at
        its leaf's current count is the store's)."""
        with self._lock:
            return None if self._versions[bucket] < 0 else self._blobs[bucket]

    def kept_versions(self) -> list[int]:
        """The leaf count each bucket's listing was kept at (-1: none kept)."""
        with self._lock:
            return self._versions[:]


def _find(blob: bytes, record_id: bytes) -> int:
    """Where ``record_id`` starts in ``blob`` (ids of RECORD_ID_LEN bytes), -1 if absent:
    at an id's start, not inside two (ids can be chosen)."""
    at = blob.find(record_id)
    while at >= 0 and at % RECORD_ID_LEN:
        at = blob.find(record_id, at + 1)
    return at


def _oldest(stamps: bytes) -> int:
    """The oldest of a listing's stamps (NO_STAMP: none)."""
    return min(
        (
            int.from_bytes(stamps[k : k + STAMP_LEN], "big")
            for k in range(0, len(stamps), STAMP_LEN)
        ),
        default=NO_STAMP,
    )
