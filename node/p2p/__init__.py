"""The libp2p edge: the only package that imports py-libp2p or multiaddr.

* ``interfaces`` — what the rest of ``node/`` sees: typed protocols and values, no libp2p;
* ``errors`` — py-libp2p's, multiaddr's and trio's exceptions mapped once to ours
  (``node/errors.py``), httpcore's ``map_exceptions`` model;
* ``host`` — identity, the host and its GossipSub, tuned for a chat node; ``Libp2pHost``
  and ``Libp2pPubSub``, the wrappers the node drives;
* ``streams`` — ``Libp2pStream`` and ``Libp2pFrames`` (length-prefixed frames), our
  exceptions only; ``safe_handler`` so a handler's failure ends a stream, not the process;
* ``gated_gossip`` — GossipSub sending a topic's messages only to peers a gate allows;
* ``patches``, ``costs``, ``inbound``, ``gossip_peers`` — every change we make to py-libp2p
  0.8.1's private attributes, each with why;
* ``ids`` — a raw peer id as base58 text;
* ``addresses`` — ``--listen`` and ``--bootstrap`` checked before the node starts
  (multiaddr only: config loading imports it).

Importing the package loads no libp2p (it takes 1.6 s); its wrapping modules do. The
import contract (``pyproject.toml``) keeps every other module off libp2p and multiaddr.
"""

from node.p2p.interfaces import (
    GOSSIP_PROTOCOL_IDS,
    PEERS_PROTOCOL,
    SYNC_PROTOCOL,
    Frames,
    GossipMessage,
    PeerAddress,
    PeerHost,
    PeerId,
    PeerKey,
    PeerQueues,
    PeerStore,
    PeerStream,
    PeerTable,
    Subscription,
)

__all__ = [
    "GOSSIP_PROTOCOL_IDS",
    "PEERS_PROTOCOL",
    "SYNC_PROTOCOL",
    "Frames",
    "GossipMessage",
    "PeerAddress",
    "PeerHost",
    "PeerId",
    "PeerKey",
    "PeerQueues",
    "PeerStore",
    "PeerStream",
    "PeerTable",
    "Subscription",
]
