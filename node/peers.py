"""Peers: our own reconnect loop to bootstrap peers, per-peer sync scheduling, an admin partition switch.

py-libp2p's bootstrap helper forgets a peer after 3 failed dials, so we dial
bootstrap addresses ourselves, forever, with jittered exponential backoff.
Anti-entropy runs with each connected peer on connect and then every
``sync_interval`` (+-25 % jitter so peers do not synchronise their sessions).
Peers on the blocklist (``node/penalties.py``: the admin switch and bans) are not
dialled, and are disconnected at the scheduler's next round (every 0.25 s).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable

import trio

from node.errors import PeerUnreachable
from node.p2p import PeerAddress, PeerHost, PeerId
from node.penalties import Blocklist
from node.sync_peers import SyncCandidates, Verdict

log = logging.getLogger(__name__)

MAX_FOLLOW_UPS = 30  # sessions in a row without the interval; then the interval again
DIAL_TIMEOUT_S = 5.0


def backoff_delays(min_s: float, max_s: float, rnd: random.Random) -> Callable[[int], float]:
    """Delay before the n-th retry: exponential from ``min_s`` to ``max_s``, with full jitter."""

    def delay(attempt: int) -> float:
        cap = min(max_s, min_s * (2 ** min(attempt, 30)))
        return rnd.uniform(min_s, cap)

    return delay


class PeerManager:
    def __init__(
        self,
        host: PeerHost,
        blocklist: Blocklist,
        *,
        reconnect_min_s: float,
        reconnect_max_s: float,
        sync_interval_s: float,
        candidates: SyncCandidates,
        rnd: random.Random | None = None,
    ) -> None:
        self.host = host
        self.rnd = rnd or random.Random()
        self.delay = backoff_delays(reconnect_min_s, reconnect_max_s, self.rnd)
        self.sync_interval_s = sync_interval_s
        self.candidates = candidates  # which peers speak sync (node/sync_peers.py)
        self.blocked = blocklist  # peer ids whose traffic is dropped
        self.dial_failures: dict[str, int] = {}

    # --- partition switch ---

    async def block(self, peer_id: str) -> None:
        self.blocked.add(peer_id)
        await self._disconnect(peer_id)

    def unblock(self, peer_id: str) -> None:
        self.blocked.discard(peer_id)

    async def _disconnect(self, peer_id: str) -> None:
        for peer in list(self.host.get_connected_peers()):
            if peer.to_base58() == peer_id:
                self.host.forget(peer)  # so nothing dials a blocked peer back
                await self.host.disconnect(peer)  # already gone: nothing to do

    def connected(self) -> list[str]:
        return [p.to_base58() for p in self.host.get_connected_peers()]

    # --- reconnect loop ---

    async def keep_connected(self, address: str) -> None:
        """Dial ``address`` (a /p2p/ multiaddr) whenever we are not connected to it. Forever."""
        parsed = self.host.parse_address(address)
        peer_id = parsed.peer_id
        attempt = 0
        while True:
            if peer_id in self.blocked or peer_id in self.connected():
                attempt = 0
                await trio.sleep(1.0)
                continue
            try:
                await self._dial(parsed)
                log.info("connected to %s", peer_id)
                attempt = 0
                self.dial_failures[peer_id] = 0
            except PeerUnreachable as exc:
                self.dial_failures[peer_id] = self.dial_failures.get(peer_id, 0) + 1
                wait = self.delay(attempt)
                attempt += 1
                log.debug("dial %s failed (%s); retry in %.1f s", peer_id, exc, wait)
                await trio.sleep(wait)

    async def _dial(self, address: PeerAddress) -> None:
        await self.host.dial(address, DIAL_TIMEOUT_S)  # DialFailed; re-adds the address

    # --- anti-entropy scheduling ---

    async def schedule_syncs(self, run_sync: Callable[[PeerId], Awaitable[bool]]) -> None:
        """Sync with each connected peer on connect and then periodically, one session per peer.

        ``run_sync`` answers whether to go on at once: a session that made progress but used up
        its passes before the trees matched (a node catching up on many records) is followed by
        the next one right away instead of after the interval — at most ``MAX_FOLLOW_UPS``
        times in a row, so a peer that keeps feeding a little news cannot hold us in sessions.
        """
        next_at: dict[str, float] = {}
        running: set[str] = set()
        follow_ups: dict[str, int] = {}
        async with trio.open_nursery() as nursery:
            while True:
                now = trio.current_time()
                peers = self.host.get_connected_peers()
                names = {peer.to_base58() for peer in peers}
                for table in (next_at, follow_ups):  # forget peers that left: bounded under churn
                    for gone in [name for name in table if name not in names]:
                        del table[gone]
                self.candidates.keep_only(names)
                for peer in peers:
                    name = peer.to_base58()
                    if name in self.blocked:
                        await self._disconnect(name)
                        continue
                    if name in running or not self._sync_due(peer, name, now, next_at):
                        continue
                    running.add(name)
                    nursery.start_soon(self._one_sync, run_sync, peer, running, next_at, follow_ups)
                await trio.sleep(0.25)

    def _sync_due(self, peer: PeerId, name: str, now: float, next_at: dict[str, float]) -> bool:
        """Whether to open a session with ``peer`` now; if so, or if it is no sync peer, its
        next look is set an interval (+-25 %) away."""
        protocols = self._protocols(peer)
        if self.candidates.protocols_changed(name, protocols):  # identify push: look again
            next_at.pop(name, None)
        if now < next_at.get(name, 0.0):
            return False
        verdict = self.candidates.verdict(name, protocols, now)
        if verdict is not Verdict.WAIT:
            next_at[name] = now + self.sync_interval_s * self.rnd.uniform(0.75, 1.25)
        return verdict is Verdict.OPEN

    def _protocols(self, peer: PeerId) -> list[str]:
        """What the peer's identify listed ([] before it answered, or once forgotten)."""
        peerstore = self.host.get_peerstore()
        return list(peerstore.get_protocols(peer)) if peerstore.has_peer(peer) else []

    @staticmethod
    async def _one_sync(
        run_sync: Callable[[PeerId], Awaitable[bool]],
        peer: PeerId,
        running: set[str],
        next_at: dict[str, float],
        follow_ups: dict[str, int],
    ) -> None:
        name = peer.to_base58()
        try:
            again = await run_sync(peer)
            follow_ups[name] = follow_ups.get(name, 0) + 1 if again else 0
            if again and follow_ups[name] <= MAX_FOLLOW_UPS:
                next_at[name] = trio.current_time()
        except Exception as exc:  # a session, whatever failed in it, must not end the node
            log.info("sync with %s failed: %s", peer, exc)
        finally:
            running.discard(name)
