"""The overlay: who is connected to whom, and who reconciles with whom, round by round. Pure.

The uniform replay (``sim.network.Network.peer``) picks each node's partner from every
node: every node knows every node. A node of a network knows few (issue 32): it starts
from a few bootstrap peers, learns others by peer exchange, holds ``low``..``high``
connections and syncs with ``per_interval`` of them per interval. ``Overlay`` runs the
node's own classes — ``sync.peering.PeerBook``, ``surplus``, ``SyncRotation`` and the
exchange's frames — for N simulated nodes, one round per sync interval:

1. *Down and cut.* A node that goes down loses its connections; when it comes back its
   book holds what a node persists (``PeerBook.saved``: tried and pinned peers; heard
   ones are gone) and its rotation starts afresh. A connection across a partition fails.
2. *Dials.* A node below ``low`` dials up to ``low`` peers from ``to_dial``. A node at
   ``low`` or more that is due for an exchange and below ``high`` dials one more
   (``turnover``): without it an overlay where every node sits between low and high
   never dials again, and a healed partition stays cut for good. A dial to a node that
   is down or across a cut fails (``dial_failed``: backoff, and heard peers forgotten).
   A connection is symmetric; the dialler asks the dialled an exchange at once.
3. *Surplus.* A node above ``high`` closes the ``surplus`` connections over it.
4. *Exchange.* Every ``exchange_ms`` a node asks one connected peer: the ask carries
   its listen addresses, which make it a tried peer of the answerer (``connected``);
   the answer is up to ``exchange_peers`` tried peers (``sample``), which the asker
   files as heard from the answerer (``heard``). Bytes are the real frames' length.
5. *Partners.* Each node's ``SyncRotation`` over its connections, its clock run through
   the round's slots (``pick`` at the round's start, then at each ``next_slot_ms``
   within the interval): new peers at once, then one per slot. A node starts its
   sessions; its peers answer them.

Sessions run at the round's time; the overlay does not learn their outcome (so every
shard of a replay, which runs its own sessions, computes one and the same overlay).
Randomness: one ``random.Random`` per node, seeded from a hash of (seed, node), because
``sync.peering`` takes the caller's; the calls come in node order, so a seed gives one
overlay on any executor running the same Python.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sim.rand import h64
from sync.peering import (
    EXCHANGE_MAX_PEERS,
    PeerBook,
    SyncRotation,
    encode_ask,
    encode_peers,
    surplus,
)

CanTalk = Callable[[int, int], bool]  # both directions open between two nodes
BookFactory = Callable[[str], PeerBook]  # a node's book from its id: the real one, or a bug's


@dataclass(frozen=True)
class OverlayParams:
    interval_ms: int  # one round: the sync interval
    low: int = 6  # connections: dial below this ...
    high: int = 10  # ... close the connections over this
    per_interval: int = 2  # sync partners per interval
    exchange_ms: int = 30_000  # peer exchange: on connect and this often (+-25 %) ...
    exchange_short_ms: int = 5_000  # ... and this often while below low after dialling
    exchange_peers: int = EXCHANGE_MAX_PEERS
    bootstrap: int = 3  # nodes 0..bootstrap-1 are every node's pinned bootstrap peers
    turnover: bool = True  # one more dial per exchange while below high (see the module doc)


@dataclass
class RoundStats:
    """What one round of the overlay did (connections counted once, not per end)."""

    dials: int = 0
    dials_failed: int = 0
    connects: int = 0
    closed_surplus: int = 0
    dropped: int = 0  # connections lost to a node going down or to a cut
    exchanges: int = 0
    exchange_bytes: int = 0  # both frames, both directions
    connections: int = 0  # held at the round's end
    peak_degree: int = 0  # the most connections one node held (before closing surplus)
    sessions: int = 0


class Overlay:
    def __init__(
        self, nodes: int, seed: int, params: OverlayParams, book: BookFactory = PeerBook
    ) -> None:
        self.n = nodes
        self.params = params
        self.ids = [str(i) for i in range(nodes)]
        self.addrs = [(f"/sim/{i}",) for i in range(nodes)]
        self.bootstrap = list(range(min(params.bootstrap, nodes)))
        self._book_factory = book
        self.rnds = [random.Random(h64(seed, "overlay", i)) for i in range(nodes)]
        self.books = [self._new_book(i) for i in range(nodes)]
        self.rotations = [self._new_rotation(i) for i in range(nodes)]
        self.conns: list[set[int]] = [set() for _ in range(nodes)]
        self.new_conns: list[set[int]] = [set() for _ in range(nodes)]  # made this round
        self.up = [True] * nodes
        # first exchanges spread over one exchange interval from the first round
        self._exchange_offset = [
            h64(seed, "exchange", i) % params.exchange_ms for i in range(nodes)
        ]
        self.next_exchange_ms: list[int] | None = None
        self.last_exchange_ms = [-(1 << 62)] * nodes
        self.stats = RoundStats()

    def _new_book(self, node: int, saved: PeerBook | None = None, now_ms: int = 0) -> PeerBook:
        book = self._book_factory(self.ids[node])
        for b in self.bootstrap:
            if b != node:
                book.pin(self.ids[b], self.addrs[b][0])
        if saved is not None:
            book.restore(saved.saved(), now_ms)
        return book

    def _new_rotation(self, node: int) -> SyncRotation:
        p = self.params
        return SyncRotation(p.interval_ms, p.per_interval, self.rnds[node])

    # --- one round ---

    def round(self, now_ms: int, alive: Sequence[bool], can_talk: CanTalk) -> list[tuple[int, int]]:
        """One sync interval at ``now_ms``: the (initiator, responder) sessions to run."""
        if self.next_exchange_ms is None:
            self.next_exchange_ms = [now_ms + off for off in self._exchange_offset]
        self.stats = s = RoundStats()
        self._down_and_cut(now_ms, alive, can_talk)
        live = [i for i in range(self.n) if alive[i]]
        for i in live:
            self._dial(i, now_ms, alive, can_talk)
        s.peak_degree = max((len(self.conns[i]) for i in live), default=0)
        for i in live:
            self._close_surplus(i)
        for fresh in self.new_conns:
            fresh.clear()
        for i in live:
            self._exchange_due(i, now_ms)
        pairs = [(i, j) for i in live for j in self._partners(i, now_ms)]
        s.connections = sum(len(self.conns[i]) for i in live) // 2
        s.sessions = len(pairs)
        return pairs

    def _down_and_cut(self, now_ms: int, alive: Sequence[bool], can_talk: CanTalk) -> None:
        for i in range(self.n):
            if not alive[i] and self.up[i]:
                for j in sorted(self.conns[i]):
                    self._disconnect(i, j)
                    self.stats.dropped += 1
                self.up[i] = False
            elif alive[i] and not self.up[i]:
                # back: what a node persists (tried and pinned peers), a rotation afresh
                self.books[i] = self._new_book(i, self.books[i], now_ms)
                self.rotations[i] = self._new_rotation(i)
                self.up[i] = True
        for i in range(self.n):
            for j in sorted(self.conns[i]):
                if i < j and not can_talk(i, j):
                    self._disconnect(i, j)
                    self.stats.dropped += 1

    def _dial(self, i: int, now_ms: int, alive: Sequence[bool], can_talk: CanTalk) -> None:
        p, conns = self.params, self.conns[i]
        want = p.low - len(conns)
        if want <= 0:
            assert self.next_exchange_ms is not None
            due = now_ms >= self.next_exchange_ms[i]
            want = int(p.turnover and due and len(conns) < p.high)
        if want <= 0:
            return
        book, rnd = self.books[i], self.rnds[i]
        skip = {self.ids[j] for j in conns}
        for peer in book.to_dial(want, skip, now_ms, rnd):
            j = int(peer.peer_id)
            self.stats.dials += 1
            if not alive[j] or not can_talk(i, j):
                book.dial_failed(peer.peer_id, now_ms, rnd)
                self.stats.dials_failed += 1
                continue
            conns.add(j)
            self.conns[j].add(i)
            self.new_conns[i].add(j)
            self.new_conns[j].add(i)
            book.connected(peer.peer_id, self.addrs[j], now_ms)
            self.stats.connects += 1
            self._exchange(i, j, now_ms)

    def _exchange_due(self, i: int, now_ms: int) -> None:
        """The periodic exchange; sooner while ``i`` is short of peers (as the node asks)."""
        assert self.next_exchange_ms is not None
        p, conns, rnd = self.params, self.conns[i], self.rnds[i]
        short = len(conns) < p.low and now_ms - self.last_exchange_ms[i] >= p.exchange_short_ms
        if conns and (now_ms >= self.next_exchange_ms[i] or short):
            self.next_exchange_ms[i] = now_ms + int(p.exchange_ms * rnd.uniform(0.75, 1.25))
            self._exchange(i, rnd.choice(sorted(conns)), now_ms)

    def _close_surplus(self, i: int) -> None:
        p = self.params
        conns = self.conns[i]
        if len(conns) <= p.high:
            return
        young = {self.ids[j] for j in self.new_conns[i]}  # the node's grace: one round
        for peer in surplus([self.ids[j] for j in sorted(conns)], p.high, self.rnds[i], young):
            self._disconnect(i, int(peer))
            self.stats.closed_surplus += 1

    def _exchange(self, asker: int, answerer: int, now_ms: int) -> None:
        """``asker`` asks ``answerer`` for peers, telling it where it listens."""
        ask = encode_ask(self.addrs[asker])
        book = self.books[answerer]
        book.connected(self.ids[asker], self.addrs[asker], now_ms)
        told = book.sample(self.params.exchange_peers, self.rnds[answerer], (self.ids[asker],))
        answer = encode_peers(told)
        self.books[asker].heard(self.ids[answerer], [(t.peer_id, t.addrs) for t in told], now_ms)
        self.last_exchange_ms[asker] = now_ms
        self.stats.exchanges += 1
        self.stats.exchange_bytes += len(ask) + len(answer)

    def _disconnect(self, i: int, j: int) -> None:
        self.conns[i].discard(j)
        self.conns[j].discard(i)

    def _partners(self, i: int, now_ms: int) -> list[int]:
        """The peers ``i`` starts a session with in the interval from ``now_ms``."""
        rotation = self.rotations[i]
        waiting = [self.ids[j] for j in sorted(self.conns[i])]
        rotation.keep_only(set(waiting))
        if not waiting:
            return []
        chosen = rotation.pick(waiting, now_ms)
        end = now_ms + self.params.interval_ms
        while rotation.next_slot_ms < end:
            slot = rotation.next_slot_ms
            chosen += rotation.pick(waiting, max(now_ms, slot))
            if rotation.next_slot_ms == slot:
                break
        return sorted({int(peer) for peer in chosen})  # picked twice in a round: one session

    # --- what it looks like ---

    def degrees(self) -> list[int]:
        return [len(c) for c in self.conns]

    def crossing(self, side: Sequence[bool]) -> int:
        """Connections between nodes on different sides of ``side`` (a partition's group)."""
        return sum(1 for i in range(self.n) for j in self.conns[i] if i < j and side[i] != side[j])
