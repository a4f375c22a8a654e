"""Gossip topics per shard (SYNC.md, "Scopes"). Pure.

With ``sharded`` (the network setting ``gossip_sharded``, off by default: one topic for
everything, as before scopes) a chat's messages, deletes and member ops travel on its
shard's topic, a member op also on its subject's user-shard topic (the member index), and
an identity on its user's user-shard topic; a node subscribes to the base topic and the
topics of the shards and user shards it holds — a full node to all of them. A node then
receives and forwards only what it holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from store.ops import MembershipOp, Op
from store.records import MsgV1
from sync.scope import Scope, shard_of, user_shard_of


def shard_topic(base: str, shard: int) -> str:
    return f"{base}/shard/{shard}"


def user_topic(base: str, user_shard: int) -> str:
    return f"{base}/user/{user_shard}"


def topic_within(base: str, topic: str, scope: Scope) -> bool:
    """Whether ``topic``'s messages lie within ``scope``: a shard topic's if the scope holds
    the shard, a user-shard topic's if it indexes the user shard; any other topic's (the base
    topic, unsharded gossip's one topic) always — it is not split by shard to bound."""
    kind, _, number = topic.removeprefix(f"{base}/").partition("/")
    if not topic.startswith(f"{base}/") or not number.isdigit():
        return True
    if kind == "shard":
        return scope.holds_shard(int(number))
    if kind == "user":
        return scope.holds_user_shard(int(number))
    return True


def topics_for(base: str, scope: Scope, *, sharded: bool) -> list[str]:
    """The topics a node holding ``scope`` subscribes to: the base one first."""
    if not sharded:
        return [base]
    every = range(scope.num_shards)
    shards = every if scope.shards is None else sorted(scope.shards)
    users = every if scope.user_shards is None else sorted(scope.user_shards)
    return [base, *(shard_topic(base, s) for s in shards), *(user_topic(base, u) for u in users)]


def split_by_topic(
    ops: Sequence[Op], base: str, num_shards: int, *, sharded: bool
) -> list[tuple[str, list[Op]]]:
    """A batch of ops per topic, each in its order: the base topic first, then the topics
    in the order their first op came (a chat's member ops before the messages they admit,
    though a receiver holds a message that comes first anyway)."""
    if not sharded:
        return [(base, list(ops))] if ops else []
    by_topic: dict[str, list[Op]] = {base: []}
    for op in ops:
        for topic in _topics_of(op, base, num_shards):
            by_topic.setdefault(topic, []).append(op)
    return [(topic, batch) for topic, batch in by_topic.items() if batch]


def _topics_of(op: Op, base: str, num_shards: int) -> list[str]:
    if isinstance(op, MsgV1):
        return [shard_topic(base, shard_of(op.chat_id, num_shards))]
    user = user_topic(base, user_shard_of(op.user_id, num_shards))
    if isinstance(op, MembershipOp):
        return [shard_topic(base, shard_of(op.chat_id, num_shards)), user]
    return [user]  # an identity
