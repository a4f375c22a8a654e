"""A real js-libp2p peer (libp2p 3.3.11, @libp2p/gossipsub 17.1.1, noise, yamux or mplex; npm,
pinned in tests/interop/libp2p/package-lock.json) and a real chatsync node: the JS peer dials the
node, or the node dials it (``--bootstrap``); either way it receives the gossip of an op posted
to the node's HTTP API, and the node stores a signed op the JS peer publishes on the ops topic.
Needs Node.js 20 and npm."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from bench.js_peer import JsPeer, install_js_packages
from cluster.local import Cluster
from cluster.scenario import Authors
from node.gossip.settings import OPS_TOPIC
from store.ops import decode_ops, encode_ops
from store.records import MsgV1

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def js_packages() -> Path:
    return install_js_packages(force=True)  # ``npm ci`` every run: exactly the lock file's


def stored_messages(cluster: Cluster) -> int:
    return cluster.roots(0)["messages"][1]


def wait_for_messages(cluster: Cluster, count: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while stored_messages(cluster) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    return stored_messages(cluster)


def wait_for_gossip_of(peer: JsPeer, message: MsgV1, timeout_s: float) -> None:
    """Until a gossip message the JS peer received carries ``message`` (ops come batched)."""
    deadline = time.monotonic() + timeout_s
    while True:
        event = peer.wait_for("received", deadline - time.monotonic())
        ops = decode_ops(bytes.fromhex(event["data"]), max_bytes=1 << 20, max_ops=1024)
        if any(isinstance(op, MsgV1) and op.msg_id == message.msg_id for op in ops):
            return


def exchange_ops(cluster: Cluster, peer: JsPeer, authors: Authors) -> None:
    """JS -> node: the op the peer publishes is stored. Node -> JS: a posted op is gossiped."""
    assert peer.wait_for("subscribed", 30)["ok"], "the node never subscribed to the ops topic"
    assert cluster.nodes[0].peer_id in peer.wait_for("mesh", 10)["peers"]
    assert peer.wait_for("published", 10)["recipients"] >= 1
    assert wait_for_messages(cluster, 1, 20) == 1, "the node did not store the JS peer's op"

    posted = authors.messages(1, "from the node", start=1)[0]
    assert isinstance(posted, MsgV1)
    assert cluster.post_ops(0, [posted]) == [True]
    wait_for_gossip_of(peer, posted, 20)


def js_config(muxer: str, authors: Authors) -> dict[str, Any]:
    from_js = authors.messages(1, "from js-libp2p")[0]
    return {"muxer": muxer, "topic": OPS_TOPIC, "seconds": 120,
            "publish": [encode_ops([from_js]).hex()]}  # fmt: skip


@pytest.mark.parametrize("muxer", ["yamux", "mplex"])
def test_js_peer_dials_the_node_and_exchanges_gossip(
    js_packages: Path, tmp_path: Path, muxer: str
) -> None:
    authors = Authors(2)
    with Cluster(1, tmp_path, sync_interval_s=1.0) as cluster:
        cluster.start()
        cluster.post_ops(0, authors.joins)  # the authors are members: their messages are stored
        config = {**js_config(muxer, authors), "target": cluster.nodes[0].multiaddr}
        with JsPeer("gossip", config) as peer:
            exchange_ops(cluster, peer, authors)


@pytest.mark.parametrize("muxer", ["yamux", "mplex"])
def test_the_node_dials_a_js_peer_and_exchanges_gossip(
    js_packages: Path, tmp_path: Path, muxer: str
) -> None:
    authors = Authors(2)
    with JsPeer("gossip", js_config(muxer, authors)) as peer:  # no target: it only listens
        address = peer.wait_for("listening", 30)["addr"]
        with Cluster(1, tmp_path, sync_interval_s=1.0, extra_args=["--bootstrap", address]) as c:
            c.start()
            c.post_ops(0, authors.joins)
            assert peer.wait_for("connected", 20)["peer"] == c.nodes[0].peer_id
            exchange_ops(c, peer, authors)
