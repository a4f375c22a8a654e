"""Our changes to py-libp2p 0.8.1's private attributes, each with why (others: ``costs``,
``inbound``, ``gossip_peers``). They are tied to 0.8.1's internals: re-read them at an upgrade.

* ``count_drops`` — ``GossipSub._handle_dropped_rpc``: py-libp2p only logs (at debug level)
  an outbound RPC it drops (queue full, oversized); we count each one.
* ``guard_pubsub_handler`` — ``Pubsub._handle_dead_peer``: pubsub's stream handler lets the
  protobuf ``DecodeError`` of a truncated frame escape, which ends the whole process; ours
  ends that peer's stream as py-libp2p does for its own read errors.
* ``forget_after_failed_dials`` — the auto-connector's ``record_failed_connection`` /
  ``record_successful_connection``: it redials every peer that ever left, forever.
* ``SUBSCRIPTION_CHANNEL_SIZE`` — a module global ``Pubsub.subscribe`` reads (32 by default,
  reached in one scheduler batch under load; what overflows is lost to gossip for good).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

from libp2p.abc import IHost, INetStream
from libp2p.peer.id import ID
from libp2p.pubsub import pubsub as pubsub_module
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub

from node.p2p.streams import reset_quietly

log = logging.getLogger(__name__)

# py-libp2p drops a message (already marked seen, so gossip never brings it again) when our
# subscription channel is full, and its default of 32 is reached in one scheduler batch of
# message tasks under load. Messages are ops already validated; 1,024 of them is the bound.
SUBSCRIPTION_CHANNEL_SIZE = 1024


def enlarge_subscription_channels() -> None:
    pubsub_module.SUBSCRIPTION_CHANNEL_SIZE = SUBSCRIPTION_CHANNEL_SIZE  # read by subscribe()


def count_drops(router: GossipSub, on_dropped: Callable[[str], None]) -> None:
    """Report each RPC the router drops (py-libp2p only logs them, at debug level)."""
    handle = router._handle_dropped_rpc

    def counted(peer_id: ID, rpc: rpc_pb2.RPC, reason: str) -> None:
        on_dropped(reason)
        handle(peer_id, rpc, reason)

    router._handle_dropped_rpc = counted  # type: ignore[method-assign]


def guard_pubsub_handler(pubsub: Pubsub) -> Callable[[INetStream], Awaitable[None]]:
    """Pubsub's stream handler, minus the crash: a connection that dies mid-RPC can hand
    py-libp2p a truncated frame, and the protobuf DecodeError it raises is not caught there;
    it would end the whole process. Here it ends that peer's stream, as py-libp2p does for
    its own read errors (reset, peer dropped; it reconnects and anti-entropy repairs)."""

    async def handler(stream: INetStream) -> None:
        try:
            await pubsub.stream_handler(stream)
        except Exception as exc:  # must never raise: py-libp2p would end the process
            log.warning("pubsub stream failed: %s: %s", type(exc).__name__, exc)
            await reset_quietly(stream)
            with contextlib.suppress(Exception):  # the same handler: whatever this raises
                pubsub._handle_dead_peer(stream.muxed_conn.peer_id)

    return handler


def forget_addresses(host: IHost, peer: ID) -> None:
    """Drop what the peerstore holds of ``peer``: py-libp2p's auto-connector dials every
    peer it has addresses of, again and again; without them it leaves the peer alone."""
    peerstore = host.get_peerstore()
    if peerstore.has_peer(peer):
        peerstore.clear_peerdata(peer)


def forget_after_failed_dials(host: IHost, max_failed: int) -> None:
    """Make py-libp2p's auto-connector forget a peer after ``max_failed`` failed dials in a
    row (it would redial every peer that ever left, forever, with a backoff capped at 5 min).
    Our own bootstrap loop (``PeerManager.keep_connected``) re-adds a bootstrap peer's
    address per dial."""
    connector = host.get_network().auto_connector  # type: ignore[attr-defined]
    failures: dict[ID, int] = {}
    failed, succeeded = connector.record_failed_connection, connector.record_successful_connection

    def record_failed(peer: ID) -> None:
        failed(peer)
        failures[peer] = failures.get(peer, 0) + 1
        if failures[peer] >= max_failed:
            log.info("forgetting peer %s after %d failed dials", peer, failures.pop(peer))
            forget_addresses(host, peer)
            connector.clear_cooldown(peer)

    def record_succeeded(peer: ID) -> None:
        succeeded(peer)
        failures.pop(peer, None)

    connector.record_failed_connection = record_failed
    connector.record_successful_connection = record_succeeded
