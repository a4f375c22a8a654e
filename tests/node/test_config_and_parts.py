"""Config layering, reconnect backoff, the Prometheus rendering."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from node.config import NodeConfig, load_config
from node.errors import StartupRefused
from node.metrics import Metrics
from node.node import db_config
from node.p2p import SYNC_PROTOCOL
from node.peers import PeerManager
from node.penalties import Blocklist
from node.sync_peers import SyncCandidates

from node_support import notices

PEER = "/ip4/1.2.3.4/tcp/1/p2p/12D3KooWK99VoVxNE7XzyBwXEzW7xhK7Gpv85r9F3V3fyKSUKPH5"


def test_defaults_then_toml_then_flags(tmp_path: Path) -> None:
    toml = tmp_path / "node.toml"
    toml.write_text(f'[node]\ndata = "/srv/a"\nhttp = "127.0.0.1:9000"\nbootstrap = ["{PEER}"]\n')
    cfg = load_config(str(toml), {"http": "127.0.0.1:9100", "durable": None})
    assert cfg.data == "/srv/a" and cfg.http == "127.0.0.1:9100" and cfg.durable is False
    assert cfg.bootstrap == (PEER,)
    assert cfg.http_host_port == ("127.0.0.1", 9100)
    assert load_config(None, {}) == NodeConfig()
    assert NodeConfig(data="/d").key_path == Path("/d/node.key")


def test_unknown_keys_are_an_error(tmp_path: Path) -> None:
    toml = tmp_path / "node.toml"
    toml.write_text("[node]\ndatta = 1\n")
    with pytest.raises(StartupRefused, match="datta"):
        load_config(str(toml), {})


def test_db_compression_is_checked_and_reaches_the_store(tmp_path: Path) -> None:
    toml = tmp_path / "node.toml"
    toml.write_text('[node]\ndb_compression = "brotli"\n')
    with pytest.raises(StartupRefused, match="db_compression 'brotli': one of lz4, none, zstd"):
        load_config(str(toml), {})
    assert db_config(NodeConfig()).compression == "lz4"
    assert db_config(NodeConfig(db_compression="zstd")).compression == "zstd"


def test_a_renamed_key_is_refused_with_its_new_name(tmp_path: Path) -> None:
    toml = tmp_path / "node.toml"
    toml.write_text("[node]\nsync_read_timeout_s = 5\n")
    with pytest.raises(StartupRefused, match="sync_read_timeout_s is now sync_idle_timeout_s"):
        load_config(str(toml), {})


class _Peer:
    def __init__(self, name: str) -> None:
        self.name = name

    def to_base58(self) -> str:
        return self.name


class _PeerTable:
    """What the scheduler reads of a host: who is connected, and that they speak sync."""

    def __init__(self, *names: str) -> None:
        self.peers = [_Peer(n) for n in names]

    def get_connected_peers(self) -> list[_Peer]:
        return self.peers

    def get_peerstore(self) -> _PeerTable:
        return self

    def has_peer(self, peer: _Peer) -> bool:
        return True

    def get_protocols(self, peer: _Peer) -> list[str]:
        return [SYNC_PROTOCOL]

    @property
    def peer_id(self) -> _Peer:
        return _Peer("self")


async def _session_gaps(more_to_do: Callable[[int], bool], run_s: float) -> list[float]:
    """Seconds between session starts with one peer (10 s interval) when the n-th session
    answers ``more_to_do(n)``; each session takes 1 s."""
    manager = PeerManager(
        _PeerTable("a"), Blocklist(), low=6, high=10, reconnect_min_s=0.5, reconnect_max_s=30,
        sync_interval_s=10, sync_per_interval=2, exchange_interval_s=30, rnd=random.Random(1),
        candidates=SyncCandidates(SYNC_PROTOCOL, notices(Metrics(), "sync_skipped")),
        metrics=Metrics(),
    )  # fmt: skip
    started: list[float] = []

    async def run_sync(peer: _Peer) -> bool:
        started.append(trio.current_time())
        await trio.sleep(1.0)
        return more_to_do(len(started))

    with trio.move_on_after(run_s):
        await manager.schedule_syncs(run_sync)
    return [b - a for a, b in itertools.pairwise(started)]


async def test_a_session_that_made_progress_is_followed_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Catch-up: sessions that answer "more to do" run back to back; then the interval rules."""
    gaps = await _session_gaps(lambda n: n <= 3, run_s=40)  # three with more to do
    assert all(g <= 1.5 for g in gaps[:3]), gaps  # back to back (the loop polls every 0.25 s)
    assert all(g >= 7.5 for g in gaps[3:]) and len(gaps) > 3, gaps  # the interval, jittered


async def test_follow_ups_are_capped(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer that always has a little more news cannot keep us in sessions back to back."""
    monkeypatch.setattr("node.peers.MAX_FOLLOW_UPS", 2)
    gaps = await _session_gaps(lambda n: True, run_s=30)
    assert all(g <= 1.5 for g in gaps[:2]) and all(g >= 7.5 for g in gaps[2:]), gaps
    assert len(gaps) > 2


def _manager(host: _PeerTable) -> PeerManager:
    return PeerManager(
        host, Blocklist(), low=6, high=10, reconnect_min_s=0.5, reconnect_max_s=30,
        sync_interval_s=10, sync_per_interval=2, exchange_interval_s=30, rnd=random.Random(1),
        candidates=SyncCandidates(SYNC_PROTOCOL, notices(Metrics(), "sync_skipped")),
        metrics=Metrics(),
    )  # fmt: skip


@pytest.mark.parametrize(("connected", "dials"), [(6, 1), (9, 1), (10, 0)])
async def test_between_the_waters_each_exchange_brings_one_more_dial(
    monkeypatch: pytest.MonkeyPatch, connected: int, dials: int
) -> None:
    """Turnover (node/peers.py): at or above the low water and below the high, a node dials
    one more peer with each periodic exchange and none between them; at the high, none."""
    manager = _manager(_PeerTable(*(f"c{i}" for i in range(connected))))
    for i in range(20):
        manager.book.connected(f"t{i}", [f"/ip4/127.0.0.1/tcp/{4000 + i}/p2p/t{i}"], now_ms=0)
    dialled: list[str] = []

    async def dial(peer_id: str, address: str) -> None:
        dialled.append(peer_id)

    async def ask(name: str) -> None:
        pass

    monkeypatch.setattr(manager, "_dial", dial)
    monkeypatch.setattr(manager, "_ask_for_peers", ask)
    async with trio.open_nursery() as nursery:
        await manager._maintain_once(nursery)  # the first exchange is due at once
        await manager._maintain_once(nursery)  # the next is 30 s away
    assert len(dialled) == dials


def test_prometheus_rendering() -> None:
    m = Metrics()
    m.inc("gossip_rejected", reason="bad_signature", help="rejected")
    m.inc("gossip_rejected", reason="bad_signature")
    m.gauge("records", lambda: {(("domain", "messages"),): 7.0}, help="records")
    m.observe_latency(12)
    text = m.render()
    assert 'chatsync_gossip_rejected_total{reason="bad_signature"} 2' in text
    assert 'chatsync_records{domain="messages"} 7' in text
    assert "# TYPE chatsync_op_latency_ms summary" in text
    assert m.latency_quantiles()["p50"] == 12


async def test_dropped_gossip_rpcs_are_counted() -> None:
    """py-libp2p only logs an outbound RPC it drops; the node's hook sees each one too."""
    from contextlib import AsyncExitStack

    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.pubsub.pb import rpc_pb2

    from node.p2p.host import start_host

    reasons: list[str] = []
    async with AsyncExitStack() as stack:
        host, pubsub = await start_host(
            stack, create_new_key_pair(), "/ip4/127.0.0.1/tcp/0", 1, reasons.append
        )
        rpc = rpc_pb2.RPC(publish=[rpc_pb2.Message(data=b"x")])
        pubsub.router._handle_dropped_rpc(host.get_id(), rpc, "queue_full")
        pubsub.router._handle_dropped_rpc(host.get_id(), rpc, "oversized")
    assert reasons == ["queue_full", "oversized"]


class _RecordingPubsub:
    """What the publisher sees of py-libp2p's Pubsub: ``publish`` and the outbound queues."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, int]] = []  # (virtual time, ops in the message)
        self.peer_queues: dict[str, list[object]] = {}

    async def publish(self, topic: str, data: bytes) -> None:
        from store.ops import decode_ops

        self.sent.append(
            (trio.current_time(), len(decode_ops(data, max_bytes=1 << 20, max_ops=4096)))
        )


async def test_the_publisher_spaces_messages_by_min_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """py-libp2p costs CPU per message: under a steady trickle a node publishes at most one
    message per ``min_interval``; after a quiet spell the next op leaves after batch_delay."""
    from cluster.scenario import Authors
    from node.clock import Clock
    from node.gossip import GossipService, GossipSettings, GossipValidator

    pubsub = _RecordingPubsub()
    settings = GossipSettings(
        topic="t", own_peer_id=b"me", max_bytes=900 * 1024, max_payload=1024,
        max_offset_ms=60_000, batch_ops=1024, batch_delay_ms=20, min_interval_ms=500,
    )  # fmt: skip
    gossip = GossipService(
        settings, pubsub, None, GossipValidator(settings), Metrics(), Clock(0),  # type: ignore[arg-type]
    )  # fmt: skip
    ops = Authors(1).messages(41, "trickle")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gossip.publish_loop)
        for op in ops[:40]:  # 20 ops/s for 2 s
            await gossip.publish([op])
            await trio.sleep(0.05)
        await trio.sleep(5)  # quiet
        quiet_at = trio.current_time()
        await gossip.publish(ops[40:])
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    times = [t for t, _ in pubsub.sent]
    assert sum(n for _, n in pubsub.sent) == 41
    assert times[0] == pytest.approx(0.02)  # the first op waits only batch_delay
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps[:-1]) >= 0.5 - 1e-9  # then one message per min_interval at most
    assert len(pubsub.sent) <= 2 / 0.5 + 2
    assert times[-1] - quiet_at == pytest.approx(0.02)  # after the quiet spell: batch_delay


async def test_task_tree_names_each_task_and_where_it_waits() -> None:
    """What a slow shutdown logs (node.run._report_slow_shutdown)."""
    from node.run import task_tree

    async def parked_forever() -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(parked_forever, name="the-parked-one")
        await trio.testing.wait_all_tasks_blocked()  # it has reached its sleep
        lines = task_tree(trio.lowlevel.current_task())
        nursery.cancel_scope.cancel()
    parked = [line for line in lines if "the-parked-one" in line]
    assert len(parked) == 1 and "parked_forever" in parked[0] and "sleep_forever" in parked[0]
    assert parked[0].startswith("  ")  # one level below this task


async def test_the_node_clock_is_trios(autojump_clock: trio.testing.MockClock) -> None:
    """One clock: wall-clock ms move with trio's time (so autojump tests move them too)."""
    import time

    from node.clock import Clock

    clock = Clock(epoch_ms=1_000)
    start_s, start_ms = clock.now(), clock.wall_ms()
    await trio.sleep(5)
    assert clock.now() - start_s == 5 and clock.wall_ms() - start_ms == 5_000
    assert clock.seconds_until(clock.wall_ms() + 1_500) == 1.5
    clock.offset_ms = -200  # a skewed node (the simulator's clock faults)
    assert clock.wall_ms() - start_ms == 4_800
    system = Clock.system()
    assert abs(system.wall_ms() - time.time() * 1000) < 1_000
