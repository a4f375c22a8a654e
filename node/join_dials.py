"""Joining a shard no connected peer holds: dial a holder the node knows of (SYNC.md, "Joining").

The I/O shell of ``sync/joining.py`` (which decides whom to dial, and how often). When the
scope widens (``node/scopes.py``), the new shards and user shards become joins; every
``STEP_S`` the dialer asks for each join's holders (the 421 answer's ranking over the peer
book: ``NodeScopes.join_holders``, a worker thread's read), keeps only those it could dial
(connected, or in the book with an address), and lets ``JoinDials`` choose. A dial is the
peer manager's (``PeerManager.dial_known``); a holder it connected to is sent to the session
rotation at once (``SyncRotation.go_on``), so the node's ordinary sessions — follow-ups
included — reconcile the shard; ``SyncService.last_sync`` says when one converged.
Counted: ``scope_join_dials_total{result}`` (connected, failed) and
``scope_joins_total{result}`` (``sync/joining.py``'s results).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import trio

from node.clock import Clock
from node.metrics import Metrics
from node.peers import PeerManager
from node.syncer import SyncService
from sync.joining import (
    CAUGHT_UP,
    CONNECTED_HOLDER,
    Dial,
    Ended,
    JoinDials,
    Target,
    new_targets,
)
from sync.scope import Scope

log = logging.getLogger(__name__)

STEP_S = 0.5
# a join's holders, best first (peer ids, base58); may run in a worker thread
HoldersOf = Callable[[Sequence[Target]], Awaitable[dict[Target, list[str]]]]

DIALS_HELP = "dials of a shard's known holder when the node joined it, by result"
JOINS_HELP = (
    "shards joined, by how the join ended (connected_holder: no dial needed; no_holder: "
    "none known; caught_up; gave_up; timed_out; dropped: over the cap)"
)


class JoinDialer:
    def __init__(
        self,
        peers: PeerManager,
        sync: SyncService,
        holders_of: HoldersOf,
        metrics: Metrics,
        clock: Clock,
        planner: JoinDials | None = None,
    ) -> None:
        self.peers, self.sync, self.holders_of = peers, sync, holders_of
        self.metrics, self.clock = metrics, clock
        self.planner = planner or JoinDials()
        self._wake = trio.Event()
        peers.needed = self.planner.waiting_on

    def joined(self, old: Scope, new: Scope) -> None:
        """The scope widened from ``old`` to ``new``: its new shards are joins."""
        targets = new_targets(
            old.shards or (), new.shards or (), old.user_shards or (), new.user_shards or ()
        )
        self._ended(self.planner.add(targets))
        self._wake.set()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                if self.planner.targets():
                    await self.step(nursery)
                with trio.move_on_after(STEP_S):
                    await self._wake.wait()
                self._wake = trio.Event()

    async def step(self, nursery: trio.Nursery) -> None:
        """One look: sessions that caught a join up, then the dials to start."""
        for peer in self.planner.waiting_on():
            outcome = self.sync.last_sync.get(peer)
            if outcome is not None:
                self._ended(self.planner.synced(peer, bool(outcome.converged), outcome.started_ms))
        targets = self.planner.targets()
        if not targets:
            return
        ranked = await self.holders_of(targets)
        dialable = {t: [p for p in ranked.get(t, []) if self.peers.dialable(p)] for t in targets}
        connected = set(self.peers.connected())
        dials, ended = self.planner.step(self.clock.wall_ms(), dialable, connected)
        self._ended(ended)
        for dial in dials:
            nursery.start_soon(self._dial, dial)

    async def _dial(self, dial: Dial) -> None:
        log.info("joining %s: dialling holder %s", _name(dial.target), dial.peer)
        ok = False
        try:
            ok = await self.peers.dial_known(dial.peer)
        finally:
            self.planner.dialled(dial.peer, ok, self.clock.wall_ms())
            self.metrics.inc(
                "scope_join_dials", result="connected" if ok else "failed", help=DIALS_HELP
            )
        if ok:
            self.peers.rotation.go_on(dial.peer)  # a session with it at the next round
        else:
            log.info("joining %s: dial of %s failed", _name(dial.target), dial.peer)
        self._wake.set()

    def _ended(self, ended: list[Ended]) -> None:
        for end in ended:
            self.metrics.inc("scope_joins", result=end.result, help=JOINS_HELP)
            if end.result in (CAUGHT_UP, CONNECTED_HOLDER):
                log.info("joined %s (%s, %s)", _name(end.target), end.result, end.peer)
            else:  # no_holder, gave_up, timed_out, dropped: sessions with connected peers only
                log.warning(
                    "joining %s: %s; only sessions with the connected peers fill it",
                    _name(end.target), end.result,
                )  # fmt: skip


def _name(target: Target) -> str:
    return f"{'user shard' if target.user else 'shard'} {target.shard}"
