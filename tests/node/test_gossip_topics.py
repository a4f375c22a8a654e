"""Gossip topics per shard (node/gossip/topics.py): off by default (one topic, as before
scopes); on, messages and deletes travel on their shard's topic, member ops on their chat's
shard's topic and their subject's user-shard topic, identities on their user's user-shard
topic, and a node subscribes to the base topic, its scope's shards and its user shards."""

from __future__ import annotations

import trio

from node.clock import Clock
from node.config import load_config
from node.gossip import GossipService, GossipSettings, GossipValidator
from node.gossip.settings import OPS_TOPIC
from node.gossip.topics import shard_topic, split_by_topic, topics_for, user_topic
from node.metrics import Metrics
from store import Hlc, MsgV1
from store.ops import MembershipAction, MembershipOp, Op, decode_ops, make_identity
from store.signing import key_from_seed
from sync.scope import EVERYTHING, Scope, shard_of, user_shard_of

S = 8
KEY = key_from_seed(b"\x05" * 32)
CHATS = [bytes([i]) * 32 for i in range(1, 40)]
A, B = CHATS[0], next(c for c in CHATS if shard_of(c, S) != shard_of(CHATS[0], S))


def msg(chat: bytes, n: int) -> MsgV1:
    return MsgV1.create(KEY, chat, Hlc(1_000 + n), b"m%d" % n)


def op(chat: bytes) -> MembershipOp:
    return MembershipOp.create(KEY, chat, b"\x01" * 20, MembershipAction.ADD, Hlc(900))


def test_unsharded_gossip_is_one_topic_for_everything() -> None:
    assert topics_for(OPS_TOPIC, Scope(frozenset({1}), S), sharded=False) == [OPS_TOPIC]
    batch: list[Op] = [msg(A, 1), op(B), msg(B, 2)]
    assert split_by_topic(batch, OPS_TOPIC, S, sharded=False) == [(OPS_TOPIC, batch)]
    assert split_by_topic([], OPS_TOPIC, S, sharded=False) == []
    assert load_config(None, {}).gossip_sharded is False


def test_a_node_subscribes_to_the_base_topic_its_shards_and_its_user_shards() -> None:
    scoped = topics_for(OPS_TOPIC, Scope(frozenset({5, 2}), S, frozenset({3})), sharded=True)
    assert scoped == [
        OPS_TOPIC, shard_topic(OPS_TOPIC, 2), shard_topic(OPS_TOPIC, 5), user_topic(OPS_TOPIC, 3)
    ]  # fmt: skip
    full = topics_for(OPS_TOPIC, Scope(None, S), sharded=True)
    assert full == [
        OPS_TOPIC,
        *(shard_topic(OPS_TOPIC, s) for s in range(S)),
        *(user_topic(OPS_TOPIC, s) for s in range(S)),
    ]
    assert len(topics_for(OPS_TOPIC, EVERYTHING, sharded=True)) == 1 + 2 * EVERYTHING.num_shards


def test_sharded_gossip_splits_a_batch_by_shard_keeping_each_order() -> None:
    a1, b1, a2, join = msg(A, 1), msg(B, 2), msg(A, 3), op(A)
    split = split_by_topic([a1, b1, join, a2], OPS_TOPIC, S, sharded=True)
    assert split == [
        (shard_topic(OPS_TOPIC, shard_of(A, S)), [a1, join, a2]),  # the chat's ops in order
        (shard_topic(OPS_TOPIC, shard_of(B, S)), [b1]),
        (user_topic(OPS_TOPIC, user_shard_of(join.user_id, S)), [join]),  # and the index's
    ]
    me = make_identity(KEY, b"\x02" * 32, Hlc(5))  # on its user's user-shard topic
    assert split_by_topic([me], OPS_TOPIC, S, sharded=True) == [
        (user_topic(OPS_TOPIC, user_shard_of(me.user_id, S)), [me])
    ]


class _TopicPubsub:
    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Op]]] = []
        self.peer_queues: dict[str, list[object]] = {}

    async def publish(self, topic: str, data: bytes) -> None:
        self.sent.append((topic, decode_ops(data, max_bytes=1 << 20, max_ops=4096)))


async def test_the_publisher_sends_each_op_on_its_topic(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pubsub = _TopicPubsub()
    settings = GossipSettings(
        topic=OPS_TOPIC, own_peer_id=b"me", max_bytes=900 * 1024, max_payload=1024,
        max_offset_ms=60_000, batch_ops=1024, batch_delay_ms=20, sharded=True, num_shards=S,
    )  # fmt: skip
    gossip = GossipService(
        settings, pubsub, None, GossipValidator(settings), Metrics(), Clock(0),  # type: ignore[arg-type]
    )  # fmt: skip
    batch: list[Op] = [msg(A, 1), op(B), msg(B, 2), msg(A, 3)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gossip.publish_loop)
        await gossip.publish(batch)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert sorted(pubsub.sent, key=lambda s: s[0]) == sorted(
        split_by_topic(batch, OPS_TOPIC, S, sharded=True), key=lambda s: s[0]
    )
