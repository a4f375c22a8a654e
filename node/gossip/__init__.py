"""Gossip of signed ops, split as rust-libp2p's gossipsub is: pure parts beside a thin I/O shell.

* ``validation`` — ``GossipValidator``: may a message be applied and forwarded (pure, takes ``now_ms``);
* ``batching`` — ``Batcher``: when an outgoing message closes and what it holds (pure, takes ``now``);
* ``settings`` — ``GossipSettings``, taken from ``NodeConfig`` once;
* ``service`` — ``GossipService``: py-libp2p's validator hook, the receive loop feeding
  the writer, the publish loop (trio).
"""

from node.gossip.batching import Batcher
from node.gossip.service import GossipService, Publisher
from node.gossip.settings import GossipSettings
from node.gossip.validation import GossipValidator

__all__ = [
    "Batcher",
    "GossipService",
    "GossipSettings",
    "GossipValidator",
    "Publisher",
]
