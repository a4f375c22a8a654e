"""GossipSub that sends a topic's messages only to peers a gate allows on it (SECURITY.md,
"Scopes": with scope authentication, a shard topic's messages go only to peers entitled to
the shard; the gate is ``node/scopes.py``'s, the rule ``ScopeKeeper.bound_of``'s).

py-libp2p 0.8.1 sends a topic's messages to any peer subscribed to it, by many paths: the
mesh and fanout, the identify-pending queue, the recent-message replay to a new subscriber,
IHAVE in the heartbeat, the answer to IWANT. Two layers, so no path is missed:

* **the wire** (``gate_outbound``): every RPC pubsub writes (``Pubsub.write_msg``, which
  every one of those paths ends in) loses the messages, IHAVEs and GRAFTs of topics the gate
  refuses for the peer it goes to; an RPC left empty is not written. This is the guarantee.
* **the mesh** (``GatedGossipSub``): a refused peer is never picked (mesh, fanout, IHAVE
  targets, peer exchange), its GRAFT is answered with a PRUNE and a backoff, and a peer
  that lost the gate's favour is pruned at the next heartbeat. Without it a refused peer
  would hold a mesh slot an entitled peer should have, and be sent nothing.

No gate (``None``, the default): py-libp2p's behaviour, untouched.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from libp2p.abc import INetStream
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub

# (raw peer id, topic) -> may the peer be sent the topic's messages
TopicGate = Callable[[bytes, str], bool]


class GatedGossipSub(GossipSub):
    gate: TopicGate | None = None
    on_withheld: Callable[[str], None] | None = None  # told each item kept back, by kind

    def allows(self, peer: ID, topic: str) -> bool:
        return self.gate is None or self.gate(peer.to_bytes(), topic)

    def withheld(self, kind: str, count: int = 1) -> None:
        if self.on_withheld is not None:
            for _ in range(count):
                self.on_withheld(kind)

    def without_refused(self, peer: ID, rpc: rpc_pb2.RPC) -> rpc_pb2.RPC | None:
        """``rpc`` as ``peer`` may receive it (the same object when nothing is refused);
        None when nothing of it is left to send."""
        if self.gate is None or not (rpc.publish or rpc.control.ihave or rpc.control.graft):
            return rpc
        publish = [m for m in rpc.publish if all(self.allows(peer, t) for t in m.topicIDs)]
        ihave = [i for i in rpc.control.ihave if self.allows(peer, i.topicID)]
        graft = [g for g in rpc.control.graft if self.allows(peer, g.topicID)]
        cut = {
            "message": len(rpc.publish) - len(publish),
            "ihave": len(rpc.control.ihave) - len(ihave),
            "graft": len(rpc.control.graft) - len(graft),
        }
        if not any(cut.values()):
            return rpc
        for kind, count in cut.items():
            self.withheld(kind, count)
        kept = rpc_pb2.RPC()
        kept.CopyFrom(rpc)
        del kept.publish[:], kept.control.ihave[:], kept.control.graft[:]
        kept.publish.extend(publish)
        kept.control.ihave.extend(ihave)
        kept.control.graft.extend(graft)
        if kept.control.ByteSize() == 0:
            kept.ClearField("control")
        if not (kept.publish or kept.subscriptions or kept.HasField("control")):
            return None  # a sender record alone tells the peer nothing
        return kept

    # --- the mesh: refused peers are never picked, grafted, or kept ---

    def _get_in_topic_gossipsub_peers_from_minus(
        self,
        topic: str,
        num_to_select: int,
        minus: Iterable[ID],
        backoff_check: bool = False,
    ) -> list[ID]:
        if self.gate is None or self.pubsub is None:
            return super()._get_in_topic_gossipsub_peers_from_minus(
                topic, num_to_select, minus, backoff_check
            )
        subscribed = self.pubsub.peer_topics.get(topic, set())
        refused = {p for p in subscribed if not self.allows(p, topic)}
        return super()._get_in_topic_gossipsub_peers_from_minus(
            topic, num_to_select, refused.union(minus), backoff_check
        )

    async def on_peer_subscribed(self, peer_id: ID, topic: str) -> None:
        if self.allows(peer_id, topic):
            await super().on_peer_subscribed(peer_id, topic)

    async def handle_graft(self, graft_msg: rpc_pb2.ControlGraft, sender_peer_id: ID) -> None:
        topic = graft_msg.topicID
        if topic in self.mesh and not self.allows(sender_peer_id, topic):
            self.withheld("graft_refused")
            self.mesh[topic].discard(sender_peer_id)
            self._add_back_off(sender_peer_id, topic, False)
            await self.emit_prune(topic, sender_peer_id, False, False)
            return
        await super().handle_graft(graft_msg, sender_peer_id)

    def mesh_heartbeat(self) -> tuple[defaultdict[ID, list[str]], defaultdict[ID, list[str]]]:
        lost = self._drop_refused()
        graft, prune = super().mesh_heartbeat()
        for peer, topics in lost.items():
            prune[peer].extend(topics)
        return graft, prune

    def _drop_refused(self) -> defaultdict[ID, list[str]]:
        """Peers the gate refuses now (entitlement changes): out of mesh and fanout; the
        mesh's ones get a PRUNE."""
        lost: defaultdict[ID, list[str]] = defaultdict(list)
        if self.gate is None:
            return lost
        for topic, peers in self.mesh.items():
            for peer in [p for p in peers if not self.allows(p, topic)]:
                peers.discard(peer)
                self._add_back_off(peer, topic, False)
                lost[peer].append(topic)
        for topic, peers in self.fanout.items():
            peers.difference_update([p for p in peers if not self.allows(p, topic)])
        return lost


def gate_outbound(pubsub: Pubsub, router: GatedGossipSub) -> None:
    """Make every RPC ``pubsub`` writes pass ``router.without_refused`` first (module doc)."""
    write = pubsub.write_msg

    async def gated(stream: INetStream, rpc: rpc_pb2.RPC) -> bool:
        if router.gate is None:
            return await write(stream, rpc)
        kept = router.without_refused(stream.muxed_conn.peer_id, rpc)
        return True if kept is None else await write(stream, kept)

    pubsub.write_msg = gated  # type: ignore[method-assign,assignment]
