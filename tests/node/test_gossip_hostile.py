"""A gossip flood against a real node process over libp2p on 127.0.0.1 (issue 19).

Before the per-forwarder budget, 2,000 replays of a held op in ~12 s cost the flooder
nothing (2,000 x ``nothing_new``, 0 points, never blocked) and the node 2.5 s of CPU (17 %)."""

from __future__ import annotations

import logging
import os
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import multiaddr
import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.peerinfo import info_from_p2p_addr

from cluster.local import Cluster
from cluster.scenario import Authors
from node.gossip.settings import OPS_TOPIC
from node.p2p.host import start_host
from store.ops import encode_ops

log = logging.getLogger(__name__)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _gossip(address: str, envelopes: list[bytes], period_s: float, start: trio.Event) -> str:
    """Publish ``envelopes`` from a fresh peer, ``period_s`` apart, once ``start`` is set."""
    async with AsyncExitStack() as stack:
        host, pubsub = await start_host(stack, create_new_key_pair(), "/ip4/127.0.0.1/tcp/0", 1)
        await host.connect(info_from_p2p_addr(multiaddr.Multiaddr(address)))
        await pubsub.subscribe(OPS_TOPIC)
        await start.wait()
        for data in envelopes:
            await pubsub.publish(OPS_TOPIC, data)  # once banned: dropped, never raised
            await trio.sleep(period_s)
        await trio.sleep(1)
        return host.get_id().to_base58()


@pytest.mark.slow
async def test_a_replay_flood_gets_the_flooder_banned_and_new_ops_still_arrive(
    tmp_path: Path,
) -> None:
    authors = Authors(2)
    held = authors.messages(1, "held")
    honest = [authors.messages(1, f"new {n}", start=1) for n in range(40)]
    with Cluster(1, tmp_path) as cluster:
        await trio.to_thread.run_sync(cluster.start)
        await trio.to_thread.run_sync(cluster.post_ops, 0, [*authors.joins, *held])
        node, start, names = cluster.nodes[0], trio.Event(), {}

        async def run(name: str, envelopes: list[bytes], period_s: float) -> None:
            names[name] = await _gossip(node.multiaddr, envelopes, period_s, start)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "flood", [encode_ops(held)] * 2_000, 0.002)
            nursery.start_soon(run, "relay", [encode_ops(ops) for ops in honest], 0.1)
            await trio.sleep(3)  # both connected, the node knows their subscriptions
            assert node.proc is not None
            cpu, started = _cpu_s(node.proc.pid), trio.current_time()
            start.set()
        took, cpu = trio.current_time() - started, _cpu_s(node.proc.pid) - cpu
        status = await trio.to_thread.run_sync(cluster.status, 0)
        metrics = (await trio.to_thread.run_sync(httpx.get, f"{node.url}/metrics")).text
    log.warning("2,000 replays: node CPU %.2f s in %.1f s (%.0f %%)", cpu, took, 100 * cpu / took)
    log.warning("%s", [m for m in metrics.splitlines() if "rejected" in m or "banned" in m])
    assert names["flood"] in status["blocked_peers"]
    assert names["relay"] not in status["blocked_peers"]
    assert status["domains"]["messages"]["count"] == 1 + len(honest)  # every new op arrived
    assert "chatsync_peers_banned_total 1" in metrics
    assert 'chatsync_gossip_rejected_total{reason="throttled"}' in metrics
