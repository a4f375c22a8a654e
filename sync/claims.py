"""Which session is reconciling which bucket: concurrent sessions split a catch-up.

A node that was down misses the same records at every peer, and on reconnect it runs a
session with several of them at once. Without coordination each session found the same
differing buckets and moved the same records: the node received, decoded and verified
every missing record once per session (4x with 4 peers), and the sessions competed for
the one writer. With a shared ``BucketClaims`` a session takes the differing buckets no
other live session holds (``take``), reconciles those, and leaves the rest for a later
pass: the sessions split the buckets between them, and each record travels once.

A session takes its buckets where it decides what the pass will move — the initiator
when it chooses the leaves it sends cells for, the responder when it reads them — and
gives them back at its next pass and when it ends (``release``), whatever the reason.
A bucket left to another session is only deferred: every session still ends with a
full-width root comparison, and a session that dies frees its buckets for the next pass.
A session that holds buckets and has brought no record for ``stale_ms`` (a stalled or
hostile peer trickling empty frames) holds them no longer: the next session takes them.
Pure: no I/O, time passed in; a lock because sessions step in worker threads.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable, Mapping

from sync.frames import Domain


class BucketClaims:
    def __init__(self, stale_ms: int = 5_000) -> None:
        self.stale_ms = stale_ms
        self._owner: dict[tuple[Domain, int], object] = {}
        self._progress_ms: dict[int, int] = {}  # id(owner) -> when it last took or brought
        self._of: dict[int, list[tuple[Domain, int]]] = {}  # id(owner) -> its keys
        self._lock = threading.Lock()

    def take(
        self, owner: object, domain: Domain, buckets: Iterable[int], limit: int, now_ms: int
    ) -> list[int]:
        """Of ``buckets`` (in order), the first ``limit`` that no other owner holds, or whose
        owner is stale; now ``owner``'s. Buckets ``owner`` already holds count as free."""
        taken: list[int] = []
        with self._lock:
            self._progress_ms[id(owner)] = now_ms
            for bucket in buckets:
                if len(taken) >= limit:
                    break
                key = (domain, bucket)
                holder = self._live_holder(key, now_ms)
                if holder is None:
                    self._owner[key] = owner
                    self._of.setdefault(id(owner), []).append(key)
                if holder is None or holder is owner:
                    taken.append(bucket)
        return taken

    def progress(self, owner: object, now_ms: int) -> None:
        """``owner`` brought records at ``now_ms``: its buckets stay its own."""
        with self._lock:
            if id(owner) in self._of:
                self._progress_ms[id(owner)] = now_ms

    def _live_holder(self, key: tuple[Domain, int], now_ms: int) -> object | None:
        """Who holds ``key``, unless nobody does or its holder is stale (under the lock)."""
        holder = self._owner.get(key)
        return None if holder is None or self._stale(holder, now_ms) else holder

    def _stale(self, holder: object, now_ms: int) -> bool:
        return now_ms - self._progress_ms.get(id(holder), now_ms) > self.stale_ms

    def release(self, owner: object) -> None:
        """Give back every bucket ``owner`` holds."""
        with self._lock:
            self._progress_ms.pop(id(owner), None)
            for key in self._of.pop(id(owner), ()):
                if self._owner.get(key) is owner:
                    del self._owner[key]

    def keep_only(self, owner: object, kept: Mapping[Domain, Collection[int]], now_ms: int) -> None:
        """Give back the buckets ``owner`` holds outside ``kept``, in one step under the lock:
        a release and a new take would let another owner take a kept bucket in between, and
        both sessions would then move its records."""
        with self._lock:
            stay = []
            for key in self._of.pop(id(owner), ()):
                if self._owner.get(key) is not owner:
                    continue
                if key[1] in kept.get(key[0], ()):
                    stay.append(key)
                else:
                    del self._owner[key]
            if stay:
                self._of[id(owner)] = stay
                self._progress_ms[id(owner)] = now_ms
            else:
                self._progress_ms.pop(id(owner), None)

    def held_by_others(
        self, owner: object, domain: Domain, buckets: Iterable[int], now_ms: int
    ) -> bool:
        """Whether other owners hold every one of ``buckets`` (none of them stale): a session
        need not descend under them, ``take`` would give it none."""
        with self._lock:
            for bucket in buckets:
                holder = self._live_holder((domain, bucket), now_ms)
                if holder is None or holder is owner:
                    return False
            return True

    def others_hold(self, owner: object) -> bool:
        """Whether another session holds buckets now: ``owner``'s next take may be cut short."""
        with self._lock:
            mine = sum(1 for key in self._of.get(id(owner), ()) if self._owner.get(key) is owner)
            return len(self._owner) > mine

    def held(self) -> int:
        """Buckets held by some session now (statistics)."""
        with self._lock:
            return len(self._owner)
