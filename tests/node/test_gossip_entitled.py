"""With scope authentication, a shard topic's gossip goes only to peers entitled to the
shard (SECURITY.md, "Scopes"; ``node/p2p/gated_gossip.py``): a real node and two real
libp2p peers on 127.0.0.1, one entitled to the shard by the R rule, one not, both
subscribed to its topic. The unentitled one receives none of its messages (by the mesh, by
the replay to a new subscriber, by IWANT), its GRAFT is answered with PRUNE, and the
entitled one receives them all. Without scope authentication (the control) both do."""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import multiaddr
import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.pb import rpc_pb2

from client.e2e import UserKey
from node.gossip.settings import OPS_TOPIC
from node.gossip.topics import shard_topic, topic_within
from node.p2p import GOSSIP_PROTOCOL_IDS
from node.p2p.gated_gossip import GatedGossipSub
from node.p2p.host import start_host
from store.authz import new_group
from store.hlc import Hlc
from store.ops import MembershipAction, MembershipOp, Op
from store.records import MsgV1
from sync.scope import Scope, holders, shard_of

from node_support import now_ms, ops_body, running_node

log = logging.getLogger(__name__)

SHARDS = 8
ALICE = UserKey.from_seed(b"\x31" * 32)
MESSAGES = 5


def _group_in(shard: int) -> Any:
    return next(
        p for n in range(10_000)
        if shard_of((p := new_group(ALICE.signing_key, b"gated-%010d" % n)).chat_id(), SHARDS) == shard
    )  # fmt: skip


async def _peer(stack: AsyncExitStack) -> tuple[Any, Any]:
    return await start_host(stack, create_new_key_pair(), "/ip4/127.0.0.1/tcp/0", 1)


async def _received(subscription: Any, wait_s: float) -> list[Any]:
    got: list[Any] = []
    with trio.move_on_after(wait_s):
        while True:
            got.append(await subscription.get())
    return got


def test_a_topic_is_within_a_scope_by_its_shard_or_user_shard() -> None:
    scope = Scope(frozenset({2}), SHARDS, frozenset({5}))
    assert topic_within(OPS_TOPIC, shard_topic(OPS_TOPIC, 2), scope)
    assert not topic_within(OPS_TOPIC, shard_topic(OPS_TOPIC, 3), scope)
    assert topic_within(OPS_TOPIC, f"{OPS_TOPIC}/user/5", scope)
    assert not topic_within(OPS_TOPIC, f"{OPS_TOPIC}/user/2", scope)
    # not split by shard: nothing to bound (unsharded gossip's one topic), and odd names
    for topic in (OPS_TOPIC, "other", f"{OPS_TOPIC}/shard/x", f"{OPS_TOPIC}/shard/"):
        assert topic_within(OPS_TOPIC, topic, scope)


@pytest.mark.parametrize("authenticate", [True, False])
async def test_an_unentitled_subscriber_gets_none_of_a_shards_gossip(
    tmp_path: Path, authenticate: bool
) -> None:
    async with (
        running_node(
            tmp_path, network_shards=SHARDS, replication_factor=1, gossip_sharded=True,
            scope_authenticate=authenticate, scope_check_interval_s=0.2,
        ) as (node, http),
        AsyncExitStack() as stack,
    ):  # fmt: skip
        own = ID.from_base58(node.peer_id)
        address = info_from_p2p_addr(
            multiaddr.Multiaddr(f"{node.listen_addrs[0]}/p2p/{node.peer_id}")
        )
        # two peers; the entitled one holds a shard by the R rule (R = 1) among the three
        while True:
            (e_host, e_pubsub), (u_host, u_pubsub) = await _peer(stack), await _peer(stack)
            ids = [own.to_bytes(), e_host.get_id().to_bytes(), u_host.get_id().to_bytes()]
            theirs = [s for s in range(SHARDS) if holders(s, ids, 1, SHARDS) == (ids[1],)]
            if theirs:
                break
        topic = shard_topic(OPS_TOPIC, theirs[0])
        for host in (e_host, u_host):
            await host.connect(address)
        keeper = node.scopes.keeper
        if authenticate:
            assert keeper is not None
            with trio.fail_after(10):
                while set(ids[1:]) - set(keeper._nodes):
                    await trio.sleep(0.1)
            assert theirs[0] in (keeper.bound_of(ids[1]).shards or ())
            assert theirs[0] not in (keeper.bound_of(ids[2]).shards or ())
        e_sub, u_sub = await e_pubsub.subscribe(topic), await u_pubsub.subscribe(topic)
        await trio.sleep(2.5)  # subscriptions told, grafts answered, a heartbeat or two

        proof = _group_in(theirs[0])
        base = now_ms() - 60_000
        join = MembershipOp.create(
            ALICE.signing_key, proof.chat_id(), ALICE.user_id, MembershipAction.ADD, Hlc(base),
            proof=proof,
        )  # fmt: skip
        msgs = [
            MsgV1.create(ALICE.signing_key, proof.chat_id(), Hlc(base + 1 + i), b"m%d" % i)
            for i in range(MESSAGES)
        ]
        ops: list[Op] = [join, *msgs]
        for op in ops:
            assert (await http.post("/ops", json=ops_body(op))).status_code == 201
        entitled = await _received(e_sub, 3.0)
        assert entitled, "the entitled peer receives the shard's gossip"
        # IWANT for a message the entitled peer got, asked while the node still caches it
        wanted = [bytes(m.from_id) + bytes(m.seqno) for m in entitled]
        await u_pubsub.router.emit_iwant(wanted, own)
        unentitled = await _received(u_sub, 2.0)

        log.warning(
            "authenticate=%s: entitled peer got %d messages, unentitled %d; %s", authenticate,
            len(entitled), len(unentitled),
            [m for m in node.services.metrics.render().splitlines() if "withheld_total{" in m],
        )  # fmt: skip
        router = node.pubsub.router  # type: ignore[attr-defined]
        assert isinstance(router, GatedGossipSub)
        metrics = node.services.metrics.render()
        if not authenticate:  # the control: the gap this closes
            assert len(unentitled) == len(entitled)
            return
        assert unentitled == []
        assert u_host.get_id() not in router.mesh.get(topic, set())
        assert e_host.get_id() in router.mesh.get(topic, set())
        # its GRAFT was answered with PRUNE: it keeps the node out of its mesh, backs off
        assert own not in u_pubsub.router.mesh.get(topic, set())
        assert 'chatsync_gossip_withheld_total{kind="graft_refused"}' in metrics
        assert 'chatsync_gossip_withheld_total{kind="message"}' in metrics  # the IWANT's
        # and the node serves on: the entitled peer still gets what comes next
        later = MsgV1.create(ALICE.signing_key, proof.chat_id(), Hlc(base + 99), b"later")
        assert (await http.post("/ops", json=ops_body(later))).status_code == 201
        assert await _received(e_sub, 3.0)
        assert await _received(u_sub, 1.0) == []


def test_the_wire_keeps_back_every_refused_topics_message_ihave_and_graft() -> None:
    """A message on several topics goes only if every one is allowed (a forged message
    naming an allowed topic beside a refused one carries the refused one's data); what is
    left of an RPC without them is not written at all."""
    router = GatedGossipSub([TProtocol(p) for p in GOSSIP_PROTOCOL_IDS], 6, 4, 8)
    peer, withheld = ID(b"\x00\x04peer"), list[str]()
    router.gate = lambda node, topic: topic != "refused"
    router.on_withheld = withheld.append
    rpc = rpc_pb2.RPC(
        publish=[
            rpc_pb2.Message(data=b"a", topicIDs=["allowed"]),
            rpc_pb2.Message(data=b"b", topicIDs=["allowed", "refused"]),
        ],
        control=rpc_pb2.ControlMessage(
            ihave=[rpc_pb2.ControlIHave(topicID="refused", messageIDs=[b"x"])],
            graft=[rpc_pb2.ControlGraft(topicID="allowed")],
        ),
    )
    kept = router.without_refused(peer, rpc)
    assert kept is not None and [m.data for m in kept.publish] == [b"a"]
    assert not kept.control.ihave and [g.topicID for g in kept.control.graft] == ["allowed"]
    assert sorted(withheld) == ["ihave", "message"]
    only_refused = rpc_pb2.RPC(
        publish=[rpc_pb2.Message(data=b"b", topicIDs=["refused"])], senderRecord=b"record"
    )
    assert router.without_refused(peer, only_refused) is None
    untouched = rpc_pb2.RPC(subscriptions=[rpc_pb2.RPC.SubOpts(subscribe=True, topicid="x")])
    assert router.without_refused(peer, untouched) is untouched
    router.gate = None
    assert router.without_refused(peer, only_refused) is only_refused


async def test_a_peer_that_loses_its_entitlement_is_pruned_and_sent_nothing_more() -> None:
    """Two real libp2p peers; the gate of one turns against the other (its entitlement
    gone: the keeper re-read the rows or the view): at the next heartbeat it leaves the
    mesh with a PRUNE, and what is published after does not reach it."""
    topic, refused = shard_topic(OPS_TOPIC, 1), set[bytes]()
    async with AsyncExitStack() as stack:
        (p_host, p_pubsub), (q_host, q_pubsub) = await _peer(stack), await _peer(stack)
        router = p_pubsub.router
        assert isinstance(router, GatedGossipSub)
        router.gate = lambda peer, t: peer not in refused
        await q_host.connect(info_from_p2p_addr(p_host.get_addrs()[0].encapsulate(
            multiaddr.Multiaddr(f"/p2p/{p_host.get_id()}")
        )))  # fmt: skip
        await p_pubsub.subscribe(topic)
        q_sub = await q_pubsub.subscribe(topic)
        with trio.fail_after(10):
            while q_host.get_id() not in router.mesh.get(topic, set()):
                await trio.sleep(0.1)
        await p_pubsub.publish(topic, b"before")
        assert [m.data for m in await _received(q_sub, 1.0)] == [b"before"]
        refused.add(q_host.get_id().to_bytes())
        with trio.fail_after(10):
            while q_host.get_id() in router.mesh.get(topic, set()) or p_host.get_id() in (
                q_pubsub.router.mesh.get(topic, set())
            ):
                await trio.sleep(0.1)
        await p_pubsub.publish(topic, b"after")
        assert await _received(q_sub, 1.5) == []
