"""Peering: which peers a node knows, dials, keeps and reconciles with. Pure.

A node of a network, not of a cluster: it learns peers beyond its bootstrap list by
peer exchange, keeps what it learned across restarts, and holds a bounded number of
connections and sessions whatever the network's size (issue 32). The node
(``node/peers.py``) and the simulator (``sim/overlay.py``) both drive these classes;
time is passed in (ms), randomness comes from the caller's ``random.Random``.

* ``PeerBook`` — the known peers, bounded, in two tables as Bitcoin's address manager
  keeps them: *tried* (we were connected to it: what we hand out and persist) and
  *heard* (someone told us; never reached). A teller gets at most ``HEARD_PER_SOURCE``
  entries in *heard*, so a peer that advertises thousands of fake addresses fills its own
  corner and evicts its own entries, not the honest ones. A heard entry that fails
  ``HEARD_MAX_FAILURES`` dials is forgotten. Bootstrap peers are pinned: never evicted,
  redialled with backoff forever, but only when no other known peer is due.
* ``surplus`` — above ``high`` connections, which to close.
* ``SyncRotation`` — anti-entropy with ``per_interval`` peers per interval, least recently
  synced first: every connected peer within ceil(connected / per_interval) intervals, a
  new peer at once. Sessions per node per second do not grow with the network.
* The exchange's two frames (``encode_exchange`` / ``decode_exchange``): a request
  carries the asker's own listen addresses, an answer up to ``EXCHANGE_MAX_PEERS`` tried
  peers; every field bounded, anything else ``RemoteProtocolError``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import cbor2

from sync.errors import RemoteProtocolError

TRIED_MAX = 256  # peers we reached: ~200 B each in memory and in peers.json
HEARD_MAX = 512
HEARD_PER_SOURCE = 32  # heard entries one teller may hold
HEARD_MAX_FAILURES = 3  # dials before a heard peer is forgotten
TRIED_MAX_FAILURES = 10  # in a row, before a tried peer is forgotten
EXCHANGE_MAX_PEERS = 32  # peers in one answer
MAX_ADDRS = 4  # addresses kept per peer
MAX_ADDR_LEN = 256
MAX_PEER_ID_LEN = 128
MAX_EXCHANGE_BYTES = 64 * 1024


@dataclass
class KnownPeer:
    peer_id: str
    addrs: tuple[str, ...]
    tried: bool = False  # we were connected to it
    pinned: bool = False  # a bootstrap peer: never forgotten
    source: str = ""  # who told us of it ("" : bootstrap, or it told us itself)
    seen_ms: int = 0  # last connected, or last told of
    failures: int = 0  # failed dials in a row
    next_dial_ms: int = 0


def backoff_ms(failures: int, min_ms: int, max_ms: int, rnd: random.Random) -> int:
    """Delay before the next dial after ``failures`` in a row: exponential from ``min_ms``
    to ``max_ms``, with full jitter (dialers that failed together do not retry together)."""
    cap = min(max_ms, min_ms * (2 ** min(failures, 30)))
    return int(rnd.uniform(min_ms, cap))


@dataclass
class PeerBook:
    """The peers a node knows of (see the module doc)."""

    own_id: str
    backoff_min_ms: int = 500
    backoff_max_ms: int = 30_000
    peers: dict[str, KnownPeer] = field(default_factory=dict)

    # --- what we learn ---

    def pin(self, peer_id: str, addr: str) -> None:
        """A bootstrap peer: kept whatever happens."""
        entry = self._entry(peer_id, (addr,), source="", now_ms=0)
        entry.pinned = True
        if addr not in entry.addrs:
            entry.addrs = (addr, *entry.addrs)[:MAX_ADDRS]

    def heard(self, source: str, told: Iterable[tuple[str, Sequence[str]]], now_ms: int) -> int:
        """``source`` told us of these peers; returns how many were new to us. Addresses of a
        peer we reached are not replaced by hearsay."""
        added = 0
        for peer_id, addrs in told:
            if peer_id == self.own_id or not addrs:
                continue
            entry = self.peers.get(peer_id)
            if entry is None:
                self._make_room_in_heard(source)
                self.peers[peer_id] = KnownPeer(
                    peer_id, tuple(addrs)[:MAX_ADDRS], source=source, seen_ms=now_ms
                )
                added += 1
            elif not entry.tried and not entry.pinned:
                entry.seen_ms = now_ms
        return added

    def connected(self, peer_id: str, addrs: Sequence[str], now_ms: int) -> None:
        """We are connected to ``peer_id``, which listens on ``addrs`` (those we dialled, or
        those it told us itself): a tried peer."""
        if peer_id == self.own_id:
            return
        entry = self._entry(peer_id, tuple(addrs), source="", now_ms=now_ms)
        if addrs:
            fresh = tuple(addrs) + tuple(a for a in entry.addrs if a not in addrs)
            entry.addrs = fresh[:MAX_ADDRS]
        if not entry.tried:
            entry.tried, entry.source = True, ""
            self._make_room_in_tried()
        entry.seen_ms, entry.failures, entry.next_dial_ms = now_ms, 0, 0

    def dial_failed(self, peer_id: str, now_ms: int, rnd: random.Random) -> None:
        entry = self.peers.get(peer_id)
        if entry is None:
            return
        entry.failures += 1
        limit = TRIED_MAX_FAILURES if entry.tried else HEARD_MAX_FAILURES
        if entry.failures >= limit and not entry.pinned:
            del self.peers[peer_id]
            return
        delay = backoff_ms(entry.failures, self.backoff_min_ms, self.backoff_max_ms, rnd)
        entry.next_dial_ms = now_ms + delay

    # --- what we do with it ---

    def to_dial(
        self, count: int, skip: Collection[str], now_ms: int, rnd: random.Random
    ) -> list[KnownPeer]:
        """Up to ``count`` peers to dial now: due ones not in ``skip`` (connected, being
        dialled, blocked). Each pick takes a tried or a heard peer, half and half, as
        Bitcoin's address manager picks between its tables; pinned peers only when
        neither has one left. Measured with ``sim/overlay.py`` (SIM.md, "Peering by
        discovery"): pinned first, the bootstrap peers take a share of every node's
        redials, growing with the network; tried first, nodes that joined at once keep
        redialling the few peers the bootstrap peers named, which keep closing the surplus."""
        due = [
            p
            for p in self.peers.values()
            if p.peer_id not in skip and p.next_dial_ms <= now_ms and p.addrs
        ]
        rnd.shuffle(due)
        tried = [p for p in due if p.tried and not p.pinned]
        heard = [p for p in due if not p.tried and not p.pinned]
        chosen: list[KnownPeer] = []
        while len(chosen) < count and (tried or heard):
            table = tried if tried and (not heard or rnd.random() < 0.5) else heard
            chosen.append(table.pop())
        pinned = [p for p in due if p.pinned]
        return chosen + pinned[: count - len(chosen)]

    def sample(self, count: int, rnd: random.Random, skip: Collection[str] = ()) -> list[KnownPeer]:
        """Up to ``count`` tried peers, at random: what we hand out."""
        tried = [p for p in self.peers.values() if p.tried and p.peer_id not in skip]
        return rnd.sample(tried, min(count, len(tried)))

    def seen(self, peer_id: str, now_ms: int) -> None:
        """We are connected to ``peer_id`` now: a tried peer's mark of life (nothing else)."""
        entry = self.peers.get(peer_id)
        if entry is not None and entry.tried:
            entry.seen_ms = max(entry.seen_ms, now_ms)

    def reached_since(self, since_ms: int) -> list[str]:
        """Tried peers we were connected to at or after ``since_ms`` (alive lately)."""
        return [p.peer_id for p in self.peers.values() if p.tried and p.seen_ms >= since_ms]

    def known(self) -> list[str]:
        """Every peer in the book, tried, heard or pinned: as bounded as the book is."""
        return list(self.peers)

    def counts(self) -> dict[str, int]:
        tried = sum(1 for p in self.peers.values() if p.tried)
        return {"tried": tried, "heard": len(self.peers) - tried}

    # --- persistence (peers.json): tried and pinned peers ---

    def saved(self) -> dict[str, Any]:
        kept = [p for p in self.peers.values() if p.tried or p.pinned]
        kept.sort(key=lambda p: -p.seen_ms)
        return {
            "version": 1,
            "peers": [{"id": p.peer_id, "addrs": list(p.addrs)} for p in kept[:TRIED_MAX]],
        }

    def restore(self, saved: Any, now_ms: int) -> int:
        """Tried peers from ``saved()``'s output; anything malformed is skipped (a damaged
        file must not stop a node). Returns how many were restored."""
        rows = saved.get("peers") if isinstance(saved, dict) else None
        restored = 0
        for row in rows if isinstance(rows, list) else []:
            told = _told_peer(row)
            if told is None or told[0] == self.own_id or restored >= TRIED_MAX:
                continue
            entry = self._entry(told[0], tuple(told[1]), source="", now_ms=now_ms)
            entry.tried = True
            restored += 1
        return restored

    # --- bounds ---

    def _entry(self, peer_id: str, addrs: tuple[str, ...], source: str, now_ms: int) -> KnownPeer:
        entry = self.peers.get(peer_id)
        if entry is None:
            entry = KnownPeer(peer_id, addrs[:MAX_ADDRS], source=source, seen_ms=now_ms)
            self.peers[peer_id] = entry
        return entry

    def _make_room_in_heard(self, source: str) -> None:
        heard = [p for p in self.peers.values() if not p.tried and not p.pinned]
        from_source = [p for p in heard if p.source == source]
        if len(from_source) >= HEARD_PER_SOURCE:
            self._evict_oldest(from_source)
        elif len(heard) >= HEARD_MAX:
            # the teller holding the most entries gives one up
            loudest = Counter(p.source for p in heard).most_common(1)[0][0]
            self._evict_oldest([p for p in heard if p.source == loudest])

    def _make_room_in_tried(self) -> None:
        tried = [p for p in self.peers.values() if p.tried and not p.pinned]
        if len(tried) > TRIED_MAX:
            self._evict_oldest(tried)

    def _evict_oldest(self, entries: list[KnownPeer]) -> None:
        oldest = min(entries, key=lambda p: (p.seen_ms, p.peer_id))
        del self.peers[oldest.peer_id]


def surplus(
    connected: Sequence[str], high: int, rnd: random.Random, young: Collection[str] = ()
) -> list[str]:
    """Connections to close: those over ``high``, at random among the ones not ``young``
    (made within a grace period: a node joining or back from a crash is not turned away
    by every full peer it dials). Only those over ``high``: closing down to the low water
    closed 4 of 10 connections each time a dial arrived at a full node, and in a 20-node
    cluster under load that churn cut the gossip mesh (64 % delivered by gossip;
    ``chatsync bench scale``)."""
    over = len(connected) - high
    if over <= 0:
        return []
    settled = [c for c in connected if c not in young]
    return rnd.sample(settled, min(over, len(settled)))


class SyncRotation:
    """Which connected peers to reconcile with now (see the module doc).

    A slot opens every ``interval_ms / per_interval`` (+-25 %); at each, of the peers whose
    last session is at least 3/4 of an interval old, the one synced longest ago gets a
    session. A peer never synced (just connected), or one whose last session asked to go
    on (a catch-up), goes at once.
    """

    def __init__(self, interval_ms: int, per_interval: int, rnd: random.Random) -> None:
        self.interval_ms = interval_ms
        self.slot_ms = max(1, interval_ms // max(1, per_interval))
        self.rnd = rnd
        self.last_ms: dict[str, int] = {}
        self.urgent: set[str] = set()
        self.next_slot_ms = 0

    def pick(self, waiting: Sequence[str], now_ms: int) -> list[str]:
        """Of ``waiting`` (connected, willing, not in a session now), those to start now."""
        chosen = [p for p in waiting if p not in self.last_ms or p in self.urgent]
        rested = [
            p
            for p in waiting
            if p not in chosen and now_ms - self.last_ms[p] >= self.interval_ms * 3 // 4
        ]
        if rested and now_ms >= self.next_slot_ms:
            self.rnd.shuffle(rested)
            chosen.append(min(rested, key=lambda p: self.last_ms[p]))
            self.next_slot_ms = now_ms + int(self.slot_ms * self.rnd.uniform(0.75, 1.25))
        for peer in chosen:
            self.last_ms[peer] = now_ms
            self.urgent.discard(peer)
        return chosen

    def go_on(self, peer: str) -> None:
        """``peer``'s session wants another at once (used up its passes, moved records)."""
        self.urgent.add(peer)

    def keep_only(self, connected: Collection[str]) -> None:
        """Forget peers that left (bounded under churn); a peer that returns is new again."""
        for peer in [p for p in self.last_ms if p not in connected]:
            del self.last_ms[peer]
        self.urgent &= set(connected)


# --- the exchange's frames ---


class ExchangeFrame(IntEnum):
    ASK = 1  # [1, [own listen address, ...]]
    PEERS = 2  # [2, [[peer id, [address, ...]], ...]]


def encode_ask(own_addrs: Sequence[str]) -> bytes:
    return cbor2.dumps([ExchangeFrame.ASK, list(own_addrs)[:MAX_ADDRS]])


def encode_peers(peers: Sequence[KnownPeer]) -> bytes:
    rows = [[p.peer_id, list(p.addrs)] for p in peers[:EXCHANGE_MAX_PEERS]]
    return cbor2.dumps([ExchangeFrame.PEERS, rows])


def decode_ask(data: bytes) -> list[str]:
    body = _decode(data, ExchangeFrame.ASK)
    addrs = _addrs(body)
    if addrs is None:
        raise RemoteProtocolError("peer exchange: malformed addresses")
    return addrs


def decode_peers(data: bytes) -> list[tuple[str, list[str]]]:
    body = _decode(data, ExchangeFrame.PEERS)
    if not isinstance(body, list) or len(body) > EXCHANGE_MAX_PEERS:
        raise RemoteProtocolError(f"peer exchange: at most {EXCHANGE_MAX_PEERS} peers")
    peers = []
    for row in body:
        told = _told_peer(row)
        if told is None:
            raise RemoteProtocolError("peer exchange: malformed peer")
        peers.append(told)
    return peers


def _decode(data: bytes, expected: ExchangeFrame) -> Any:
    if len(data) > MAX_EXCHANGE_BYTES:
        raise RemoteProtocolError(f"peer exchange: frame over {MAX_EXCHANGE_BYTES} bytes")
    try:
        value = cbor2.loads(data)
    except Exception as exc:  # cbor2 raises many types on garbage; all mean the same here
        raise RemoteProtocolError(f"peer exchange: not CBOR ({type(exc).__name__})") from None
    if not isinstance(value, list) or len(value) != 2 or value[0] != expected:
        raise RemoteProtocolError(f"peer exchange: expected a {expected.name} frame")
    return value[1]


def _told_peer(row: Any) -> tuple[str, list[str]] | None:
    """``[peer id, [address, ...]]`` (or ``{"id", "addrs"}`` from peers.json), checked."""
    if isinstance(row, dict):
        row = [row.get("id"), row.get("addrs")]
    if not isinstance(row, list) or len(row) != 2:
        return None
    peer_id, addrs = row[0], _addrs(row[1])
    if not isinstance(peer_id, str) or not 0 < len(peer_id) <= MAX_PEER_ID_LEN or not addrs:
        return None
    return peer_id, addrs


def _addrs(value: Any) -> list[str] | None:
    if not isinstance(value, list) or len(value) > MAX_ADDRS:
        return None
    if not all(isinstance(a, str) and 0 < len(a) <= MAX_ADDR_LEN for a in value):
        return None
    return list(value)
