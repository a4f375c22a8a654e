"""Limits: token buckets keyed by author or peer, the one per-author rate check, what a peer's
useless gossip may cost, the free-disk guard.

Over a limit the caller gets a clear error code — dm3's vocabulary: ``-32005 Limit
exceeded`` (rate) and ``-32011 Too big`` (size), ``disk_full`` for storage — and a
metric; nothing else is disturbed. Time is passed in. Misbehaving peers are
``node/penalties.py``'s.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from collections import Counter, OrderedDict
from collections.abc import Iterable
from pathlib import Path

from store.errors import ChatsyncError, InvalidInput
from store.ops import Op, op_author


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
        """Take ``amount`` tokens for ``key`` at ``now`` (seconds); False (and nothing taken)
        if there are too few. A clock that went back refills nothing."""
        if math.isinf(self.rate):
            return True
        tokens = self._refilled(key, now)
        allowed = tokens >= amount
        self._store(key, tokens - amount if allowed else tokens, now)
        return allowed

    def spend(self, key: bytes | str, amount: float, now: float) -> None:
        """Take ``amount`` tokens whatever is left: a bucket may fall into debt (down to
        ``-burst``), which the rate pays back before ``available`` is positive again."""
        if not math.isinf(self.rate):
            self._store(key, max(-self.burst, self._refilled(key, now) - amount), now)

    def available(self, key: bytes | str, now: float) -> float:
        """The tokens ``key`` holds at ``now`` (negative: in debt)."""
        return math.inf if math.isinf(self.rate) else self._refilled(key, now)

    def _refilled(self, key: bytes | str, now: float) -> float:
        tokens, last = self._buckets.pop(key, (self.burst, now))
        self._buckets[key] = (tokens, last)  # most recently used: last to be evicted
        return min(self.burst, tokens + max(0.0, now - last) * self.rate)

    def _store(self, key: bytes | str, tokens: float, now: float) -> None:
        self._buckets[key] = (tokens, now)
        if len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)


class AuthorRates:
    """The budget of new ops per author: one token bucket each, shared by the HTTP API and
    gossip (SECURITY.md). Anti-entropy is not limited per author: it carries history."""

    def __init__(self, ops_per_s: float, burst: float) -> None:
        self.ops_per_s = ops_per_s
        self._buckets = TokenBuckets(ops_per_s, burst)

    def check(self, ops: Iterable[Op], now_ms: int) -> None:
        """Take each author's ops from its bucket; at the first author over its rate raise
        RateLimited (that author's ops are not taken; those of the authors before it are).

        Pass only the ops this replica does not hold: anyone can replay an author's old
        signed ops, and that must not spend the author's budget.
        """
        now = now_ms / 1000
        for author, count in Counter(op_author(op) for op in ops).items():
            if not self._buckets.take(author, count, now):
                raise RateLimited(
                    f"author {author.hex()} is over {self.ops_per_s:g} ops/s "
                    "(dm3 -32005 Limit exceeded)"
                )


class GossipWaste:
    """What gossip that brings nothing may cost us, per forwarding peer: messages and bytes,
    each a token bucket of ``burst_s`` seconds at its rate.

    Every message we refuse spends its forwarder's budget — replays of ops we hold
    (``nothing_new``), a blocked forwarder's traffic, anything invalid — whatever points it
    also costs. A peer in debt is *throttled*: its messages are dropped before they are
    decoded, and each drop spends more, so a flood keeps it throttled (and ``PeerJudge``
    charges the drops: the flood ends in a ban). New valid ops spend nothing: an honest relay
    of fresh ops never runs out.
    """

    def __init__(self, messages_per_s: float, bytes_per_s: float, burst_s: float = 10.0) -> None:
        self._messages = TokenBuckets(messages_per_s, messages_per_s * burst_s)
        self._bytes = TokenBuckets(bytes_per_s, bytes_per_s * burst_s)

    def throttled(self, peer: bytes | str, now: float) -> bool:
        """Whether ``peer`` has spent its budget (its messages are dropped unread)."""
        return self._messages.available(peer, now) < 1 or self._bytes.available(peer, now) < 0

    def spend(self, peer: bytes | str, size: int, now: float) -> None:
        """A message of ``size`` bytes from ``peer`` brought nothing."""
        self._messages.spend(peer, 1, now)
        self._bytes.spend(peer, size, now)


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
