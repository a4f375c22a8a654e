"""Gossip batching, pure: when the next message closes and what it holds.

py-libp2p spends ~10 ms of CPU per message on each of 5 peers whatever its size
(``chatsync bench gossip``'s floor): the message rate, not the op rate, is what
saturates a small cluster. So ops are gathered into messages:

* a message closes once it holds ``batch_ops`` ops or half of ``max_bytes``;
* otherwise ``batch_delay`` after it opened (its first op, or the previous message's
  leftovers), but no sooner than the spacing after the previous message — after a
  quiet spell the first op still leaves after ``batch_delay``;
* the spacing is a fair share of the network's message budget: with P nodes publishing
  (``Publishers``: origins heard in the last ``PUBLISHERS_WINDOW_S``), P / ``messages_per_s``,
  between ``min_interval`` and ``max_interval``. Each message costs every node about D copies
  of ~1 ms whatever it holds, so at a fixed op rate a network of 20 publishers spacing
  their messages like 4 would pay ~5x per op (``chatsync bench scale``);
* and not while py-libp2p's outbound queue to some peer holds ``PACE_DEPTH`` RPCs or
  more (that queue drops what does not fit in 32): the message keeps growing instead —
  for at most ``PACE_MAX_WAIT_S`` past its deadline (a stuck peer must not stall gossip
  to the others; anti-entropy repairs what it misses).

``Batcher`` holds that state; every decision takes ``now`` (trio seconds) and the
outbound depth. ``GossipService.publish_loop`` is its I/O shell.
"""

from __future__ import annotations

import math

from node.gossip.settings import GossipSettings
from store.ops import Op, encode_ops

PACE_DEPTH = 8  # hold publishes while a peer's outbound queue (32 RPCs, then drops) has this many
PACE_POLL_S = 0.005
PACE_MAX_WAIT_S = 1.0
PUBLISHERS_WINDOW_S = 10.0
PUBLISHERS_MAX = 4096  # origins remembered (a forged origin fails pubsub's signature check)


class Publishers:
    """The nodes heard publishing lately (our own included), bounded."""

    def __init__(self) -> None:
        self.last_heard: dict[bytes, float] = {}

    def heard(self, origin: bytes, now: float) -> None:
        self.last_heard.pop(origin, None)
        self.last_heard[origin] = now  # newest last: the oldest go first
        while len(self.last_heard) > PUBLISHERS_MAX:
            del self.last_heard[next(iter(self.last_heard))]

    def count(self, now: float) -> int:
        """Origins heard in the last window, and us."""
        for origin in [o for o, t in self.last_heard.items() if now - t >= PUBLISHERS_WINDOW_S]:
            del self.last_heard[origin]
        return len(self.last_heard) + 1


class Batcher:
    def __init__(self, settings: GossipSettings) -> None:
        self.batch_ops = settings.batch_ops
        self.half_bytes = settings.max_bytes // 2
        self.batch_delay_s = settings.batch_delay_ms / 1000
        self.min_interval_s = settings.min_interval_ms / 1000
        self.max_interval_s = max(settings.max_interval_ms / 1000, self.min_interval_s)
        self.messages_per_s = settings.messages_per_s
        self.pending: list[Op] = []
        self._last_publish = -math.inf
        self._deadline = self._give_up = math.inf

    def add(self, ops: list[Op]) -> None:
        self.pending += ops

    def wants_more(self) -> bool:
        """Whether ops waiting in the queue should still be taken into this message."""
        return len(self.pending) < self.batch_ops

    def full(self) -> bool:
        return len(self.pending) >= self.batch_ops or _size(self.pending) > self.half_bytes

    def spacing(self, publishers: int) -> float:
        """The least time between two of our messages with ``publishers`` nodes publishing."""
        share = publishers / self.messages_per_s if self.messages_per_s > 0 else 0.0
        return min(self.max_interval_s, max(self.min_interval_s, share))

    def open(self, now: float, publishers: int = 1) -> None:
        """A message starts gathering (ops are pending): its deadline and its give-up time."""
        spaced = self._last_publish + self.spacing(publishers)
        self._deadline = max(now + self.batch_delay_s, spaced)
        self._give_up = self._deadline + PACE_MAX_WAIT_S

    def wake_at(self, now: float, depth: int) -> float | None:
        """None: close the message now. Otherwise the time to look again (an op arriving
        sooner is taken in, and the question asked again)."""
        if self.full():
            return None
        if now < self._deadline:
            return self._deadline
        if now >= self._give_up or depth < PACE_DEPTH:
            return None
        return min(now + PACE_POLL_S, self._give_up)

    def take(self) -> list[Op]:
        """One message's worth from the head of the pending ops."""
        size, n = 0, 0
        for op in self.pending[: self.batch_ops]:
            size += _op_size(op)
            n += 1
            if size > self.half_bytes:
                break
        batch, self.pending = self.pending[:n], self.pending[n:]
        return batch

    @staticmethod
    def paced(depth: int) -> bool:
        """Whether a closed message must wait for room in the outbound queues."""
        return depth >= PACE_DEPTH

    def hold_for_room(self, now: float, depth: int) -> bool:
        """Whether a closed message should still wait for room (at most until give-up)."""
        return depth >= PACE_DEPTH and now < self._give_up

    def published(self, now: float) -> None:
        self._last_publish = now


def encode_messages(batch: list[Op], max_bytes: int) -> list[tuple[int, bytes]]:
    """``batch`` encoded as gossip messages of at most ``max_bytes`` (halved until each
    fits, a single op excepted): (ops in it, its bytes) per message, in order."""
    data = encode_ops(batch)
    messages: list[tuple[int, bytes]] = []
    while len(data) > max_bytes and len(batch) > 1:
        half = len(batch) // 2
        messages += encode_messages(batch[:half], max_bytes)
        batch = batch[half:]
        data = encode_ops(batch)
    messages.append((len(batch), data))
    return messages


def _size(ops: list[Op]) -> int:
    return sum(_op_size(op) for op in ops)


def _op_size(op: Op) -> int:
    return len(op.encoded) if hasattr(op, "encoded") else 256
