"""Peers found by the node (issue 32): three nodes that know only the first one find each
other by peer exchange, survive its loss, and a restarted node finds them from peers.json."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cluster.local import Cluster
from cluster.scenario import Authors

pytestmark = pytest.mark.slow

SYNC_INTERVAL_S = 2.0


def _connected(cluster: Cluster, index: int) -> set[str]:
    return set(cluster.status(index)["connected_peers"])


def _saved_peers(data: Path) -> set[str]:
    """The peer ids in a node's peers.json (rewritten at most once a second)."""
    path = data / "peers.json"
    return {row["id"] for row in json.loads(path.read_text())["peers"]} if path.exists() else set()


def _wait_for(what: str, done: Callable[[], bool], timeout_s: float = 30.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if done():
            return time.monotonic() - t0
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not within {timeout_s} s")


def test_losing_the_bootstrap_node_leaves_the_others_connected_and_converging(
    tmp_path: Path,
) -> None:
    authors = Authors(2)
    with Cluster(3, tmp_path, sync_interval_s=SYNC_INTERVAL_S, bootstrap_nodes=1) as cluster:
        cluster.start()
        a, b, c = (n.peer_id for n in cluster.nodes)
        # b and c were told only of a; each finds the other through a
        _wait_for("b and c connected", lambda: c in _connected(cluster, 1))
        cluster.post_ops(0, authors.joins)
        cluster.wait_converged(timeout_s=30)

        cluster.stop(0)
        _wait_for("a gone", lambda: a not in _connected(cluster, 1) | _connected(cluster, 2))
        assert c in _connected(cluster, 1) and b in _connected(cluster, 2)
        cluster.post_ops(1, authors.messages(20, "b", start=0))
        cluster.post_ops(2, authors.messages(20, "c", start=100))
        took = cluster.wait_converged(timeout_s=2 * SYNC_INTERVAL_S, indexes=[1, 2])
        assert cluster.roots(1)["messages"][1] == 40, took

        # b restarts knowing nobody but a (down): peers.json names c
        _wait_for("b saved c in peers.json", lambda: c in _saved_peers(cluster.nodes[1].data))
        cluster.stop(1)
        cluster.post_ops(2, authors.messages(10, "c-alone", start=200))
        cluster._spawn(cluster.nodes[1], [cluster.nodes[0].multiaddr])
        cluster._wait_ready(cluster.nodes[1], 60)
        cluster.wait_converged(timeout_s=30, indexes=[1, 2])
        assert cluster.roots(1)["messages"][1] == 50


def test_twenty_nodes_that_know_only_the_first_form_a_bounded_network_and_converge(
    tmp_path: Path,
) -> None:
    """Issue 32's 20-node run, short: connections within the waters (6..10, a young one
    over), each node reached peers it was never told of at start, and every op everywhere."""
    authors = Authors(4)
    with Cluster(20, tmp_path, sync_interval_s=SYNC_INTERVAL_S, bootstrap_nodes=1) as cluster:
        cluster.start(timeout_s=120)
        _wait_for(
            "every node at the low water",
            lambda: all(len(_connected(cluster, i)) >= 6 for i in range(20)),
            timeout_s=60,
        )
        cluster.post_ops(0, authors.joins)
        for i in range(0, 20, 4):
            cluster.post_ops(i, authors.messages(10, f"n{i}", start=i * 10))
        cluster.wait_converged(timeout_s=120)
        assert cluster.roots(19)["messages"][1] == 50
        connections = [len(_connected(cluster, i)) for i in range(20)]
        assert all(6 <= n <= 12 for n in connections), connections
        first = cluster.nodes[0].peer_id
        assert all(len(_connected(cluster, i) - {first}) >= 5 for i in range(1, 20))  # found
