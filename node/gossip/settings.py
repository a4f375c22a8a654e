"""What the node's gossip is configured with, taken from ``NodeConfig`` once."""

from __future__ import annotations

from dataclasses import dataclass

from node.config import NodeConfig
from sync.scope import DEFAULT_SHARDS

OPS_TOPIC = "chatsync/ops/1"  # the GossipSub topic of signed ops


@dataclass(frozen=True)
class GossipSettings:
    topic: str
    own_peer_id: bytes  # raw libp2p id: our own publishes are not validated again
    max_bytes: int  # a message's size, at most (py-libp2p drops RPCs over 1 MiB)
    max_payload: int  # a message op's payload, at most
    max_offset_ms: int  # how far ahead of our clock an op's HLC may be
    batch_ops: int  # ops in one message, at most
    batch_delay_ms: int  # how long a message waits for more ops after its first
    min_interval_ms: int = 0  # the least time between two of our messages
    max_interval_ms: int = 0  # ... however many nodes publish (node/gossip/batching.py)
    messages_per_s: float = 0.0  # the network's message budget, shared by its publishers
    # messages and deletes on their shard's topic (node/gossip/topics.py); off: one topic
    sharded: bool = False
    num_shards: int = DEFAULT_SHARDS

    @classmethod
    def of(cls, config: NodeConfig, *, topic: str, own_peer_id: bytes) -> GossipSettings:
        return cls(
            topic=topic,
            own_peer_id=own_peer_id,
            max_bytes=config.gossip_max_bytes,
            max_payload=config.max_payload,
            max_offset_ms=config.max_offset_ms,
            batch_ops=config.gossip_batch_ops,
            batch_delay_ms=config.gossip_batch_delay_ms,
            min_interval_ms=config.gossip_min_interval_ms,
            max_interval_ms=config.gossip_max_interval_ms,
            messages_per_s=config.gossip_network_messages_per_s,
            sharded=config.gossip_sharded,
            num_shards=config.network_shards,
        )
