"""The node's services, built once by ``build_services`` and passed explicitly.

Between RocksDB and the network a node runs: the writer (every client and gossip
write), the sync service (anti-entropy sessions), the gossip service (validator,
receiver, publisher), the intake (client ops), the retention GC, and the limits
(authors' rates, peer penalties and the blocklist they share with the admin switch).
``build_services`` wires them from a ``NodeConfig``, a ``DbReplica`` (a ChatDb with its
trees) and what comes from outside:

* ``clock`` — the node's one clock (``node/clock.py``);
* ``pubsub`` — what gossip publishes through: py-libp2p's ``Pubsub`` in a node, a
  stand-in in the in-process replay (``Publisher``: ``publish`` and ``peer_queues``);
* ``own_peer_id`` — our raw libp2p id (our own publishes are not validated again);
* ``verifier`` — how a sync frame's signatures are checked (``ProcessVerifier``).

No libp2p host is needed: ``Node`` (``node/node.py``) adds the host, the peer manager
and the HTTP API around the result; the in-process replay of the differential test
drives the same services over memory channels.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import base58

from node.agreement import root_gauge
from node.arrivals import ArrivalLog
from node.clock import Clock
from node.config import NodeConfig
from node.gc import RetentionGc
from node.gossip import GossipService, GossipSettings, GossipValidator, Publisher
from node.gossip.settings import OPS_TOPIC
from node.intake import OpIntake, ops_not_held
from node.limits import AuthorRates, GossipWaste
from node.memory import c_heap_usage, rss_bytes
from node.metrics import Labels, Metrics
from node.penalties import Blocklist, PeerJudge, PeerPenalties
from node.plants import drop_every
from node.syncer import SyncService
from node.writer import DbWriter
from store.chatdb import ChatDb
from store.errors import InvalidInput
from store.ops import Op
from store.records import MsgV1
from store.retention import RetentionPolicy
from sync.frames import Domain
from sync.protocol import SyncConfig
from sync.replica import DbReplica

Verifier = Callable[[Sequence[MsgV1]], list[InvalidInput | None]]


@dataclass(frozen=True)
class Services:
    config: NodeConfig
    clock: Clock
    metrics: Metrics
    replica: DbReplica
    writer: DbWriter
    sync: SyncService
    gossip: GossipService
    intake: OpIntake
    gc: RetentionGc
    author_rates: AuthorRates
    judge: PeerJudge
    blocklist: Blocklist
    # (packed HLC, arrival ms) of the newest messages sync stored (gossip keeps its own)
    sync_arrivals: ArrivalLog

    @property
    def db(self) -> ChatDb:
        return self.replica.db


def build_services(
    config: NodeConfig,
    replica: DbReplica,
    *,
    clock: Clock,
    pubsub: Publisher,
    own_peer_id: bytes,
    verifier: Verifier,
    topic: str = OPS_TOPIC,
    metrics: Metrics | None = None,
    record: Callable[[int, list[Op]], None] | None = None,
    on_gossip_applied: Callable[[list[Op]], None] | None = None,
) -> Services:
    """The node's services over ``replica``, wired as ``config`` says.

    ``record``: told of the client ops that were new (``--trace-out``).
    ``on_gossip_applied``: told of each gossip message's new ops once written.
    """
    metrics = metrics or Metrics()
    blocklist = Blocklist()
    penalties = PeerPenalties(config.penalty_threshold, ban_s=config.ban_s)
    judge = PeerJudge(penalties, blocklist, metrics, clock)
    author_rates = AuthorRates(config.author_ops_per_s, config.author_ops_burst)
    writer = DbWriter(
        replica, metrics, queue_ops=config.write_queue,
        batch_max=config.write_batch_max, min_free_disk_mb=config.min_free_disk_mb,
        drop_every=drop_every(config.chaos_plant),  # CHAOS PLANT: 0 (off) by default
    )  # fmt: skip
    sync = SyncService(
        replica, writer.store_received, metrics, clock=clock,
        config=sync_config(config, verifier), cutoff=lambda: replica.cutoff_ms,
        frames_per_s=config.peer_sync_frames_per_s, bytes_per_s=config.peer_sync_bytes_per_s,
        max_sessions=config.sync_max_sessions, on_outcome=judge.sync_ended,
        own_id=base58.b58encode(own_peer_id).decode(),
    )  # fmt: skip
    settings = GossipSettings.of(config, topic=topic, own_peer_id=own_peer_id)
    not_held = functools.partial(ops_not_held, replica.db)
    validator = GossipValidator(settings, not_held=not_held, author_rates=author_rates)
    gossip = GossipService(
        settings, pubsub, writer, validator, metrics, clock,
        blocklist=blocklist, judge=judge, on_applied=on_gossip_applied,
        waste=GossipWaste(config.gossip_peer_waste_per_s, config.gossip_peer_waste_bytes_per_s),
    )  # fmt: skip
    intake = OpIntake(
        replica.db, writer, gossip, author_rates, metrics, clock,
        max_offset_ms=config.max_offset_ms, record=record, scope=replica.scope,
    )  # fmt: skip
    policy = RetentionPolicy(config.retention_days, config.max_storage_mb)
    gc = RetentionGc(replica, writer, policy, metrics, clock, interval_s=config.gc_interval_s)
    sync_arrivals = _log_sync_arrivals(replica, clock)
    _register_gauges(metrics, replica, writer)
    _register_agreement(metrics, sync, clock)
    return Services(
        config, clock, metrics, replica, writer, sync, gossip, intake, gc,
        author_rates, judge, blocklist, sync_arrivals,
    )  # fmt: skip


def sync_config(config: NodeConfig, verifier: Verifier) -> SyncConfig:
    """A node's sync sessions: its limits, signed records checked, its idle timeout."""
    return SyncConfig(
        max_frame=config.sync_max_frame,
        max_payload=config.max_payload,
        authenticate=True,
        max_offset_ms=config.max_offset_ms,
        settle_ms=round(config.sync_settle_s * 1000),
        idle_timeout_ms=round(config.sync_idle_timeout_s * 1000),
        min_bytes_per_s=config.sync_min_bytes_per_s,
        verify_messages=verifier,
    )


def _log_sync_arrivals(replica: DbReplica, clock: Clock) -> ArrivalLog:
    """A log of the messages sync stores that are new here (GET /debug/latency?arrivals=1)."""
    arrivals = ArrivalLog()

    def arrived(msgs: list[MsgV1]) -> None:  # the writing thread
        now = clock.wall_ms()
        arrivals.extend((msg.hlc.pack(), now) for msg in msgs)

    replica.on_new_messages = arrived
    return arrivals


def _memory_parts(replica: DbReplica) -> dict[Labels, float]:
    parts: dict[str, int] = {**c_heap_usage(), **replica.db.memory_usage()}
    rss = rss_bytes()
    if rss is not None:
        parts["rss"] = rss
    return {(("part", name),): value for name, value in parts.items()}


def _register_agreement(metrics: Metrics, sync: SyncService, clock: Clock) -> None:
    """Convergence for Prometheus: equal digests across nodes = equal roots (the Grafana
    dashboard counts the distinct values), and how long each peer has not agreed."""
    metrics.gauge(
        "root_digest",
        lambda: {(("domain", d),): root_gauge(root) for d, root in sync.roots().items()},
        help="the first 48 bits of each domain's Merkle root: equal on nodes that agree",
    )
    metrics.gauge(
        "peer_agreed_seconds",
        lambda: {
            (("peer", p),): s for p, s in sync.agreement.seconds_since(clock.wall_ms()).items()
        },
        help="seconds since a sync session with the peer last ended with equal roots",
    )


def _register_gauges(metrics: Metrics, replica: DbReplica, writer: DbWriter) -> None:
    metrics.gauge(
        "records",
        lambda: {(("domain", d.name.lower()),): replica.tree(d).count for d in Domain},
        help="records per domain",
    )
    metrics.gauge(
        "write_queue", lambda: {(): writer.statistics().queued}, help="ops waiting to be written"
    )
    metrics.gauge(
        "refused_out_of_scope",
        lambda: {(): replica.refused_out_of_scope},
        help="messages and deletes of chats outside this node's scope, refused (since start)",
    )
    metrics.gauge(
        "memory_bytes",
        lambda: _memory_parts(replica),
        help="resident set size; the C heap (RocksDB's parts are inside it)",
    )
    room = replica.waiting
    metrics.gauge(
        "waiting_messages",
        lambda: {
            (("what", "held"),): len(room),
            (("what", "bytes"),): room.bytes,
            (("what", "parked"),): room.stats.parked,
            (("what", "released"),): room.stats.released,
            (("what", "evicted"),): room.stats.evicted,
        },
        help="messages held until a member op admits them (store.waiting; counts since start)",
    )
