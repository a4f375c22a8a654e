"""The libp2p host: persistent identity, GossipSub tuned for a chat node, and the typed
wrappers the node drives (``Libp2pHost``, ``Libp2pPubSub``).

py-libp2p 0.8.1 facts measured here (../shared/notes/py-libp2p.md) and what we do:

* Spam protection caps forwarding at 10 messages/s per topic and silently drops
  the rest: switched off; our validator is the spam defence and ops are batched.
* Adaptive gossip pushes the heartbeat to 30-60 s: switched off, heartbeat 1 s.
* Outbound queues hold 32 RPCs and drop when full: the publisher batches many
  ops per message and paces itself by those queues; a slow peer can still fill
  one with messages we forward, and anti-entropy repairs what is dropped. Every
  drop is counted (``on_dropped``; py-libp2p only logs it). A queue of 256
  changed nothing measurable at 2,000 ops/s: the ops that come by anti-entropy
  under overload are ones sync fetched before the gossip backlog got to them.
* An uncaught exception in a stream handler ends the whole program:
  ``safe_handler`` (``node/p2p/streams.py``) wraps every handler.
* A topic's messages go to any peer subscribed to it: the router is ``GatedGossipSub``
  (``node/p2p/gated_gossip.py``), which takes a gate once the node knows who is entitled
  to what (scope authentication); without one it is GossipSub as shipped.

``start_host`` returns py-libp2p's own host and pubsub (tests and benchmarks that speak
libp2p use them); ``open_host`` returns them wrapped, for the node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

import multiaddr
import trio
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.crypto.ed25519 import Ed25519PrivateKey, create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service

from node.p2p.costs import take_out_costs
from node.p2p.errors import LIBP2P_ERRORS, address_errors, dial_errors, open_errors
from node.p2p.gated_gossip import GatedGossipSub, TopicGate, gate_outbound
from node.p2p.interfaces import (
    GOSSIP_PROTOCOL_IDS,
    GossipMessage,
    PeerAddress,
    PeerId,
    PeerKey,
    PeerQueues,
    Subscription,
)
from node.p2p.interfaces import SYNC_PROTOCOL as SYNC_PROTOCOL_ID
from node.p2p.patches import (
    count_drops,
    enlarge_subscription_channels,
    forget_addresses,
    guard_pubsub_handler,
)
from node.p2p.streams import Libp2pStream, StreamHandler, safe_handler

log = logging.getLogger(__name__)

GOSSIP_PROTOCOLS = [TProtocol(p) for p in GOSSIP_PROTOCOL_IDS]
SYNC_PROTOCOL = TProtocol(SYNC_PROTOCOL_ID)


def load_or_create_key(path: Path) -> KeyPair:
    """The node's libp2p identity: a 32-byte ed25519 seed in a 0600 file, created on first run."""
    if path.exists():
        seed = path.read_bytes()
        if len(seed) != 32:
            raise ValueError(f"{path}: expected a 32-byte ed25519 seed, got {len(seed)} bytes")
        private = Ed25519PrivateKey.from_bytes(seed)
        return KeyPair(private, private.get_public_key())
    path.parent.mkdir(parents=True, exist_ok=True)
    pair = create_new_key_pair()
    raw = pair.private_key.to_bytes()[:32]
    path.touch(mode=0o600)
    path.write_bytes(raw)
    return load_or_create_key(path)


DEFAULT_DEGREE = 6  # GossipSub's D


def mesh_bounds(degree: int) -> tuple[int, int]:
    """D_lo and D_hi for a mesh of D: GossipSub's 4 and 12 around 6 would let a node that
    keeps 10 connections forward every message to all 10; each copy costs ~1 ms of CPU
    here (``chatsync bench scale``), so the mesh is held to D * 4/3 at most."""
    return max(1, degree * 2 // 3), max(degree, degree * 4 // 3)


async def start_host(
    stack: AsyncExitStack,
    key_pair: KeyPair,
    listen: str,
    heartbeat_s: int,
    on_dropped: Callable[[str], None] | None = None,
    degree: int = DEFAULT_DEGREE,
) -> tuple[IHost, Pubsub]:
    """Start a host listening on ``listen`` and its GossipSub; both stop when ``stack`` closes.

    ``on_dropped(reason)`` is called for every outbound RPC py-libp2p drops ("queue_full",
    "oversized"). ``degree``: the mesh's D (``mesh_bounds``)."""
    take_out_costs()
    addrs = [multiaddr.Multiaddr(listen)]
    host = new_host(key_pair=key_pair, listen_addrs=addrs)
    await stack.enter_async_context(host.run(listen_addrs=addrs))
    low, high = mesh_bounds(degree)
    router = GatedGossipSub(
        GOSSIP_PROTOCOLS,
        degree=degree,
        degree_low=low,
        degree_high=high,
        heartbeat_interval=heartbeat_s,
        adaptive_gossip_enabled=False,
        spam_protection_enabled=False,
        max_messages_per_topic_per_second=1e9,
    )
    enlarge_subscription_channels()
    if on_dropped is not None:
        count_drops(router, on_dropped)
    pubsub = Pubsub(host, router)
    gate_outbound(pubsub, router)  # no gate until the node sets one (set_topic_gate)
    guarded = guard_pubsub_handler(pubsub)
    for protocol in GOSSIP_PROTOCOLS:
        host.set_stream_handler(protocol, guarded)
    await stack.enter_async_context(background_trio_service(pubsub))
    await stack.enter_async_context(background_trio_service(router))
    await pubsub.wait_until_ready()
    return host, pubsub


async def open_host(
    stack: AsyncExitStack,
    key_path: Path | None,
    listen: str,
    heartbeat_s: int,
    on_dropped: Callable[[str], None] | None = None,
    degree: int = DEFAULT_DEGREE,
) -> tuple[Libp2pHost, Libp2pPubSub]:
    """``start_host`` with the identity in ``key_path`` (None: a new one), wrapped."""
    key_pair = create_new_key_pair() if key_path is None else load_or_create_key(key_path)
    host, pubsub = await start_host(stack, key_pair, listen, heartbeat_s, on_dropped, degree)
    return Libp2pHost(host), Libp2pPubSub(pubsub)


def _libp2p_id(peer: PeerId) -> ID:
    return peer if isinstance(peer, ID) else ID(peer.to_bytes())


class Libp2pPeerStore:
    """The peerstore, read by the sync scheduler (``node.p2p.interfaces.PeerStore``)."""

    def __init__(self, host: IHost) -> None:
        self.host = host

    def has_peer(self, peer: PeerId) -> bool:
        return self.host.get_peerstore().has_peer(_libp2p_id(peer))

    def get_protocols(self, peer: PeerId) -> list[str]:
        return list(self.host.get_peerstore().get_protocols(_libp2p_id(peer)))


class Libp2pHost:
    """A running py-libp2p host, as the node uses it. Raises only our exceptions:
    ``DialFailed``, ``ProtocolNotSupported``, ``PeerUnreachable``, ``InvalidAddress``."""

    def __init__(self, host: IHost) -> None:
        self.raw = host

    @property
    def peer_id(self) -> PeerId:
        return self.raw.get_id()

    def listen_addrs(self) -> list[str]:
        return [str(a) for a in self.raw.get_addrs()]

    def get_connected_peers(self) -> list[PeerId]:
        return list(self.raw.get_connected_peers())

    def get_peerstore(self) -> Libp2pPeerStore:
        return Libp2pPeerStore(self.raw)

    @staticmethod
    def parse_address(text: str) -> PeerAddress:
        """A /p2p/ multiaddr (``InvalidAddress`` if it is none)."""
        with address_errors():
            info = info_from_p2p_addr(multiaddr.Multiaddr(text))
        return PeerAddress(text, info.peer_id.to_base58())

    async def dial(self, address: PeerAddress, timeout_s: float) -> None:
        """Connect to ``address`` (``DialFailed``). Re-adds the address each time: py-libp2p's
        peerstore entries expire. A failed dial leaves no address behind: py-libp2p's
        auto-connector would dial every address in the peerstore again, on its own."""
        info = info_from_p2p_addr(multiaddr.Multiaddr(address.text))
        try:
            with dial_errors(), trio.fail_after(timeout_s):
                await self.raw.connect(info)
        except BaseException:
            forget_addresses(self.raw, info.peer_id)
            raise

    async def disconnect(self, peer: PeerId) -> None:
        """Close our connections to ``peer`` (already gone: nothing to do)."""
        try:
            await self.raw.disconnect(_libp2p_id(peer))
        except LIBP2P_ERRORS as exc:
            log.debug("disconnect %s: %s", peer.to_base58(), exc)

    def forget(self, peer: PeerId) -> None:
        """Drop the peer's addresses, so that nothing dials it back."""
        forget_addresses(self.raw, _libp2p_id(peer))

    async def new_stream(self, peer: PeerId, protocol: str, timeout_s: float) -> Libp2pStream:
        """A stream to ``peer`` speaking ``protocol`` (``ProtocolNotSupported``,
        ``PeerUnreachable``, ``DialFailed``)."""
        with open_errors(), trio.fail_after(timeout_s):
            stream = await self.raw.new_stream(_libp2p_id(peer), [TProtocol(protocol)])
        return Libp2pStream(stream)

    def set_stream_handler(
        self, protocol: str, name: str, handler: StreamHandler, on_error: Callable[[str], None]
    ) -> None:
        """Serve ``protocol`` with ``handler``; an exception in it resets that stream and is
        reported to ``on_error`` (its type's name), never raised into py-libp2p."""
        self.raw.set_stream_handler(TProtocol(protocol), safe_handler(name, handler, on_error))


Validator = Callable[[PeerKey | None, GossipMessage], bool]


class Libp2pPubSub:
    """A running py-libp2p ``Pubsub``, as gossip uses it."""

    def __init__(self, pubsub: Pubsub) -> None:
        self.raw = pubsub

    @property
    def peer_queues(self) -> PeerQueues:
        return self.raw.peer_queues

    def set_validator(self, topic: str, validator: Validator) -> None:
        """Validate every message of ``topic`` with ``validator`` (synchronous; it also runs
        on our own publishes, with us as the forwarder)."""
        self.raw.set_topic_validator(topic, validator, False)

    def set_topic_gate(self, gate: TopicGate, on_withheld: Callable[[str], None]) -> None:
        """Send a topic's messages only to peers ``gate`` allows on it (``gated_gossip``);
        ``on_withheld(kind)`` for each message, IHAVE or GRAFT kept back."""
        router = self.raw.router
        assert isinstance(router, GatedGossipSub), "a host from start_host"
        router.gate, router.on_withheld = gate, on_withheld

    async def subscribe(self, topic: str) -> Subscription:
        return await self.raw.subscribe(topic)

    async def unsubscribe(self, topic: str) -> None:
        """Leave ``topic``: peers are told, the subscription's channel is closed."""
        await self.raw.unsubscribe(topic)

    async def publish(self, topic: str, data: bytes) -> None:
        await self.raw.publish(topic, data)
