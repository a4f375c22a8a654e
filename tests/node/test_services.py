"""``build_services`` without libp2p: two nodes' services over memory streams (fast).

What the in-process replay of the differential test does at scale: the services a node
builds, with a stand-in pubsub, driven by hand.
"""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from node.clock import Clock
from node.config import NodeConfig
from node.framing import TrioFrames
from node.services import Services, build_services
from node.verify import ProcessVerifier
from store.ops import encode_ops
from sync.frames import Domain
from sync.replica import DbReplica

from node_support import add, messages, small_db

MAX_FRAME = 1 << 22


class Published:
    """A stand-in pubsub: what the node's publisher sent, and empty outbound queues."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.peer_queues: dict[bytes, list[object]] = {}

    async def publish(self, topic_id: str, data: bytes) -> None:
        self.sent.append(data)


def services(tmp_path: Path, name: str, pubsub: Published) -> Services:
    replica = DbReplica(small_db(tmp_path / name))
    return build_services(
        NodeConfig(), replica, clock=Clock.system(), pubsub=pubsub,
        own_peer_id=name.encode(), verifier=ProcessVerifier(0),
    )  # fmt: skip


async def test_client_ops_are_written_then_gossiped_and_sync_brings_them_to_a_peer(
    tmp_path: Path,
) -> None:
    a_pubsub, b_pubsub = Published(), Published()
    a, b = services(tmp_path, "a", a_pubsub), services(tmp_path, "b", b_pubsub)
    ops = [add(1, 5), *messages(0, 20, author=1)]  # user 1 is added, then posts
    try:
        async with trio.open_nursery() as nursery:
            for s in (a, b):
                await nursery.start(s.writer.run)
            nursery.start_soon(a.gossip.publish_loop)
            submitted = await a.intake.submit(ops)
            assert submitted.new == [True] * 21 and submitted.waiting == [False] * 21
            again = await a.intake.submit(ops[:3])
            assert again.new == [False] * 3 and again.waiting == [False] * 3  # not gossiped
            while not a_pubsub.sent:
                await trio.sleep(0.01)
            left, right = trio.testing.memory_stream_pair()
            nursery.start_soon(b.sync.respond, "a", TrioFrames(right, MAX_FRAME))
            outcome = await a.sync.initiate("b", TrioFrames(left, MAX_FRAME))
            assert outcome.converged
            nursery.cancel_scope.cancel()
        assert a_pubsub.sent == [encode_ops(ops)]
        for domain in Domain:
            assert a.replica.tree(domain).root() == b.replica.tree(domain).root()
        # b logged the messages sync brought (from the applying thread), with b's clock
        assert len(b.sync_arrivals) == 20 and not a.sync_arrivals
        assert a.metrics.counter("ops_submitted") == 24
    finally:
        for s in (a, b):
            s.db.close()
