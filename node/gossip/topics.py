"""Gossip topics per shard (SYNC.md, "Scopes"). Pure.

The global ops (member ops, identities: every node holds them) travel on the base topic,
which every node subscribes to. With ``sharded`` (the network setting ``gossip_sharded``,
off by default: one topic for everything, as before scopes) a chat's messages and deletes
travel on its shard's topic instead, and a node subscribes to the topics of the shards it
holds — a full node to all of them. A node then receives and forwards only what it holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from store.ops import Op
from store.records import MsgV1
from sync.scope import Scope, shard_of


def shard_topic(base: str, shard: int) -> str:
    return f"{base}/shard/{shard}"


def topics_for(base: str, scope: Scope, *, sharded: bool) -> list[str]:
    """The topics a node holding ``scope`` subscribes to: the base one first."""
    if not sharded:
        return [base]
    shards = range(scope.num_shards) if scope.shards is None else sorted(scope.shards)
    return [base, *(shard_topic(base, s) for s in shards)]


def split_by_topic(
    ops: Sequence[Op], base: str, num_shards: int, *, sharded: bool
) -> list[tuple[str, list[Op]]]:
    """A batch of ops per topic, each in its order: the base topic first (member ops before
    the messages they admit, though a receiver holds a message that comes first anyway), then
    the shards in the order their first op came."""
    if not sharded:
        return [(base, list(ops))] if ops else []
    by_topic: dict[str, list[Op]] = {base: []}
    for op in ops:
        topic = (
            shard_topic(base, shard_of(op.chat_id, num_shards)) if isinstance(op, MsgV1) else base
        )
        by_topic.setdefault(topic, []).append(op)
    return [(topic, batch) for topic, batch in by_topic.items() if batch]
