"""sim/overlay.py: the node's peering code (sync/peering.py) run for many nodes — connections
between the waters, a few sessions per node, a cut closed and healed, a node back from a crash,
the issue's three-node demonstration, one overlay per seed."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from sim.bugs import BootstrapOnlyBook
from sim.network import Network
from sim.overlay import BookFactory, Overlay, OverlayParams
from sync.peering import PeerBook

P = OverlayParams(interval_ms=10_000)
Pairs = list[tuple[int, int]]


class World:
    """An overlay with its clock, who is up, and a network to cut."""

    def __init__(self, nodes: int, params: OverlayParams = P, book: BookFactory = PeerBook) -> None:
        self.overlay = Overlay(nodes, 1, params, book)
        self.net = Network(nodes, 1)
        self.alive = [True] * nodes
        self.round_no = 0

    def run(self, rounds: int) -> list[Pairs]:
        out = []
        for _ in range(rounds):
            self.round_no += 1
            out.append(self.overlay.round(self.round_no * 10_000, self.alive, self.net.can_talk))
        return out

    def cut(self, side: Sequence[bool]) -> None:
        self.net.partition([i for i, s in enumerate(side) if s], oneway=False)


def _side(nodes: int) -> list[bool]:
    return [i >= 3 and i % 2 == 1 for i in range(nodes)]


def test_the_same_seed_gives_the_same_overlay() -> None:
    def pairs(seed: int) -> list[Pairs]:
        overlay, alive = Overlay(200, seed, P), [True] * 200
        return [overlay.round(k * 10_000, alive, lambda a, b: True) for k in range(1, 9)]

    assert pairs(7) == pairs(7)
    assert pairs(7) != pairs(8)


def test_connections_settle_between_the_waters_and_each_node_syncs_a_few_peers() -> None:
    world = World(300)
    rounds = world.run(15)
    degrees = world.overlay.degrees()
    assert max(degrees) <= P.high and sum(degrees) / len(degrees) >= P.low
    assert world.overlay.stats.peak_degree <= 2 * P.high  # no node is everyone's peer
    for pairs in rounds[-5:]:
        started = [0] * 300
        for a, _ in pairs:
            started[a] += 1
        assert min(started) >= 1 and sum(started) / 300 <= P.per_interval + 1
    books = [len(b.peers) for b in world.overlay.books]
    assert min(books) > P.high  # peer exchange told every node of more peers than it holds


def test_a_cut_closes_the_connections_across_it_and_after_the_heal_they_come_back() -> None:
    world, side = World(300), _side(300)
    world.run(10)
    assert world.overlay.crossing(side) > 100
    world.cut(side)
    world.alive[:3] = [False] * 3  # the bootstrap nodes stop, for good
    world.run(10)
    assert world.overlay.crossing(side) == 0
    live = [d for i, d in enumerate(world.overlay.degrees()) if world.alive[i]]
    assert sum(live) / len(live) >= P.low and min(live) > 0  # each side refilled its own
    world.net.heal()
    world.run(6)
    assert world.overlay.crossing(side) > 50  # tried peers across the cut, dialled again


def test_without_turnover_a_healed_cut_stays_cut() -> None:
    """Why node/peers.py dials one more peer with each exchange between the waters: without
    it nobody is below the low water after the cut, so nobody dials across it again."""
    crossing = {}
    for turnover in (True, False):
        world, side = World(300, OverlayParams(interval_ms=10_000, turnover=turnover)), _side(300)
        world.run(10)
        world.cut(side)
        world.alive[:3] = [False] * 3
        world.run(20)
        world.net.heal()
        world.run(10)
        crossing[turnover] = world.overlay.crossing(side)
    assert crossing[False] <= 2 and crossing[True] > 50, crossing


def test_a_node_back_from_a_crash_keeps_its_tried_peers_not_its_heard_ones() -> None:
    world = World(100)
    world.run(8)
    book = world.overlay.books[50]
    tried = {p.peer_id for p in book.peers.values() if p.tried}
    assert book.counts()["heard"] > 0
    world.alive[50] = False
    world.run(1)
    assert not world.overlay.conns[50] and all(50 not in c for c in world.overlay.conns)
    world.alive[50] = True
    world.run(1)
    back = world.overlay.books[50]
    assert tried <= set(back.peers)  # what peers.json keeps
    assert len(world.overlay.conns[50]) >= P.low


@pytest.mark.parametrize(("book", "synced"), [(PeerBook, True), (BootstrapOnlyBook, False)])
def test_stop_the_bootstrap_node_of_three_and_the_other_two_still_sync(
    book: BookFactory, synced: bool
) -> None:
    """Issue 32's demonstration: nodes 1 and 2 know only node 0; they find each other by
    peer exchange, and sync after node 0 stops — unless a node uses its bootstrap peers only
    (the planted bug ``bootstrap-only``)."""
    world = World(3, OverlayParams(interval_ms=10_000, bootstrap=1), book)
    world.run(3)
    world.alive[0] = False
    after = [pair for pairs in world.run(3) for pair in pairs]
    assert ({(1, 2), (2, 1)} & set(after) != set()) is synced
