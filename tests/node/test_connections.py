"""Strangers cannot lock out, stall or flood a node: inbound admission, protocol-aware peers.

Fast: the pure parts (``InboundAdmission``, ``SyncCandidates``, ``Notices``, the log filter).
Slow: a real node and real py-libp2p peers on 127.0.0.1 (SECURITY.md, "Attacks tried").
"""

from __future__ import annotations

import logging
import subprocess
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import multiaddr
import pytest
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr

from node.admission import (
    BANNED_ADDRESS,
    TOO_MANY,
    TOO_MANY_FROM_IP,
    AdmissionLimits,
    InboundAdmission,
)
from node.metrics import Metrics
from node.p2p.gossip_peers import StreamFailureFilter
from node.sync_peers import IDENTIFY_GRACE_S, NO_IDENTIFY, NO_SYNC_PROTOCOL, SyncCandidates, Verdict

from node_support import notices, running_node

SYNC = "/chatsync/sync/1"


# --- the pure parts ---


def test_admission_caps_total_and_per_ip_and_releases() -> None:
    admission = InboundAdmission(AdmissionLimits(max_inbound=3, max_per_ip=2), blocked=set())
    assert admission.admit("10.0.0.1") is None and admission.admit("10.0.0.1") is None
    assert admission.admit("10.0.0.1") == TOO_MANY_FROM_IP
    assert admission.admit("10.0.0.2") is None
    assert admission.admit("10.0.0.3") == TOO_MANY
    admission.release("10.0.0.1")
    assert admission.open == 2 and admission.admit("10.0.0.3") is None


def test_an_address_only_banned_peers_used_is_refused_a_shared_one_is_not() -> None:
    blocked: set[str] = set()
    admission = InboundAdmission(AdmissionLimits(), blocked)
    admission.remember("bad", "10.0.0.9")
    admission.remember("bad", "127.0.0.1")
    admission.remember("good", "127.0.0.1")
    blocked.add("bad")
    assert admission.admit("10.0.0.9") == BANNED_ADDRESS
    assert admission.admit("127.0.0.1") is None  # shared: the peer id is refused instead
    blocked.discard("bad")  # the ban lifted
    assert admission.admit("10.0.0.9") is None


def test_sync_waits_for_identify_then_skips_peers_without_the_protocol() -> None:
    metrics = Metrics()
    candidates = SyncCandidates(SYNC, notices(metrics, "sync_skipped"))
    assert candidates.verdict("a", [], now=0.0) is Verdict.WAIT
    assert candidates.verdict("a", [], now=IDENTIFY_GRACE_S) is Verdict.SKIP
    assert candidates.verdict("b", ["/ipfs/id/1.0.0"], now=0.0) is Verdict.SKIP
    assert not candidates.protocols_changed("b", ["/ipfs/id/1.0.0"])
    assert candidates.protocols_changed("b", ["/ipfs/id/1.0.0", SYNC])  # identify push
    assert candidates.verdict("b", [SYNC], now=1.0) is Verdict.OPEN
    assert metrics.counter("sync_skipped", reason=NO_IDENTIFY) == 1
    assert metrics.counter("sync_skipped", reason=NO_SYNC_PROTOCOL) == 1
    candidates.keep_only({"b"})
    assert candidates.verdict("a", [], now=100.0) is Verdict.WAIT  # forgotten: a new peer


def test_notices_count_every_event_and_log_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics, clock = Metrics(), [0.0]
    note = notices(metrics, "refused", now=lambda: clock[0])
    with caplog.at_level(logging.INFO, logger="chatsync.test"):
        for second in range(120):
            clock[0] = float(second)
            note.note("peer", "why", "refused %s", "peer")
            note.note("other", "why", "refused %s", "other")
    assert metrics.counter("refused", reason="why") == 240
    assert len(caplog.records) == 4  # per subject: at 0 s and at 60 s


def test_the_stream_failure_block_becomes_one_counted_line() -> None:
    metrics = Metrics()
    log_filter = StreamFailureFilter(notices(metrics, "peer_streams_failed"))
    block = "Failed to open stream to peer 12D3x:\n  Error: protocols not supported\n  Timeout: 5s"
    record = logging.LogRecord("libp2p", logging.ERROR, "f", 1, block, None, None)
    other = logging.LogRecord("libp2p", logging.ERROR, "f", 1, "something else", None, None)
    assert not log_filter.filter(record) and log_filter.filter(other)
    assert metrics.counter("peer_streams_failed", reason="stream_failed") == 1


# --- a real node, real peers on 127.0.0.1 ---


async def _connect_and_leave(host: Any, target: multiaddr.Multiaddr) -> None:
    info = info_from_p2p_addr(target)
    with trio.fail_after(10):
        await host.connect(info)
    await host.disconnect(info.peer_id)


async def _plain_host(stack: AsyncExitStack) -> Any:
    """A libp2p peer with identify only: no gossip, no sync."""
    host = new_host(key_pair=create_new_key_pair(), listen_addrs=[])
    await stack.enter_async_context(host.run(listen_addrs=[]))
    return host


def _address(running: Any) -> multiaddr.Multiaddr:
    return multiaddr.Multiaddr(f"{running.listen_addrs[0]}/p2p/{running.peer_id}")


@pytest.mark.slow
async def test_an_honest_peer_connects_after_1000_connect_disconnect_cycles(
    tmp_path: Path,
) -> None:
    """Before: py-libp2p held each inbound slot until shutdown; after 250 cycles every
    inbound connection was refused. Eight peers connect and hang up 125 times each."""
    async with running_node(tmp_path) as (running, _):
        target = _address(running)
        async with AsyncExitStack() as stack:
            hosts = [await _plain_host(stack) for _ in range(8)]

            async def churn(host: Any) -> None:
                for _ in range(125):
                    await _connect_and_leave(host, target)

            async with trio.open_nursery() as nursery:
                for host in hosts:
                    nursery.start_soon(churn, host)
            honest = await _plain_host(stack)
            await _connect_and_leave(honest, target)  # raised before the fix
        assert running.inbound.admission.open <= 1


async def _first_bytes(source_ip: str, port: int) -> bytes:
    """What the node sends on a raw TCP connection from ``source_ip`` (b"" = hung up)."""
    sock = trio.socket.socket()
    await sock.bind((source_ip, 0))
    await sock.connect(("127.0.0.1", port))
    stream = trio.SocketStream(sock)
    with trio.move_on_after(5):
        try:
            await stream.send_all(b"\x13/multistream/1.0.0\n")
            return await stream.receive_some(100)
        except trio.BrokenResourceError:  # reset: it hung up before reading ours
            return b""
    return b"timeout"


@pytest.mark.slow
async def test_a_banned_peers_redial_is_refused_before_the_handshake(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (running, http):
        target = _address(running)
        port = int(target.value_for_protocol("tcp"))
        async with AsyncExitStack() as stack:
            bad = await _plain_host(stack)
            node_id = ID.from_base58(running.peer_id)
            bad.get_peerstore().add_addrs(node_id, [target], 120)
            await bad.get_network().dial_addr(target, node_id, source=("127.0.0.2", 0))
            await trio.sleep(0.5)
            await running.block_peer(bad.get_id().to_base58())  # as a ban does
            assert await _first_bytes("127.0.0.2", port) == b""  # hung up, nothing read
            assert (await _first_bytes("127.0.0.1", port)).startswith(b"\x13/multistream")
            assert not running.host.get_peerstore().has_peer(bad.get_id())  # not dialled back
        metrics = (await http.get("/metrics")).text
        assert 'chatsync_inbound_refused_total{reason="banned_address"} 1' in metrics


@pytest.mark.slow
async def test_a_peer_without_sync_gets_no_stream_and_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_node(tmp_path, sync_interval_s=0.5) as (running, http):
        async with AsyncExitStack() as stack:
            stranger = await _plain_host(stack)
            with caplog.at_level(logging.INFO):
                await stranger.connect(info_from_p2p_addr(_address(running)))
                await trio.sleep(4)  # 8 sync intervals
            name = stranger.get_id().to_base58()
        metrics = (await http.get("/metrics")).text
    lines = [r for r in caplog.records if name in r.getMessage()]
    reasons = [r.getMessage().rsplit(" ", 1)[-1] for r in lines]
    assert len(reasons) == len(set(reasons)) <= 2, [r.getMessage() for r in lines]
    assert 'chatsync_sync_skipped_total{reason="no_sync_protocol"}' in metrics
    assert "chatsync_sync_sessions_total" not in metrics  # no stream was opened
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.slow
async def test_the_per_ip_cap_refuses_the_next_connection(tmp_path: Path) -> None:
    async with running_node(tmp_path, inbound_per_ip=2) as (running, http):
        async with AsyncExitStack() as stack:
            hosts = [await _plain_host(stack) for _ in range(3)]
            info = info_from_p2p_addr(_address(running))
            for host in hosts[:2]:
                await host.connect(info)
            with pytest.raises(Exception):  # noqa: B017 - refused: py-libp2p's dial errors
                with trio.fail_after(10):
                    await hosts[2].connect(info)
            assert running.inbound.admission.open == 2
        metrics = (await http.get("/metrics")).text
    assert 'chatsync_inbound_refused_total{reason="too_many_from_ip"}' in metrics


NODE_PROCESS = """
import sys, trio
from node.config import NodeConfig
from node.node import Node
async def main():
    node = Node(NodeConfig(data=sys.argv[1], http="", sync_interval_s=3600))
    async with trio.open_nursery() as nursery:
        running = await nursery.start(node.run)
        print(f"{running.listen_addrs[0]}/p2p/{running.peer_id}", flush=True)
        await trio.sleep_forever()
trio.run(main)
"""


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
async def test_memory_returns_near_the_baseline_after_a_300_connection_flood(
    tmp_path: Path,
) -> None:
    """300 fresh peers (new keys) connect and leave, 10 at a time; the node runs alone."""
    proc = subprocess.Popen(
        [sys.executable, "-c", NODE_PROCESS, str(tmp_path / "n")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        target = multiaddr.Multiaddr(proc.stdout.readline().strip())
        await _connect_and_leave_fresh(target, 10)  # warm up what a first connection loads
        await trio.sleep(2)
        baseline = _rss_mb(proc.pid)
        await _connect_and_leave_fresh(target, 300)
        await trio.sleep(5)
        after = _rss_mb(proc.pid)
        print(f"node RSS: baseline {baseline:.1f} MB, 5 s after the flood {after:.1f} MB")
        assert after - baseline < 8.0, (baseline, after)
    finally:
        proc.terminate()
        proc.wait()


async def _connect_and_leave_fresh(target: multiaddr.Multiaddr, count: int) -> None:
    async def one() -> None:
        async with AsyncExitStack() as stack:
            await _connect_and_leave(await _plain_host(stack), target)

    limit = trio.CapacityLimiter(10)

    async def limited() -> None:
        async with limit:
            await one()

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(limited)
