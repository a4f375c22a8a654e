"""Limits: token buckets keyed by author or peer, peer penalties, and the free-disk guard.

Over a limit the caller gets a clear error code — dm3's vocabulary: ``-32005 Limit
exceeded`` (rate) and ``-32011 Too big`` (size), ``disk_full`` for storage — and a
metric; nothing else is disturbed. Time is passed in (seconds, monotonic).
"""

from __future__ import annotations

import contextlib
import shutil
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from store.errors import ChatsyncError, InvalidInput


class RateLimited(InvalidInput):
    """dm3 -32005 Limit exceeded."""

    reason = "rate_limited"


class StorageFull(ChatsyncError):
    """The disk is nearly full: writes are refused before RocksDB would fail mid-write."""

    reason = "disk_full"


class TokenBuckets:
    """One token bucket per key (author, peer): ``rate`` tokens/s, up to ``burst``.

    Keys are kept in LRU order and capped, so a flood of fresh keys costs bounded memory.
    """

    def __init__(self, rate: float, burst: float, max_keys: int = 100_000) -> None:
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self._buckets: OrderedDict[bytes | str, tuple[float, float]] = OrderedDict()

    def take(self, key: bytes | str, amount: float, now: float) -> bool:
        """Take ``amount`` tokens for ``key``; False (and nothing taken) if there are too few."""
        tokens, last = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        allowed = tokens >= amount
        self._buckets[key] = (tokens - amount if allowed else tokens, now)
        if len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return allowed


@dataclass
class PeerScore:
    points: float = 0.0
    updated: float = 0.0
    banned_until: float = 0.0


class PeerPenalties:
    """Misbehaviour points per peer, decaying by ``decay_per_s``; at ``threshold`` a ban of ``ban_s``."""

    def __init__(
        self, threshold: float = 10.0, decay_per_s: float = 0.05, ban_s: float = 600.0
    ) -> None:
        self.threshold = threshold
        self.decay_per_s = decay_per_s
        self.ban_s = ban_s
        self.scores: dict[str, PeerScore] = {}

    def penalize(self, peer: str, points: float, now: float) -> bool:
        """Add points; True if this pushed the peer over the threshold (ban it now)."""
        score = self.scores.setdefault(peer, PeerScore(updated=now))
        score.points = max(0.0, score.points - (now - score.updated) * self.decay_per_s) + points
        score.updated = now
        if score.points >= self.threshold and score.banned_until <= now:
            score.banned_until = now + self.ban_s
            score.points = 0.0
            return True
        return False

    def expired_bans(self, now: float) -> list[str]:
        """Peers whose ban has run out (their score is forgotten)."""
        done = [p for p, s in self.scores.items() if 0 < s.banned_until <= now]
        for peer in done:
            del self.scores[peer]
        return done


# Points per sync outcome: a peer that sends invalid or forged data loses standing fast;
# one that keeps offering records that change nothing (stale replays) loses it slowly.
SYNC_PENALTY = {
    "bad_signature": 5.0,
    "unauthorized": 5.0,
    "invalid_record": 5.0,
    "unsolicited": 5.0,
    "malformed_frame": 3.0,
    "unexpected_frame": 3.0,
    "bad_flags": 3.0,
    "bad_hashes": 3.0,
    "bad_cells": 3.0,
    "too_many_items": 3.0,
    "rate_limited": 2.0,
    "useless": 1.0,  # records received, none new
}


# Points per gossip message the validator refused, charged to the peer that forwarded it.
# An honest forwarder ran the same checks before forwarding, but it cannot know our clock or
# our token buckets: a message a little ahead of our clock, or over an author's rate here,
# costs nothing (an honest relay sends those too). A stamp beyond twice the allowed drift is
# no clock difference: it costs as much as a forgery.
GOSSIP_PENALTY = {
    "bad_signature": 5.0,
    "unauthorized": 5.0,
    "far_future": 5.0,
    "clock_drift": 0.0,
    "rate_limited": 0.0,
    "nothing_new": 0.0,  # a replay of ops we hold: dropped, not forwarded
    "blocked_peer": 0.0,
    "internal": 0.0,  # our bug, not theirs
}
GOSSIP_PENALTY_OTHER = 3.0  # malformed, oversized, unknown kinds


def check_free_disk(path: str, min_free_mb: int) -> None:
    """Raise StorageFull unless the data disk keeps ``min_free_mb`` free beyond the WAL.

    Data in the WAL is not in SST files yet: RocksDB must write it out again when it
    flushes (and on the next start), so that much space is reserved on top of the minimum —
    otherwise a node refused at the limit could not even restart.
    """
    if min_free_mb <= 0:
        return
    unflushed = 0
    for wal in Path(path).glob("*.log"):
        with contextlib.suppress(FileNotFoundError):  # RocksDB drops old WALs in the background
            unflushed += wal.stat().st_size
    free = shutil.disk_usage(path).free
    if free < min_free_mb * 1024 * 1024 + unflushed:
        raise StorageFull(
            f"only {free // (1024 * 1024)} MB free on the data disk (keeping {min_free_mb} MB "
            f"plus {unflushed // (1024 * 1024)} MB for the unflushed WAL): writes refused "
            "until space is freed"
        )
