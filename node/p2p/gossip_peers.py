"""Peers that do not speak gossip: no stream attempts in a loop, one log line, not seven.

py-libp2p 0.8.1's pubsub opens a ``/meshsub`` stream to every connected peer and, while
the peer stays connected, retries a failed open forever (backoff capped at 10 s); every
failure is a 7-line ERROR block from ``BasicHost.new_stream``. With 300 connected peers
that lack the protocol that was thousands of lines a minute. Here:

* ``skip_peers_without_gossip``: pubsub's new-peer step returns at once for a peer whose
  identify lists none of the gossip protocols (re-read at each retry, so an identify push
  that adds them is honoured); ending without an error ends pubsub's retry loop;
* ``StreamFailureFilter``: each of those ERROR blocks becomes a count
  (``peer_streams_failed_total``) and at most one line per peer per notice interval.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from libp2p.peer.id import ID

from node.notices import Notices
from node.p2p.host import Libp2pHost, Libp2pPubSub

STREAM_FAILURE_PREFIX = "Failed to open stream to peer "
HOST_LOGGER = "libp2p.host.basic_host"
TCP_LOGGER = "libp2p.transport.tcp.tcp"
TCP_DIAL_FAILURE_PREFIX = "Failed to open TCP stream"


def skip_peers_without_gossip(
    pubsub: Libp2pPubSub, host: Libp2pHost, protocols: Sequence[str]
) -> None:
    """Make ``pubsub`` open no stream to a peer whose identify lists none of ``protocols``
    (``Pubsub._handle_new_peer``, private: see the module doc for why)."""
    original: Callable[[ID], Awaitable[None]] = pubsub.raw._handle_new_peer
    wanted = set(protocols)

    async def handle_new_peer(peer_id: ID) -> None:
        peerstore = host.raw.get_peerstore()
        listed = set(peerstore.get_protocols(peer_id)) if peerstore.has_peer(peer_id) else set()
        if listed and not listed & wanted:
            return  # identify answered without gossip: no stream, and no retry
        await original(peer_id)

    pubsub.raw._handle_new_peer = handle_new_peer  # type: ignore[method-assign]


class StreamFailureFilter(logging.Filter):
    """Turns py-libp2p's multi-line "Failed to open stream" ERROR into a rate-limited notice."""

    def __init__(self, notices: Notices) -> None:
        super().__init__()
        self.notices = notices

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(STREAM_FAILURE_PREFIX):
            return True
        lines = message.splitlines()
        peer = lines[0].removeprefix(STREAM_FAILURE_PREFIX).rstrip(":")
        error = lines[1].strip() if len(lines) > 1 else ""
        self.notices.note(peer, "stream_failed", "no stream to %s: %s", peer, error[:200])
        return False


class DialFailureFilter(logging.Filter):
    """Drops py-libp2p's ERROR line for each failed TCP dial: the peer manager counts them
    (``peer_dials_total{result="failed"}``), and a peer exchange can name many dead peers."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(TCP_DIAL_FAILURE_PREFIX)
