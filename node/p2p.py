"""The libp2p host: persistent identity, GossipSub tuned for a chat node, stream handlers.

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
  ``safe_handler`` wraps every handler.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import multiaddr
from libp2p import new_host
from libp2p.crypto.ed25519 import Ed25519PrivateKey, create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.custom_types import TProtocol
from libp2p.pubsub import pubsub as pubsub_module
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service

from node.gossip.settings import OPS_TOPIC as OPS_TOPIC  # the topic of ops, re-exported
from node.libp2p_costs import take_out_costs

log = logging.getLogger(__name__)

GOSSIP_PROTOCOLS = [TProtocol("/meshsub/1.1.0"), TProtocol("/meshsub/1.0.0")]
SYNC_PROTOCOL = TProtocol("/chatsync/sync/1")
# py-libp2p drops a message (already marked seen, so gossip never brings it again) when our
# subscription channel is full, and its default of 32 is reached in one scheduler batch of
# message tasks under load. Messages are ops already validated; 1,024 of them is the bound.
SUBSCRIPTION_CHANNEL_SIZE = 1024


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


async def start_host(
    stack: AsyncExitStack,
    key_pair: KeyPair,
    listen: str,
    heartbeat_s: int,
    on_dropped: Callable[[str], None] | None = None,
) -> tuple[Any, Pubsub]:
    """Start a host listening on ``listen`` and its GossipSub; both stop when ``stack`` closes.

    ``on_dropped(reason)`` is called for every outbound RPC py-libp2p drops ("queue_full",
    "oversized")."""
    take_out_costs()
    addrs = [multiaddr.Multiaddr(listen)]
    host = new_host(key_pair=key_pair, listen_addrs=addrs)
    await stack.enter_async_context(host.run(listen_addrs=addrs))
    router = GossipSub(
        GOSSIP_PROTOCOLS,
        degree=6,
        degree_low=4,
        degree_high=12,
        heartbeat_interval=heartbeat_s,
        adaptive_gossip_enabled=False,
        spam_protection_enabled=False,
        max_messages_per_topic_per_second=1e9,
    )
    pubsub_module.SUBSCRIPTION_CHANNEL_SIZE = SUBSCRIPTION_CHANNEL_SIZE  # read by subscribe()
    if on_dropped is not None:
        _count_drops(router, on_dropped)
    pubsub = Pubsub(host, router)
    guarded = guard_pubsub_handler(pubsub)
    for protocol in GOSSIP_PROTOCOLS:
        host.set_stream_handler(protocol, guarded)
    await stack.enter_async_context(background_trio_service(pubsub))
    await stack.enter_async_context(background_trio_service(router))
    await pubsub.wait_until_ready()
    return host, pubsub


def _count_drops(router: GossipSub, on_dropped: Callable[[str], None]) -> None:
    """Report each RPC the router drops (py-libp2p only logs them, at debug level)."""
    handle = router._handle_dropped_rpc

    def counted(peer_id: Any, rpc: Any, reason: str) -> None:
        on_dropped(reason)
        handle(peer_id, rpc, reason)

    router._handle_dropped_rpc = counted  # type: ignore[method-assign]


def guard_pubsub_handler(pubsub: Pubsub) -> Callable[[Any], Awaitable[None]]:
    """Pubsub's stream handler, minus the crash: a connection that dies mid-RPC can hand
    py-libp2p a truncated frame, and the protobuf DecodeError it raises is not caught there;
    it would end the whole process. Here it ends that peer's stream, as py-libp2p does for
    its own read errors (reset, peer dropped; it reconnects and anti-entropy repairs)."""

    async def handler(stream: Any) -> None:
        try:
            await pubsub.stream_handler(stream)
        except Exception as exc:  # must never raise: py-libp2p would end the process
            log.warning("pubsub stream failed: %s: %s", type(exc).__name__, exc)
            await _reset(stream)
            with contextlib.suppress(Exception):  # the same handler: whatever this raises
                pubsub._handle_dead_peer(stream.muxed_conn.peer_id)

    return handler


def safe_handler(
    name: str, handler: Callable[[Any], Awaitable[None]], on_error: Callable[[str], None]
) -> Callable[[Any], Awaitable[None]]:
    """Wrap a stream handler so an exception ends that stream, never the process."""

    async def wrapped(stream: Any) -> None:
        try:
            await handler(stream)
        except Exception as exc:  # must never raise: py-libp2p would end the process
            log.warning("%s handler failed: %s: %s", name, type(exc).__name__, exc)
            on_error(type(exc).__name__)
            await _reset(stream)

    return wrapped


async def _reset(stream: Any) -> None:
    """Reset a failed stream, which may be gone already (a handler that must return)."""
    with contextlib.suppress(Exception):
        await stream.reset()


def peer_id_of(stream: Any) -> str:
    try:
        return str(stream.muxed_conn.peer_id)
    except AttributeError:
        return "unknown"
