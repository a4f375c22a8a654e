"""The node process: RocksDB + trees, the writer, libp2p gossip and sync, peers, the HTTP API.

Start-up: open ChatDb, rebuild the Merkle trees from it, start the writer, the
libp2p host, gossip and sync, the reconnect loops, the HTTP server — then report
``started``. ``stop()`` (SIGINT/SIGTERM in the CLI) stops the network side
first, lets the writer drain what it already accepted, then closes RocksDB.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from contextlib import AsyncExitStack
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import trio

from node.config import NodeConfig
from node.framing import Libp2pFrames
from node.gc import gc_loop
from node.gossip import ARRIVAL_LOG, GossipService
from node.limits import (
    GOSSIP_PENALTY,
    GOSSIP_PENALTY_OTHER,
    SYNC_PENALTY,
    PeerPenalties,
    RateLimited,
    TokenBuckets,
)
from node.metrics import Metrics
from node.p2p import (
    OPS_TOPIC,
    SYNC_PROTOCOL,
    load_or_create_key,
    peer_id_of,
    safe_handler,
    start_host,
)
from node.peers import PeerManager
from node.syncer import SyncOutcome, SyncService, wall_ms
from node.verify import ParallelVerifier
from node.writer import DbWriter
from store.chatdb import ChatDb
from store.errors import InvalidInput
from store.ops import Op, op_author, validate_op
from store.records import MsgV1
from store.retention import RetentionPolicy
from store.rocks import ChatDbConfig
from sync.frames import Domain
from sync.protocol import SyncConfig
from sync.replica import DbReplica

if TYPE_CHECKING:
    from trio_typing import TaskStatus

    from node.recorder import OpRecorder

log = logging.getLogger(__name__)


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.db_lock = trio.Lock()
        self.db: ChatDb | None = None
        self.replica: DbReplica | None = None
        self.writer: DbWriter | None = None
        self.gossip: GossipService | None = None
        self.sync: SyncService | None = None
        self.peers: PeerManager | None = None
        self.host: Any = None
        self.peer_id = ""
        self.listen_addrs: list[str] = []
        self._stop = trio.Event()
        self.author_limits = TokenBuckets(config.author_ops_per_s, config.author_ops_burst)
        self.penalties = PeerPenalties(config.penalty_threshold, ban_s=config.ban_s)
        self.recorder: OpRecorder | None = None  # --trace-out
        # (packed HLC, arrival ms) of the newest messages sync stored (gossip keeps its own)
        self.sync_arrivals: deque[tuple[int, int]] = deque(maxlen=ARRIVAL_LOG)

    def clock_ms(self) -> int:
        return wall_ms()

    def stop(self) -> None:
        self._stop.set()

    # --- running ---

    async def run(self, *, task_status: TaskStatus[Node] = trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.config
        db_config = ChatDbConfig(
            path=cfg.data,
            write_sync=cfg.durable,
            max_payload=cfg.max_payload,
            max_offset_ms=cfg.max_offset_ms,
        )
        self.db = await trio.to_thread.run_sync(ChatDb, db_config)
        try:
            if cfg.trace_out:
                from node.recorder import OpRecorder  # loads pyarrow: only when asked for

                self.recorder = OpRecorder(cfg.trace_out, cfg, self.clock_ms())
            # Refuse expired messages from the first write on; the GC loop keeps this current.
            self.db.expire_before_ms = RetentionPolicy(cfg.retention_days).age_cutoff(
                self.clock_ms()
            )
            self.replica = await trio.to_thread.run_sync(DbReplica, self.db)
            self.replica.on_new_messages = self._sync_arrived
            self.writer = DbWriter(
                self.db, self.replica, self.db_lock, self.metrics,
                queue_size=cfg.write_queue, batch_max=cfg.write_batch_max,
                min_free_disk_mb=cfg.min_free_disk_mb,
            )  # fmt: skip
            async with trio.open_nursery() as outer:
                await outer.start(self.writer.run)
                try:
                    await self._run_network(task_status)
                finally:
                    self.writer.close()  # the writer drains what it accepted, then returns
        finally:
            if self.recorder is not None:
                try:
                    self.recorder.close()
                except Exception as exc:  # e.g. a full disk: RocksDB must still close
                    log.error("closing the trace %s failed: %s", cfg.trace_out, exc)
            try:
                await trio.to_thread.run_sync(self.db.close)
                log.info("node stopped, RocksDB closed")
            except Exception as exc:  # e.g. no space to flush: the WAL still holds the data
                log.error("closing RocksDB failed (%s); the WAL keeps the writes", exc)

    async def _run_network(self, task_status: TaskStatus[Node]) -> None:
        # stop() cancels the libp2p services together with our tasks, not after them:
        # py-libp2p resets a stream whose negotiation was cut short in a shielded scope, and
        # that reset waits for the connection's write lock, which pubsub's sender holds while
        # blocked on a peer that reads slowly, until its service is cancelled. Our tasks
        # first, then the services, left a sync task parked there for good
        # (tests/node/test_shutdown.py).
        with trio.CancelScope() as network:
            await self._run_network_until_stopped(task_status, network)

    async def _run_network_until_stopped(
        self, task_status: TaskStatus[Node], network: trio.CancelScope
    ) -> None:
        cfg = self.config
        assert self.replica is not None and self.writer is not None
        async with AsyncExitStack() as stack:
            verifier = ParallelVerifier(cfg.verify_threads)
            stack.callback(verifier.close)  # closed last: after the host and its sessions
            key_pair = load_or_create_key(cfg.key_path)
            self.host, pubsub = await start_host(
                stack, key_pair, cfg.listen, cfg.gossip_heartbeat_s, self._gossip_dropped
            )
            self.peer_id = self.host.get_id().to_base58()
            self.listen_addrs = [str(a) for a in self.host.get_addrs()]
            self.peers = PeerManager(
                self.host, reconnect_min_s=cfg.reconnect_min_s, reconnect_max_s=cfg.reconnect_max_s,
                sync_interval_s=cfg.sync_interval_s, rnd=random.Random(),
            )  # fmt: skip
            self.sync = SyncService(
                self.replica, self.db_lock, self.metrics,
                config=SyncConfig(
                    max_frame=cfg.sync_max_frame,
                    max_payload=cfg.max_payload,
                    authenticate=True,
                    max_offset_ms=cfg.max_offset_ms,
                    verify_messages=verifier,
                ),
                read_timeout_s=cfg.sync_read_timeout_s, clock_ms=self.clock_ms,
                frames_per_s=cfg.peer_sync_frames_per_s, bytes_per_s=cfg.peer_sync_bytes_per_s,
                on_outcome=self._judge_sync,
            )  # fmt: skip
            self.gossip = GossipService(
                pubsub, OPS_TOPIC, self.writer, self.metrics,
                own_peer_id=self.host.get_id().to_bytes(), clock_ms=self.clock_ms,
                max_offset_ms=cfg.max_offset_ms, max_payload=cfg.max_payload,
                max_bytes=cfg.gossip_max_bytes, batch_ops=cfg.gossip_batch_ops,
                batch_delay_ms=cfg.gossip_batch_delay_ms,
                min_interval_ms=cfg.gossip_min_interval_ms, is_blocked=self.peers.is_blocked_bytes,
                on_applied=self._count_applied, author_limits=self.author_limits,
                new_to_us=self.new_to_us, on_reject=self._judge_gossip,
            )  # fmt: skip
            self._register_gauges()
            self.host.set_stream_handler(
                SYNC_PROTOCOL, safe_handler("sync", self._respond_sync, self._handler_failed)
            )
            pubsub.set_topic_validator(OPS_TOPIC, self.gossip.validate, False)
            subscription = await pubsub.subscribe(OPS_TOPIC)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.gossip.receive_loop, subscription)
                nursery.start_soon(self.gossip.publish_loop)
                for address in cfg.bootstrap:
                    nursery.start_soon(self.peers.keep_connected, address)
                nursery.start_soon(self.peers.schedule_syncs, self._initiate_sync)
                nursery.start_soon(self._lift_bans)
                policy = RetentionPolicy(cfg.retention_days, cfg.max_storage_mb)
                if policy.retention_days > 0 or policy.max_storage_mb > 0:
                    nursery.start_soon(self._gc_loop, policy)
                if cfg.http:
                    from node.api import serve_http

                    await nursery.start(serve_http, self, self._stop.wait)
                log.info("node %s listening on %s", self.peer_id, ", ".join(self.listen_addrs))
                task_status.started(self)
                await self._stop.wait()
                network.cancel()

    async def _gc_loop(self, policy: RetentionPolicy) -> None:
        assert self.db is not None and self.replica is not None
        await gc_loop(
            self.db, self.replica, self.db_lock, policy, self.config.gc_interval_s, self.clock_ms,
            metrics=self.metrics, sync=self.sync,
        )  # fmt: skip

    # --- sync over libp2p streams ---

    async def _initiate_sync(self, peer: Any) -> bool:
        """One session with ``peer``; True if it ended cleanly, brought records, and used up its
        passes (a catch-up with more to come): then the next one starts at once (the
        scheduler caps such runs). A pair that differs in records neither side accepts
        (expired, far-future) applies none: it keeps the normal interval."""
        assert self.sync is not None and self.peers is not None
        if peer.to_base58() in self.peers.blocked:
            return False
        with trio.fail_after(self.config.sync_read_timeout_s):
            stream = await self.host.new_stream(peer, [SYNC_PROTOCOL])
        frames = Libp2pFrames(stream, self.config.sync_max_frame)
        outcome = await self.sync.initiate(peer.to_base58(), frames)
        used_up = outcome.passes >= self.sync.config.max_passes
        return outcome.error is None and used_up and outcome.records_applied > 0

    async def _respond_sync(self, stream: Any) -> None:
        assert self.sync is not None and self.peers is not None
        peer = peer_id_of(stream)
        if peer in self.peers.blocked:
            await stream.reset()
            return
        await self.sync.respond(peer, Libp2pFrames(stream, self.config.sync_max_frame))

    # --- misbehaving peers ---

    def _judge_sync(self, outcome: SyncOutcome) -> None:
        reason = "useless" if outcome.useless else outcome.error
        points = SYNC_PENALTY.get(reason or "", 0.0)
        if points:
            self.punish(outcome.peer, points, reason or "")

    def _judge_gossip(self, peer: str, reason: str) -> None:
        points = GOSSIP_PENALTY.get(reason, GOSSIP_PENALTY_OTHER)
        if points:
            self.punish(peer, points, f"gossip_{reason}")

    def punish(self, peer: str, points: float, reason: str) -> None:
        """Count a misbehaviour; past the threshold the peer is banned (blocked) for ban_s."""
        assert self.peers is not None
        self.metrics.inc("peer_penalties", reason=reason, help="misbehaviour points given to peers")
        if self.penalties.penalize(peer, points, trio.current_time()):
            log.warning("banning peer %s for %.0f s (last: %s)", peer, self.config.ban_s, reason)
            self.metrics.inc("peers_banned", help="peers banned for misbehaviour")
            trio.lowlevel.spawn_system_task(self.peers.block, peer)

    async def _lift_bans(self) -> None:
        assert self.peers is not None
        while True:
            for peer in self.penalties.expired_bans(trio.current_time()):
                self.peers.unblock(peer)
            await trio.sleep(1.0)

    def _sync_arrived(self, msgs: list[MsgV1]) -> None:
        # (the writing thread: deque.extend is atomic) GET /debug/latency?arrivals=1
        now = self.clock_ms()
        self.sync_arrivals.extend((msg.hlc.pack(), now) for msg in msgs)

    def _gossip_dropped(self, reason: str) -> None:
        self.metrics.inc(
            "gossip_rpcs_dropped", reason=reason, help="outbound gossip RPCs py-libp2p dropped"
        )

    def _handler_failed(self, kind: str) -> None:
        self.metrics.inc("handler_errors", kind=kind, help="stream handlers that raised")

    # --- the API the HTTP layer uses ---

    async def submit_ops(self, ops: list[Op], *, wait_for_room: bool = True) -> list[bool]:
        """Validate, write (ack after the WriteBatch), then gossip the ops that were new.

        With ``wait_for_room=False`` a full write queue raises ``trio.WouldBlock`` at
        once instead of waiting (the HTTP API answers 503 then).
        """
        assert self.writer is not None and self.gossip is not None
        now = self.clock_ms()
        # A held message has these very bytes (its id hashes them, signature included) and
        # was checked when stored: a client resending a batch costs no signature checks.
        unheld = self.new_to_us(ops)
        for op in unheld:
            try:
                validate_op(op, now_ms=now, max_offset_ms=self.config.max_offset_ms)
            except InvalidInput as exc:
                self.metrics.inc("ops_rejected", reason=exc.reason, help="ops refused at the API")
                raise
        self._check_author_rates(unheld)
        if wait_for_room:
            new = await self.writer.submit(ops)
        else:
            new = await self.writer.wait(self.writer.submit_nowait(ops))
        fresh = [op for op, is_new in zip(ops, new, strict=True) if is_new]
        self.metrics.inc("ops_submitted", len(ops), help="ops submitted through the API")
        if fresh:
            if self.recorder is not None:
                self.recorder.record(now, fresh)
            await self.gossip.publish(fresh)
        return new

    def new_to_us(self, ops: list[Op]) -> list[Op]:
        """The ops that can change this replica: every message we do not hold yet, and every
        member op and identity (rare; their merge decides). Only these count against an
        author's rate: anyone can replay an author's old signed ops, and that must not
        spend the author's budget."""
        assert self.db is not None
        msgs = [op for op in ops if isinstance(op, MsgV1)]
        held = {m.msg_id for m, h in zip(msgs, self.db.held_messages([m.msg_id for m in msgs]),
                                         strict=True) if h}  # fmt: skip
        return [op for op in ops if not (isinstance(op, MsgV1) and op.msg_id in held)]

    def _check_author_rates(self, unheld: list[Op]) -> None:
        per_author: dict[bytes, int] = {}
        for op in unheld:
            per_author[op_author(op)] = per_author.get(op_author(op), 0) + 1
        now = trio.current_time()
        for author, count in per_author.items():
            if not self.author_limits.take(author, count, now):
                self.metrics.inc("ops_rejected", reason="rate_limited")
                raise RateLimited(
                    f"author {author.hex()} is over {self.config.author_ops_per_s:g} ops/s "
                    "(dm3 -32005 Limit exceeded)"
                )

    def _count_applied(self, ops: list[Op]) -> None:
        if not ops:
            return
        self.metrics.inc("gossip_ops_applied", len(ops), help="ops from gossip that were new here")
        now = self.clock_ms()
        for op in ops:
            self.metrics.observe_latency(now - op.hlc.physical_ms)

    def status(self) -> dict[str, Any]:
        assert self.replica is not None and self.writer is not None and self.peers is not None
        assert self.sync is not None
        domains = {}
        for domain in Domain:
            tree = self.replica.tree(domain)
            domains[domain.name.lower()] = {"root": tree.root_digest().hex(), "count": tree.count}
        return {
            "peer_id": self.peer_id,
            "listen": self.listen_addrs,
            "connected_peers": sorted(self.peers.connected()),
            "blocked_peers": sorted(self.peers.blocked),
            "domains": domains,
            "last_sync": {peer: asdict(o) for peer, o in self.sync.last_sync.items()},
            "writer": asdict(self.writer.statistics()),
            "durable": self.config.durable,
        }

    def _register_gauges(self) -> None:
        assert self.replica is not None and self.writer is not None and self.peers is not None
        replica, writer, peers = self.replica, self.writer, self.peers
        self.metrics.gauge(
            "records",
            lambda: {(("domain", d.name.lower()),): replica.tree(d).count for d in Domain},
            help="records per domain",
        )
        self.metrics.gauge(
            "connected_peers", lambda: {(): len(peers.connected())}, help="connected peers"
        )
        self.metrics.gauge(
            "write_queue", lambda: {(): writer.statistics().queued}, help="write requests waiting"
        )
