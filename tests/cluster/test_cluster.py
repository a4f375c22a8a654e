"""Real node processes on loopback: convergence after stop/restart and partition, durability, hostile peers."""

from __future__ import annotations

import threading
import time
from contextlib import AsyncExitStack
from pathlib import Path

import cbor2
import httpx
import multiaddr
import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.peerinfo import info_from_p2p_addr

from cluster.local import Cluster
from cluster.scenario import Authors
from node.gossip.settings import OPS_TOPIC
from node.p2p import SYNC_PROTOCOL
from node.p2p.host import start_host
from node.p2p.streams import Libp2pFrames
from store import ChatDb, ChatDbConfig
from store.ops import encode_ops

pytestmark = pytest.mark.slow


def test_nodes_converge_after_restart_and_partition(tmp_path: Path) -> None:
    authors = Authors(3)
    with Cluster(3, tmp_path, sync_interval_s=1.0) as cluster:
        cluster.start()
        cluster.post_ops(0, authors.joins)  # the authors' adds: their messages are admitted
        for i in range(3):
            cluster.post_ops(i, authors.messages(40, f"n{i}", start=i * 40))
        cluster.wait_converged(timeout_s=60)
        assert cluster.roots(0)["messages"][1] == 120

        cluster.stop(2)  # SIGTERM: clean shutdown
        assert cluster.nodes[2].proc is not None and cluster.nodes[2].proc.returncode == 0
        cluster.post_ops(0, authors.messages(50, "while-down", start=500))
        cluster.restart(2)
        cluster.wait_converged(timeout_s=60)
        assert cluster.roots(2)["messages"][1] == 170

        cluster.partition(1)
        time.sleep(1.0)
        cluster.post_ops(0, authors.messages(30, "majority", start=900))
        cluster.post_ops(1, authors.messages(7, "minority", start=950))
        time.sleep(3.0)  # three sync intervals: the cut holds
        assert cluster.roots(1)["messages"][1] == 177
        assert cluster.roots(0)["messages"][1] == 200
        cluster.heal(1)
        cluster.wait_converged(timeout_s=60)
        assert all(cluster.roots(i)["messages"][1] == 207 for i in range(3))


def test_kill9_during_ingest_loses_no_acknowledged_write(tmp_path: Path) -> None:
    authors = Authors(2)
    batches = [authors.messages(25, f"b{i}", start=i * 25) for i in range(400)]
    acked: list[bytes] = []
    with Cluster(1, tmp_path, durable=True) as cluster:
        cluster.start()
        cluster.post_ops(0, authors.joins)
        stop = threading.Event()

        def ingest() -> None:
            client = httpx.Client(timeout=10)
            for batch in batches:
                if stop.is_set():
                    return
                try:
                    body = {"ops": [{"kind": 1, "data": _b64(m.encoded)} for m in batch]}
                    response = client.post(f"{cluster.nodes[0].url}/ops", json=body)
                except httpx.HTTPError:
                    return  # the node died mid-request: this batch was never acknowledged
                if response.status_code == 201:
                    acked.extend(m.msg_id for m in batch)

        writer = threading.Thread(target=ingest)
        writer.start()
        while len(acked) < 1_000:
            time.sleep(0.01)
        cluster.stop(0, kill=True)  # SIGKILL in the middle of the ingest
        stop.set()
        writer.join()
        assert cluster.nodes[0].proc is not None and cluster.nodes[0].proc.returncode == -9
        cluster.restart(0)  # RocksDB must open cleanly after the crash
        count = cluster.roots(0)["messages"][1]
        cluster.stop(0)
    with ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=cluster.nodes[0].data) as db:
        missing = [m for m in acked if not db.has_message(m)]
    assert not missing, f"{len(missing)} acknowledged messages lost"
    assert count >= len(acked)


def _b64(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(data).decode()


async def test_a_hostile_peer_does_not_disturb_the_node(tmp_path: Path) -> None:
    authors = Authors(1)
    # every attack below is counted; a ban would cut the test short (bans: test_limits.py)
    cluster = Cluster(1, tmp_path, node_config={"penalty_threshold": 1000.0})
    try:
        await trio.to_thread.run_sync(cluster.start)
        await trio.to_thread.run_sync(cluster.post_ops, 0, authors.joins)
        node = cluster.nodes[0]
        async with AsyncExitStack() as stack:
            host, pubsub = await start_host(stack, create_new_key_pair(), "/ip4/127.0.0.1/tcp/0", 1)
            await host.connect(info_from_p2p_addr(multiaddr.Multiaddr(node.multiaddr)))
            await pubsub.subscribe(OPS_TOPIC)
            await trio.sleep(2)
            # gossip: garbage, an op batch with a forged signature, a far-future op
            forged = authors.messages(1, "forged")[0]
            tampered = forged.encoded.replace(b"forged", b"FORGED")
            future = authors.messages(1, "future")[0]
            object.__setattr__(future, "hlc", type(future.hlc)(future.hlc.physical_ms + 10**9))
            envelopes = [b"\x00garbage", cbor2.dumps([1, [[1, tampered]]]), encode_ops([future])]
            for data in envelopes:
                await pubsub.publish(OPS_TOPIC, data)
            # sync stream: garbage, then a peer that stops mid-frame
            for junk in (b"\xff" * 64, b"\x85\x01"):
                stream = await host.new_stream(node_peer(node.peer_id), [SYNC_PROTOCOL])
                frames = Libp2pFrames(stream, 1 << 20)
                await frames.write_frame(junk)
                with trio.move_on_after(3):
                    await frames.read_frame()  # the node answers ABORT (or hangs up)
                await frames.aclose()
            await trio.sleep(1.5)
            async with httpx.AsyncClient(base_url=node.url, timeout=10) as client:
                assert (await client.get("/health")).status_code == 200
                metrics = (await client.get("/metrics")).text
                status = (await client.get("/status")).json()
            good = authors.messages(3, "good", start=10)
            await trio.to_thread.run_sync(cluster.post_ops, 0, good)
        assert status["domains"]["messages"]["count"] == 0  # nothing invalid was written
        for reason in ("wrong_type", "bad_signature", "far_future"):  # garbage, forged, future
            assert f'chatsync_gossip_rejected_total{{reason="{reason}"}} 1' in metrics, reason
        assert (
            'chatsync_sync_sessions_total{result="malformed_frame",role="responder"} 2' in metrics
        )
        final = await trio.to_thread.run_sync(cluster.status, 0)
        assert final["domains"]["messages"]["count"] == 3
    finally:
        await trio.to_thread.run_sync(cluster.close)


def node_peer(peer_id: str):  # type: ignore[no-untyped-def]
    from libp2p.peer.id import ID

    return ID.from_base58(peer_id)
