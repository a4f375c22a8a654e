"""Peers: discovery, a bounded set of connections, sessions with a few of them at a time.

The I/O shell of ``sync/peering.py`` (which decides; this module dials, asks and waits):

* **Connections between ``peers_low`` and ``peers_high``.** Below the low water the
  maintenance loop dials peers the ``PeerBook`` names (tried and heard ones, bootstrap
  pins when none is due; with backoff); above the high water it closes the surplus.
  py-libp2p's own bootstrap forgets a peer after 3 failed dials; a pinned peer here is
  redialled forever.
* **Turnover.** With each periodic exchange a node between the waters dials one more
  peer (the surplus is closed above the high water), so the connections keep mixing.
  Without it a partition that heals after every node refilled its connections on its
  own side stays cut: nobody below the low water, nobody dials (``sim/overlay.py``).
* **Peer exchange** (``/chatsync/peers/1``): right after a dial, and every
  ``exchange_interval_s``, one connected peer is asked for peers it reached itself; the
  ask carries our listen addresses, which makes us a tried peer of the answerer. An asker
  is answered once per ``EXCHANGE_MIN_S``; more often is refused.
* **The book survives a restart** (``peers.json`` in the data directory, written when its
  tried peers change, at most once per maintenance round), so a restart does not depend
  on the bootstrap node.
* **Anti-entropy with ``sync_per_interval`` peers per interval** (``SyncRotation``), each
  peer at most once an interval: sessions per second do not grow with the connections.

Peers on the blocklist (``node/penalties.py``: the admin switch and bans) are not dialled,
and are disconnected at the scheduler's next round (every 0.25 s).
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path

import trio

from node.errors import InvalidAddress, PeerUnreachable, StreamClosed
from node.metrics import Metrics
from node.p2p import PEERS_PROTOCOL, PeerHost, PeerId, PeerStream
from node.penalties import Blocklist
from node.sync_peers import SyncCandidates, Verdict
from sync.errors import RemoteProtocolError
from sync.peering import (
    EXCHANGE_MAX_PEERS,
    MAX_EXCHANGE_BYTES,
    PeerBook,
    SyncRotation,
    decode_ask,
    decode_peers,
    encode_ask,
    encode_peers,
    surplus,
)

log = logging.getLogger(__name__)

MAX_FOLLOW_UPS = 30  # sessions in a row without the interval; then the interval again
DIAL_TIMEOUT_S = 5.0
DIALS_AT_ONCE = 4
CONNECTION_GRACE_S = 10.0  # a connection this young is not closed as surplus
MAINTAIN_S = 1.0
EXCHANGE_TIMEOUT_S = 10.0
IDENTIFY_WAIT_S = 5.0  # after a dial, before asking the new peer for peers
EXCHANGE_MIN_S = 5.0  # an asker is answered at most this often
EXCHANGE_WHEN_SHORT_S = 5.0  # ask this often while below the low water with nobody to dial
PEERS_FILE = "peers.json"
# a peer connected to within this counts as alive for the R rule (``reached``): well below
# ``scope_grace_s`` (a day), so a dead peer leaves the view before a shard it took from us
# would leave our disk (SYNC.md, "Replication factor")
REACHED_WITHIN_S = 600.0


class PeerManager:
    def __init__(
        self,
        host: PeerHost,
        blocklist: Blocklist,
        *,
        low: int,
        high: int,
        reconnect_min_s: float,
        reconnect_max_s: float,
        sync_interval_s: float,
        sync_per_interval: int,
        exchange_interval_s: float,
        candidates: SyncCandidates,
        metrics: Metrics,
        peers_file: Path | None = None,
        rnd: random.Random | None = None,
    ) -> None:
        self.host = host
        self.rnd = rnd or random.Random()
        self.low, self.high = low, high
        self.sync_interval_s = sync_interval_s
        self.exchange_interval_s = exchange_interval_s
        self.candidates = candidates  # which peers speak sync (node/sync_peers.py)
        self.blocked = blocklist  # peer ids whose traffic is dropped
        self.metrics = metrics
        self.peers_file = peers_file
        self.book = PeerBook(
            host.peer_id.to_base58(),
            backoff_min_ms=int(reconnect_min_s * 1000),
            backoff_max_ms=int(reconnect_max_s * 1000),
        )
        self.rotation = SyncRotation(int(sync_interval_s * 1000), sync_per_interval, self.rnd)
        self.dialing: set[str] = set()
        self._answered_at: dict[str, float] = {}
        self._next_exchange = 0.0
        self._own_addrs: list[str] = []
        self._saved: object = None
        self._connected_at: dict[str, float] = {}  # when we first saw each connection
        self._reached: tuple[str, ...] = ()  # the book's views, as of the last round
        self._known: tuple[str, ...] = ()
        # peers a join dialled and still needs (node/join_dials.py): not closed as surplus
        self.needed: Callable[[], Collection[str]] = frozenset
        self._restore()

    # --- the book ---

    def add_bootstrap(self, address: str) -> None:
        """Pin a bootstrap peer (``InvalidAddress`` if ``address`` is no /p2p/ multiaddr)."""
        parsed = self.host.parse_address(address)
        self.book.pin(parsed.peer_id, parsed.text)

    def _restore(self) -> None:
        if self.peers_file is None or not self.peers_file.exists():
            return
        try:
            saved = json.loads(self.peers_file.read_text())
        except (OSError, ValueError) as exc:  # damaged: start from the bootstrap list
            log.warning("%s unreadable (%s): starting without it", self.peers_file, exc)
            return
        restored = self.book.restore(saved, now_ms=0)
        log.info("%d peers restored from %s", restored, self.peers_file)

    def save(self) -> None:
        """Write the tried peers to ``peers.json`` if they changed (atomically: a crash
        leaves the old file)."""
        saved = self.book.saved()
        if self.peers_file is None or saved == self._saved:
            return
        temporary = self.peers_file.with_suffix(".tmp")
        try:
            temporary.write_text(json.dumps(saved))
            os.replace(temporary, self.peers_file)
            self._saved = saved
        except OSError as exc:  # a full disk must not stop the node
            log.warning("could not save %s: %s", self.peers_file, exc)

    # --- partition switch ---

    async def block(self, peer_id: str) -> None:
        self.blocked.add(peer_id)
        await self._disconnect(peer_id, forget=True)

    def unblock(self, peer_id: str) -> None:
        self.blocked.discard(peer_id)

    async def _disconnect(self, name: str, *, forget: bool = False) -> None:
        """Close our connection to ``name`` (not connected: nothing to do); ``forget``: drop
        its addresses too, so py-libp2p's auto-connector does not dial it back."""
        peer = self._connected_peer(name)
        if peer is None:
            return
        if forget:
            self.host.forget(peer)
        await self.host.disconnect(peer)

    def connected(self) -> list[str]:
        return [p.to_base58() for p in self.host.get_connected_peers()]

    # --- the nodes we know, for the R rule (SYNC.md, "Replication factor") ---

    def reached(self) -> list[str]:
        """Peers we know alive: connected, or connected to within ``REACHED_WITHIN_S``
        (the keeper's view: a hearsay peer counted there could take a shard from us)."""
        return list(dict.fromkeys([*self.connected(), *self._reached]))

    def known(self) -> list[str]:
        """Every peer we know of: connected, reached, or told of by peer exchange (the
        421 answer's view; bounded by the book, ``sync/peering.py``). Any thread."""
        return list(dict.fromkeys([*self.connected(), *self._known]))

    def _refresh_views(self, connected: list[str]) -> None:
        now_ms = self._now_ms()
        for name in connected:
            self.book.seen(name, now_ms)
        since = now_ms - int(REACHED_WITHIN_S * 1000)
        self._reached = tuple(self.book.reached_since(since))
        self._known = tuple(self.book.known())

    # --- connections: dial toward the low water, close above the high ---

    async def maintain(self, own_addrs: list[str]) -> None:
        """Forever: keep the connections within the band, ask for peers, save the book."""
        self._own_addrs = own_addrs
        try:
            async with trio.open_nursery() as nursery:
                while True:
                    await self._maintain_once(nursery)
                    self.save()
                    await trio.sleep(MAINTAIN_S)
        finally:
            self.save()

    async def _maintain_once(self, nursery: trio.Nursery) -> None:
        connected = self.connected()
        now = trio.current_time()
        for name in [n for n in self._connected_at if n not in connected]:
            del self._connected_at[name]  # bounded under churn
        for name in connected:
            self._connected_at.setdefault(name, now)
        self._refresh_views(connected)
        young = {n for n, t in self._connected_at.items() if now - t < CONNECTION_GRACE_S}
        young |= set(self.needed())
        for name in surplus(connected, self.high, self.rnd, young):
            log.debug("closing surplus connection to %s", name)
            self.metrics.inc("peer_connections_closed", reason="surplus", help=CLOSED_HELP)
            await self._disconnect(name)
        exchange_due = bool(connected) and now >= self._next_exchange
        wanted = min(self.low - len(connected), DIALS_AT_ONCE) - len(self.dialing)
        if exchange_due and self.low <= len(connected) < self.high and not self.dialing:
            wanted = 1  # turnover (module doc)
        if wanted > 0:
            skip = {*connected, *self.dialing, *self.blocked.sorted()}
            for peer in self.book.to_dial(wanted, skip, self._now_ms(), self.rnd):
                self.dialing.add(peer.peer_id)
                nursery.start_soon(self._dial, peer.peer_id, peer.addrs[0])
        short = len(connected) < self.low and not self.dialing
        if exchange_due or (connected and short and self._exchange_due(now)):
            self._next_exchange = now + self.exchange_interval_s * self.rnd.uniform(0.75, 1.25)
            tellers = [p for p in self.host.get_connected_peers() if self._speaks_exchange(p)]
            if tellers:
                nursery.start_soon(self._ask_for_peers, self.rnd.choice(tellers).to_base58())

    def _connected_peer(self, name: str) -> PeerId | None:
        return next((p for p in self.host.get_connected_peers() if p.to_base58() == name), None)

    def _speaks_exchange(self, peer: PeerId) -> bool:
        return PEERS_PROTOCOL in self._protocols(peer)

    def _exchange_due(self, now: float) -> bool:
        last = self._next_exchange - self.exchange_interval_s
        return now - last >= EXCHANGE_WHEN_SHORT_S

    async def _dial(self, peer_id: str, address: str) -> None:
        if await self._dial_address(peer_id, address):
            await self._identified(peer_id)
            await self._ask_for_peers(peer_id)

    async def _dial_address(self, peer_id: str, address: str) -> bool:
        """Dial ``peer_id`` at ``address``; whether it connected (the book and the metric
        learn either way)."""
        self.dialing.add(peer_id)
        try:
            parsed = self.host.parse_address(address)
            await self.host.dial(parsed, DIAL_TIMEOUT_S)  # DialFailed; re-adds the address
        except (PeerUnreachable, InvalidAddress) as exc:
            self.book.dial_failed(peer_id, self._now_ms(), self.rnd)
            self.metrics.inc("peer_dials", result="failed", help=DIALS_HELP)
            log.debug("dial %s failed: %s", peer_id, exc)
            return False
        finally:
            self.dialing.discard(peer_id)
        self.book.connected(peer_id, [address], self._now_ms())
        self.metrics.inc("peer_dials", result="connected", help=DIALS_HELP)
        log.info("connected to %s", peer_id)
        return True

    async def dial_known(self, peer_id: str) -> bool:
        """Connect to a peer of the book (a holder a join needs: ``node/join_dials.py``) at
        its first address, unless connected already, blocked, or without an address; then
        wait (a little) for identify, so its sessions can start. Whether it is connected."""
        if peer_id in self.connected():
            return True
        entry = self.book.peers.get(peer_id)
        if entry is None or not entry.addrs or peer_id in self.blocked:
            return False
        if peer_id in self.dialing:  # the maintenance loop dials it now: wait for that
            with trio.move_on_after(DIAL_TIMEOUT_S + 1):
                while peer_id in self.dialing:
                    await trio.sleep(0.05)
            return peer_id in self.connected()
        if not await self._dial_address(peer_id, entry.addrs[0]):
            return False
        await self._identified(peer_id)
        return True

    def dialable(self, peer_id: str) -> bool:
        """Whether ``dial_known`` could reach ``peer_id``: connected, or in the book with an
        address, and not blocked."""
        if peer_id in self.blocked:
            return False
        entry = self.book.peers.get(peer_id)
        return (entry is not None and bool(entry.addrs)) or peer_id in self.connected()

    async def _identified(self, name: str) -> None:
        """Wait (a little) until identify told us what ``name`` speaks."""
        with trio.move_on_after(IDENTIFY_WAIT_S):
            while True:
                peer = self._connected_peer(name)
                if peer is None or self._protocols(peer):
                    return
                await trio.sleep(0.05)

    # --- peer exchange ---

    async def _ask_for_peers(self, name: str) -> None:
        peer = self._connected_peer(name)
        if peer is None or name in self.blocked or not self._speaks_exchange(peer):
            return
        try:
            with trio.fail_after(EXCHANGE_TIMEOUT_S):
                stream = await self.host.new_stream(peer, PEERS_PROTOCOL, EXCHANGE_TIMEOUT_S)
                frames = stream.frames(MAX_EXCHANGE_BYTES)
                try:
                    await frames.write_frame(encode_ask(self._own_addrs))
                    told = decode_peers(await frames.read_frame())
                finally:
                    await stream.close()
        except (PeerUnreachable, StreamClosed, RemoteProtocolError, trio.TooSlowError) as exc:
            self.metrics.inc("peer_exchanges", role="ask", result="failed", help=EXCHANGE_HELP)
            log.debug("peer exchange with %s failed: %s", name, exc)
            return
        valid = [(pid, self._valid_addrs(pid, addrs)) for pid, addrs in told]
        added = self.book.heard(name, [(p, a) for p, a in valid if a], self._now_ms())
        self.metrics.inc("peer_exchanges", role="ask", result="ok", help=EXCHANGE_HELP)
        log.debug("peer exchange with %s: %d peers told, %d new", name, len(told), added)

    async def answer_exchange(self, stream: PeerStream) -> None:
        """Serve one ask: record the asker's addresses, answer with tried peers."""
        name = stream.peer_id
        now = trio.current_time()
        if name in self.blocked or now - self._answered_at.get(name, -EXCHANGE_MIN_S) < (
            EXCHANGE_MIN_S
        ):
            self.metrics.inc("peer_exchanges", role="answer", result="refused", help=EXCHANGE_HELP)
            await stream.reset()
            return
        self._answered_at[name] = now
        self._forget_answered(now)
        frames = stream.frames(MAX_EXCHANGE_BYTES)
        try:
            with trio.fail_after(EXCHANGE_TIMEOUT_S):
                addrs = self._valid_addrs(name, decode_ask(await frames.read_frame()))
                if addrs:
                    self.book.connected(name, addrs, self._now_ms())
                skip = {name, *self.blocked.sorted()}
                await frames.write_frame(
                    encode_peers(self.book.sample(EXCHANGE_MAX_PEERS, self.rnd, skip))
                )
        except (StreamClosed, RemoteProtocolError, trio.TooSlowError) as exc:
            self.metrics.inc("peer_exchanges", role="answer", result="failed", help=EXCHANGE_HELP)
            log.debug("peer exchange from %s failed: %s", name, exc)
            await stream.reset()
            return
        await stream.close()
        self.metrics.inc("peer_exchanges", role="answer", result="ok", help=EXCHANGE_HELP)

    def _forget_answered(self, now: float) -> None:
        """Drop askers answered long ago (bounded under churn)."""
        if len(self._answered_at) > 4 * self.high + 64:
            for name in [n for n, t in self._answered_at.items() if now - t >= EXCHANGE_MIN_S]:
                del self._answered_at[name]

    def _valid_addrs(self, peer_id: str, addrs: list[str]) -> list[str]:
        """The addresses that parse as /p2p/ multiaddrs of ``peer_id`` itself."""
        valid = []
        for text in addrs:
            try:
                parsed = self.host.parse_address(text)
            except InvalidAddress:
                continue
            if parsed.peer_id == peer_id:
                valid.append(parsed.text)
        return valid

    # --- anti-entropy scheduling ---

    async def schedule_syncs(self, run_sync: Callable[[PeerId], Awaitable[bool]]) -> None:
        """Sync with a few connected peers per interval (``SyncRotation``), one session per
        peer at a time, each peer at most once an interval, a new peer at once.

        ``run_sync`` answers whether to go on at once: a session that made progress but used
        up its passes before the trees matched (a node catching up on many records) is
        followed by the next one right away instead of at its turn — at most
        ``MAX_FOLLOW_UPS`` times in a row, so a peer that keeps feeding a little news cannot
        hold us in sessions.
        """
        running: set[str] = set()
        follow_ups: dict[str, int] = {}
        async with trio.open_nursery() as nursery:
            while True:
                now = trio.current_time()
                peers = {peer.to_base58(): peer for peer in self.host.get_connected_peers()}
                for gone in [name for name in follow_ups if name not in peers]:
                    del follow_ups[gone]  # bounded under churn
                self.candidates.keep_only(peers)
                self.rotation.keep_only(peers)
                waiting = []
                for name, peer in peers.items():
                    if name in self.blocked:
                        await self._disconnect(name, forget=True)
                    elif name not in running and self._speaks_sync(name, peer, now):
                        waiting.append(name)
                for name in self.rotation.pick(waiting, int(now * 1000)):
                    running.add(name)
                    nursery.start_soon(self._one_sync, run_sync, peers[name], running, follow_ups)
                await trio.sleep(0.25)

    def _speaks_sync(self, name: str, peer: PeerId, now: float) -> bool:
        """Whether a session may be opened to ``peer`` (its identify lists sync)."""
        protocols = self._protocols(peer)
        if self.candidates.protocols_changed(name, protocols):  # identify push: look again
            self.rotation.go_on(name)
        return self.candidates.verdict(name, protocols, now) is Verdict.OPEN

    def _protocols(self, peer: PeerId) -> list[str]:
        """What the peer's identify listed ([] before it answered, or once forgotten)."""
        peerstore = self.host.get_peerstore()
        return list(peerstore.get_protocols(peer)) if peerstore.has_peer(peer) else []

    async def _one_sync(
        self,
        run_sync: Callable[[PeerId], Awaitable[bool]],
        peer: PeerId,
        running: set[str],
        follow_ups: dict[str, int],
    ) -> None:
        name = peer.to_base58()
        try:
            again = await run_sync(peer)
            follow_ups[name] = follow_ups.get(name, 0) + 1 if again else 0
            if again and follow_ups[name] <= MAX_FOLLOW_UPS:
                self.rotation.go_on(name)
        except Exception as exc:  # a session, whatever failed in it, must not end the node
            log.info("sync with %s failed: %s", peer, exc)
        finally:
            running.discard(name)

    def _now_ms(self) -> int:
        return int(trio.current_time() * 1000)


CLOSED_HELP = "connections we closed, by reason (node/peers.py)"
DIALS_HELP = "dials of known peers, by result (node/peers.py)"
EXCHANGE_HELP = "peer exchanges, by role and result (node/peers.py)"
