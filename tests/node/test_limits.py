"""Limits and misbehaving peers: token buckets, penalties and bans, rate-limited authors, a full disk."""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import cbor2
import httpx
import multiaddr
import pytest
import trio
import trio.testing
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr

import node.intake as intake_module
from cluster.local import Cluster
from cluster.scenario import GROUP, Authors
from node.clock import Clock
from node.gossip.settings import OPS_TOPIC
from node.limits import AuthorRates, RateLimited, TokenBuckets
from node.metrics import Metrics
from node.p2p import SYNC_PROTOCOL
from node.p2p.host import start_host
from node.p2p.streams import Libp2pFrames
from node.penalties import Blocklist, PeerJudge, PeerPenalties
from store import ChatDb, ChatDbConfig, MsgV1
from store.ops import Op, encode_ops

from node_support import counts, messages, now_ms, ops_body, running_node


def test_token_buckets_refill_and_cap() -> None:
    buckets = TokenBuckets(rate=10, burst=20)
    assert buckets.take("a", 20, now=0.0)
    assert not buckets.take("a", 1, now=0.0)  # empty; nothing taken
    assert buckets.take("a", 5, now=0.5)  # 5 refilled
    assert not buckets.take("a", 1, now=0.5)
    assert buckets.take("b", 20, now=0.5)  # keys are independent
    assert buckets.take("a", 20, now=100.0) and not buckets.take(
        "a", 1, now=100.0
    )  # capped at burst


def test_penalties_decay_ban_and_expire() -> None:
    p = PeerPenalties(threshold=10, decay_per_s=1.0, ban_s=60)
    assert not p.penalize("x", 6, now=0)
    assert not p.penalize("x", 6, now=5)  # 6 - 5 decayed + 6 = 7
    assert p.penalize("x", 3, now=5)  # 10: banned
    assert p.expired_bans(now=30) == []
    assert p.expired_bans(now=65) == ["x"]


def test_a_clock_that_goes_back_refills_nothing_and_no_rate_means_no_limit() -> None:
    buckets = TokenBuckets(rate=10, burst=20)
    assert buckets.take("a", 20, now=100.0)
    assert not buckets.take("a", 1, now=50.0)  # back in time: nothing refilled (nor taken)
    assert buckets.take("a", 10, now=101.0)
    unlimited = TokenBuckets(rate=float("inf"), burst=float("inf"))
    assert all(unlimited.take("a", 10**9, now=0.0) for _ in range(3))


def test_author_rates_stop_at_the_first_author_over_its_rate() -> None:
    """The one per-author check of the API and gossip: each author's new ops are taken from
    its bucket; the first author over its rate is named, its ops are not taken."""
    rates = AuthorRates(ops_per_s=1.0, burst=3.0)
    alice, bob = messages(0, 3, author=0), messages(10, 4, author=1)
    rates.check(alice[:2], now_ms=0)
    with pytest.raises(RateLimited, match=bob[0].sender.hex()) as info:
        rates.check([alice[2], *bob], now_ms=0)  # Bob: 4 ops, burst 3
    assert info.value.reason == "rate_limited"
    rates.check(bob[:3], now_ms=0)  # nothing was taken from Bob
    with pytest.raises(RateLimited):
        rates.check(alice[:1], now_ms=0)  # Alice, before him, was charged: her burst is spent
    rates.check(alice[:1], now_ms=1_000)  # a second later: one more op


async def test_bans_land_on_the_blocklist_and_lift_on_trios_clock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    blocklist, metrics = Blocklist(), Metrics()
    judge = PeerJudge(PeerPenalties(threshold=10, ban_s=60), blocklist, metrics, Clock(0))
    judge.gossip_rejected("relay", "rate_limited")  # an honest relay sends those too: free
    judge.gossip_rejected("relay", "clock_drift")
    assert metrics.counter("peer_penalties", reason="gossip_rate_limited") == 0
    judge.gossip_rejected("forger", "bad_signature")
    judge.gossip_rejected("forger", "bad_signature")
    assert "forger" in blocklist and "relay" not in blocklist
    assert metrics.counter("peers_banned") == 1
    await trio.sleep(59)
    assert judge.lift_expired_bans() == [] and "forger" in blocklist
    await trio.sleep(1)
    assert judge.lift_expired_bans() == ["forger"] and "forger" not in blocklist


async def test_an_author_over_its_rate_is_refused_with_429(tmp_path: Path) -> None:
    authors = Authors(1)  # its one author created GROUP and signs its own join: burst 1 + 5
    async with running_node(tmp_path, author_ops_per_s=1.0, author_ops_burst=6.0) as (_, http):
        first = authors.messages(5, "a")  # with the join, the whole burst
        response = await http.post("/ops", json=ops_body(*authors.joins, *first))
        assert response.status_code == 201 and response.json()["new"] == [True] * 6
        more = authors.messages(4, "b", start=10)
        response = await http.post("/ops", json=ops_body(*more))
        assert response.status_code == 429 and response.json()["code"] == "rate_limited"
        assert "-32005" in response.json()["message"]
        assert (await counts(http))["messages"] == 5  # nothing of the refused request written
        assert (await http.get("/health")).status_code == 200


async def test_a_resent_batch_checks_only_the_ops_not_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A held message has the very bytes that were checked when it was stored: resending it
    costs neither a signature check nor the author's budget (burst 6: the join, 3 + 2 new
    ops fit)."""
    checked: list[object] = []
    real_refuse = intake_module.refuse_never_valid

    def counting_refuse(ops: list[Op], **kwargs: Any) -> list[Op]:
        checked.extend(ops)
        return real_refuse(ops, **kwargs)

    monkeypatch.setattr(intake_module, "refuse_never_valid", counting_refuse)
    authors = Authors(1)  # its one author signs its own join too: burst 1 + 5
    first, then = authors.messages(3, "a"), authors.messages(2, "b", start=10)
    async with running_node(tmp_path, author_ops_per_s=0.01, author_ops_burst=6.0) as (_, http):
        assert (await http.post("/ops", json=ops_body(*authors.joins))).status_code == 201
        checked.clear()
        assert (await http.post("/ops", json=ops_body(*first))).status_code == 201
        assert checked == first
        response = await http.post("/ops", json=ops_body(*first, *then))
        assert response.status_code == 201
        assert response.json()["new"] == [False, False, False, True, True]
        assert checked == first + then
        assert (await counts(http))["messages"] == 5


async def test_writes_are_refused_when_the_disk_is_nearly_full(tmp_path: Path) -> None:
    free_mb = shutil.disk_usage(tmp_path).free // (1024 * 1024)
    authors = Authors(1)
    async with running_node(tmp_path, min_free_disk_mb=free_mb + 10_000) as (_, http):
        response = await http.post("/ops", json=ops_body(*authors.messages(3, "x")))
        assert response.status_code == 507 and response.json()["code"] == "disk_full"
        assert (await counts(http))["messages"] == 0
        assert (await http.get("/health")).status_code == 200


def _mount_tmpfs(path: Path, size_mb: int) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
                            capture_output=True)  # fmt: skip
    return result.returncode == 0


@pytest.mark.slow
def test_a_real_nearly_full_disk_refuses_writes_without_corruption(tmp_path: Path) -> None:
    disk = tmp_path / "small-disk"
    if not _mount_tmpfs(disk, 48):
        pytest.skip("cannot mount a tmpfs here (needs root); the guard itself is tested above")
    try:
        authors = Authors(2)
        rnd = random.Random(7)  # incompressible 200 KB payloads: the disk fills for real
        acked: list[bytes] = []
        refused = None
        with Cluster(1, disk, extra_args=["--min-free-disk-mb", "12"]) as cluster:
            cluster.start()
            cluster.post_ops(0, authors.joins)
            for i in range(400):
                msg = MsgV1.create(
                    authors.keys[i % 2], GROUP, authors.stamp(i % 2), rnd.randbytes(200_000)
                )
                response = cluster.http.post(f"{cluster.nodes[0].url}/ops", json=ops_body(msg))
                if response.status_code != 201:
                    refused = response
                    break
                acked.append(msg.msg_id)
            assert refused is not None and refused.status_code == 507
            assert refused.json()["code"] == "disk_full"
            cluster.stop(0)
            cluster.restart(0)  # RocksDB opens cleanly on the nearly full disk
            status = cluster.status(0)
            cluster.stop(0)
        with ChatDb(
            ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=cluster.nodes[0].data
        ) as db:
            assert all(db.has_message(m) for m in acked)
        assert status["domains"]["messages"]["count"] == len(acked)
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


@pytest.mark.slow
async def test_a_peer_that_keeps_sending_garbage_is_banned(tmp_path: Path) -> None:
    cluster = Cluster(1, tmp_path)
    try:
        await trio.to_thread.run_sync(cluster.start)
        node = cluster.nodes[0]
        async with AsyncExitStack() as stack:
            host, _ = await start_host(stack, create_new_key_pair(), "/ip4/127.0.0.1/tcp/0", 1)
            me = host.get_id().to_base58()
            await host.connect(info_from_p2p_addr(multiaddr.Multiaddr(node.multiaddr)))
            for _ in range(4):  # malformed frames: 3 points each, the ban comes at 10
                try:
                    stream = await host.new_stream(ID.from_base58(node.peer_id), [SYNC_PROTOCOL])
                    frames = Libp2pFrames(stream, 1 << 20)
                    await frames.write_frame(b"\xff garbage")
                    with trio.move_on_after(3):
                        await frames.read_frame()
                    await frames.aclose()
                except Exception:  # once banned, the node hangs up on us
                    break
            await trio.sleep(1.0)
            status = await trio.to_thread.run_sync(cluster.status, 0)
            metrics = (await trio.to_thread.run_sync(httpx.get, f"{node.url}/metrics")).text
        assert me in status["blocked_peers"]
        assert "chatsync_peers_banned_total 1" in metrics
    finally:
        await trio.to_thread.run_sync(cluster.close)


async def _gossip_from_a_stranger(cluster: Cluster, envelopes: list[bytes]) -> tuple[str, str]:
    """Publish ``envelopes`` from a fresh libp2p peer; its peer id and the node's metrics."""
    node = cluster.nodes[0]
    async with AsyncExitStack() as stack:
        host, pubsub = await start_host(stack, create_new_key_pair(), "/ip4/127.0.0.1/tcp/0", 1)
        await host.connect(info_from_p2p_addr(multiaddr.Multiaddr(node.multiaddr)))
        await pubsub.subscribe(OPS_TOPIC)
        await trio.sleep(2)  # the node learns our subscription
        for data in envelopes:
            await pubsub.publish(OPS_TOPIC, data)
            await trio.sleep(0.3)
        await trio.sleep(1.5)
        metrics = (await trio.to_thread.run_sync(httpx.get, f"{node.url}/metrics")).text
        return host.get_id().to_base58(), metrics


@pytest.mark.slow
async def test_a_peer_that_gossips_forged_ops_is_banned(tmp_path: Path) -> None:
    """Each forged op rides with a message the node holds already (held ops are not
    checked again: that must not let the forged one through)."""
    authors = Authors(1)
    held = authors.messages(1, "genuine", start=50)[0]
    envelopes = [encode_ops([held])]
    for n in range(3):  # forged messages: 5 points each (decaying), the ban comes at 10
        op = authors.messages(1, f"forged {n}")[0]
        forged = op.encoded.replace(b"forged", b"FORGED")
        envelopes.append(cbor2.dumps([1, [[1, held.encoded], [1, forged]]]))
    with Cluster(1, tmp_path) as cluster:
        await trio.to_thread.run_sync(cluster.start)
        await trio.to_thread.run_sync(cluster.post_ops, 0, authors.joins)
        me, metrics = await _gossip_from_a_stranger(cluster, envelopes)
        status = await trio.to_thread.run_sync(cluster.status, 0)
    assert 'chatsync_gossip_rejected_total{reason="bad_signature"} 3' in metrics
    assert 'chatsync_peer_penalties_total{reason="gossip_bad_signature"} 3' in metrics
    assert me in status["blocked_peers"]
    assert "chatsync_peers_banned_total 1" in metrics
    assert status["domains"]["messages"]["count"] == 1  # the genuine one


@pytest.mark.slow
async def test_an_author_over_its_rate_is_refused_on_the_gossip_path(tmp_path: Path) -> None:
    """Burst 6: the author's join (over HTTP: the budget is shared), three new ops, the same
    three replayed twice (free: we hold them, and a replay must not spend the author's
    budget), two new ops, then one too many."""
    authors = Authors(1)
    first, then = authors.messages(3, "a"), authors.messages(2, "b", start=10)
    late = authors.messages(1, "c", start=20)
    envelopes = [encode_ops(first), encode_ops(first), encode_ops(first)]
    envelopes += [encode_ops(then), encode_ops(late)]
    config = {"author_ops_per_s": 0.01, "author_ops_burst": 6.0}
    with Cluster(1, tmp_path, node_config=config) as cluster:
        await trio.to_thread.run_sync(cluster.start)
        await trio.to_thread.run_sync(cluster.post_ops, 0, authors.joins)
        me, metrics = await _gossip_from_a_stranger(cluster, envelopes)
        status = await trio.to_thread.run_sync(cluster.status, 0)
    assert status["domains"]["messages"]["count"] == 5  # all but the one over the rate
    assert 'chatsync_gossip_rejected_total{reason="nothing_new"} 2' in metrics
    assert 'chatsync_gossip_rejected_total{reason="rate_limited"} 1' in metrics
    assert "chatsync_peer_penalties_total" not in metrics  # an honest relay sends these too
    assert me not in status["blocked_peers"]


@pytest.mark.slow
def test_kill9_during_a_sync_session_then_restart(tmp_path: Path) -> None:
    authors = Authors(3)
    with Cluster(2, tmp_path, sync_interval_s=1.0) as cluster:
        cluster.start()
        cluster.post_ops(0, authors.joins)
        cluster.stop(1)
        for i in range(40):  # 20,000 messages that node 1 must catch up on by sync
            cluster.post_ops(0, authors.messages(500, f"c{i}", start=i * 500))
        total = cluster.roots(0)["messages"][1]
        cluster.restart(1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until the catch-up is under way
            count = cluster.roots(1)["messages"][1]
            if 0 < count < total:
                break
            time.sleep(0.05)
        cluster.stop(1, kill=True)  # SIGKILL in the middle of the session
        cluster.restart(1)  # opens cleanly; the trees are rebuilt from RocksDB
        before = cluster.status(1)["domains"]
        cluster.stop(1)
        with ChatDb(
            ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=cluster.nodes[1].data
        ) as db:
            from sync.frames import Domain
            from sync.replica import DbReplica

            rebuilt = DbReplica(db).tree(Domain.MESSAGES)
            assert rebuilt.root_digest().hex() == before["messages"]["root"]
            assert rebuilt.count == before["messages"]["count"]
        cluster.restart(1)
        cluster.wait_converged(timeout_s=120)
        assert cluster.roots(1)["messages"][1] == total == 20_000
        assert now_ms() > 0
