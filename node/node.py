"""The node process: RocksDB + trees, the services, libp2p gossip and sync, peers, the HTTP API.

Start-up (``Node.run``): refuse malformed addresses and taken ports (``node/startup.py``),
open ChatDb (refused if another process has it open), rebuild the Merkle trees from it, start
the libp2p host, build the services (``node/services.py``) and start the writer, then gossip,
sync, peer maintenance (discovery, the connections), the GC and the HTTP server — then
report ``started`` with the ``RunningNode``. ``stop()`` (SIGINT/SIGTERM in the CLI) stops the
network side first, lets the writer drain what it already accepted, then closes RocksDB.

``RunningNode`` is the started node: the services plus the host and the peer manager.
It answers the HTTP layer's narrow interface (``node.api.NodeApi``) and drives sync
sessions over libp2p streams.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from node.admission import AdmissionLimits
from node.agreement import LastSession, peer_rows
from node.auth import ADMIN_FILE, Authenticator, load_or_create_secrets
from node.clock import Clock
from node.commits import CommitSignal
from node.config import NodeConfig
from node.delivery import Acks
from node.dm3 import Dm3Gateway
from node.dm3 import load_or_create_key as load_dm3_key
from node.erasure import compact_erasures
from node.errors import StartupRefused
from node.intake import Submitted
from node.memory import rss_bytes
from node.metrics import Metrics
from node.notices import Notices
from node.p2p import GOSSIP_PROTOCOL_IDS, PEERS_PROTOCOL, SYNC_PROTOCOL, PeerId
from node.p2p.gossip_peers import (
    HOST_LOGGER,
    TCP_LOGGER,
    DialFailureFilter,
    StreamFailureFilter,
    skip_peers_without_gossip,
)
from node.p2p.host import Libp2pHost, Libp2pPubSub, open_host
from node.p2p.inbound import guard_inbound
from node.p2p.patches import forget_after_failed_dials
from node.p2p.streams import Libp2pStream
from node.peers import PEERS_FILE, PeerManager
from node.plants import ACK_BEFORE_WAL, skip_wal
from node.scopes import NodeScopes
from node.series import SAMPLE_INTERVAL_S, Sampler, Series
from node.services import Services, build_services
from node.startup import check_startup
from node.sync_peers import SyncCandidates
from node.verify import ProcessVerifier
from store.chat_reads import ChatReads
from store.chatdb import ChatDb
from store.errors import StoreLocked
from store.ops import Op
from store.retention import RetentionPolicy
from store.rocks import ChatDbConfig
from sync.frames import Domain
from sync.replica import DbReplica, held_shards, held_user_shards
from sync.scope import Scope, ScopeError

if TYPE_CHECKING:
    from trio_typing import TaskStatus

    from node.recorder import OpRecorder

log = logging.getLogger(__name__)

BAN_CHECK_S = 1.0  # how often expired bans are lifted
NOTICE_HELP = {
    "sync_skipped": "connected peers not synced with, by reason (node/sync_peers.py)",
    "inbound_refused": "inbound connections refused, by reason (node/p2p/inbound.py)",
    "peer_streams_failed": "streams to peers that could not be opened (node/p2p/gossip_peers.py)",
}


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self._stop = trio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self, *, task_status: TaskStatus[RunningNode] = trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.config
        clock = Clock.system(cfg.clock_offset_ms)
        check_startup(cfg)  # before anything is opened
        try:
            db = await trio.to_thread.run_sync(ChatDb, db_config(cfg))
        except StoreLocked as exc:
            raise StartupRefused(f"data directory {cfg.data} is in use by another process") from exc
        if cfg.chaos_plant == ACK_BEFORE_WAL:  # CHAOS PLANT (node/plants.py): off by default
            skip_wal(db)
        recorder: OpRecorder | None = None
        try:
            if cfg.trace_out:
                from node.recorder import OpRecorder  # loads pyarrow: only when asked for

                recorder = OpRecorder(cfg.trace_out, cfg, clock.wall_ms())
            # Refuse expired messages from the first write on; the GC keeps this current.
            db.expire_before_ms = RetentionPolicy(cfg.retention_days).age_cutoff(clock.wall_ms())
            replica = await trio.to_thread.run_sync(open_replica, db, cfg)
            async with trio.open_nursery() as writer_nursery:  # the writer outlives the network
                await self._run_network(writer_nursery, replica, clock, recorder, task_status)
        finally:
            await _close(recorder, db, cfg)

    async def _run_network(
        self,
        writer_nursery: trio.Nursery,
        replica: DbReplica,
        clock: Clock,
        recorder: OpRecorder | None,
        task_status: TaskStatus[RunningNode],
    ) -> None:
        # stop() cancels the libp2p services together with our tasks, not after them:
        # py-libp2p resets a stream whose negotiation was cut short in a shielded scope, and
        # that reset waits for the connection's write lock, which pubsub's sender holds while
        # blocked on a peer that reads slowly, until its service is cancelled. Our tasks
        # first, then the services, left a sync task parked there for good
        # (tests/node/test_shutdown.py).
        cfg = self.config
        metrics = Metrics()
        with trio.CancelScope() as network:
            async with AsyncExitStack() as stack:
                verifier = ProcessVerifier(cfg.verify_processes)
                stack.callback(verifier.close)  # closed last: after the host and its sessions
                host, pubsub = await open_host(
                    stack, cfg.key_path, cfg.listen, cfg.gossip_heartbeat_s,
                    lambda reason: _count_dropped(metrics, reason), cfg.gossip_degree,
                )  # fmt: skip
                services = build_services(
                    cfg, replica, clock=clock, pubsub=pubsub, own_peer_id=host.peer_id.to_bytes(),
                    verifier=verifier, metrics=metrics,
                    record=recorder.record if recorder is not None else None,
                )  # fmt: skip
                await writer_nursery.start(services.writer.run)
                try:
                    secret, admin_token = load_or_create_secrets(Path(cfg.data))
                    auth = Authenticator(
                        secret, host.peer_id.to_bytes(), now_ms=clock.wall_ms,
                        token_ttl_s=cfg.token_ttl_s,
                    )  # fmt: skip
                    commits = CommitSignal(replica.db.events, trio.lowlevel.current_trio_token())
                    running = RunningNode(cfg, services, host, pubsub, auth, admin_token, commits)
                    async with trio.open_nursery() as nursery:
                        await nursery.start(running.serve, self._stop.wait)
                        task_status.started(running)
                        await self._stop.wait()
                        network.cancel()
                finally:
                    services.writer.close()  # the writer drains what it accepted, then returns


class RunningNode:
    """A started node: its services, its libp2p host and pubsub, its peer manager."""

    def __init__(
        self,
        config: NodeConfig,
        services: Services,
        host: Libp2pHost,
        pubsub: Libp2pPubSub,
        auth: Authenticator,
        admin_token: str,
        commits: CommitSignal,
    ) -> None:
        self.config = config
        self.services = services
        self.auth, self.admin_token, self.commits = auth, admin_token, commits
        self.acks = Acks(services.writer)
        self.dm3 = Dm3Gateway(
            load_dm3_key(Path(config.data)), services.db, auth,
            partial(self.submit_ops, wait_for_room=False), now_ms=services.clock.wall_ms,
            max_payload=config.max_payload, retention_days=config.retention_days,
            sender_ops_per_s=config.dm3_sender_per_s,
        )  # fmt: skip
        self.p2p_host = host
        self.p2p_pubsub = pubsub
        self.peer_id: str = host.peer_id.to_base58()
        self.listen_addrs = host.listen_addrs()
        self.peers = peers = PeerManager(
            host, services.blocklist, low=config.peers_low, high=config.peers_high,
            reconnect_min_s=config.reconnect_min_s, reconnect_max_s=config.reconnect_max_s,
            sync_interval_s=config.sync_interval_s,
            sync_per_interval=config.sync_peers_per_interval,
            exchange_interval_s=config.peer_exchange_interval_s,
            candidates=SyncCandidates(SYNC_PROTOCOL, self._notices("sync_skipped")),
            metrics=services.metrics, peers_file=Path(config.data) / PEERS_FILE,
            rnd=random.Random(),
        )  # fmt: skip
        for address in config.bootstrap:
            peers.add_bootstrap(address)
        self.scopes = NodeScopes(config, services, host, pubsub, peers)
        # the libp2p edge takes the caps, not the node's config (node.config parses addresses
        # with node.p2p: no import cycle)
        limits = AdmissionLimits(max_inbound=config.inbound_max, max_per_ip=config.inbound_per_ip)
        self.inbound = guard_inbound(
            host, limits, services.blocklist, self._notices("inbound_refused")
        )
        forget_after_failed_dials(host.raw, config.max_failed_dials)
        skip_peers_without_gossip(pubsub, host, GOSSIP_PROTOCOL_IDS)
        services.metrics.gauge(
            "connected_peers", lambda: {(): len(peers.connected())}, help="connected peers"
        )
        self.series = Series()  # the web view's charts
        self._sampler = Sampler(
            services.metrics,
            lambda: {
                "written": services.writer.statistics().ops_new,
                "rss": rss_bytes() or 0,
                "peers": len(peers.connected()),
            },
        )
        services.metrics.gauge(
            "known_peers", lambda: {(("table", t),): n for t, n in peers.book.counts().items()},
            help="peers in the peer book: tried (reached) and heard (told of)",
        )  # fmt: skip

    @property
    def host(self) -> object:
        """py-libp2p's own host, opaque here: for tests and diagnostics (the node uses
        ``p2p_host``)."""
        return self.p2p_host.raw

    @property
    def pubsub(self) -> object:
        """py-libp2p's own ``Pubsub``, opaque here: for tests and diagnostics."""
        return self.p2p_pubsub.raw

    def _notices(self, metric: str) -> Notices:
        return Notices(
            self.services.metrics, metric, NOTICE_HELP[metric], now=self.services.clock.now,
            interval_s=self.config.notice_interval_s, logger=log,
        )  # fmt: skip

    async def serve(
        self,
        shutdown_trigger: Callable[[], Awaitable[None]],
        *,
        task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run gossip, sync, the peer loops, the GC and the HTTP API (until cancelled; the
        HTTP server stops gracefully once ``shutdown_trigger`` returns)."""
        stream_failures = StreamFailureFilter(self._notices("peer_streams_failed"))
        dial_failures = DialFailureFilter()
        logging.getLogger(HOST_LOGGER).addFilter(stream_failures)
        logging.getLogger(TCP_LOGGER).addFilter(dial_failures)
        try:
            await self._serve(shutdown_trigger, task_status)
        finally:
            logging.getLogger(HOST_LOGGER).removeFilter(stream_failures)
            logging.getLogger(TCP_LOGGER).removeFilter(dial_failures)

    async def _serve(
        self, shutdown_trigger: Callable[[], Awaitable[None]], task_status: TaskStatus[None]
    ) -> None:
        cfg, services = self.config, self.services
        gossip = services.gossip
        self.p2p_host.set_stream_handler(
            SYNC_PROTOCOL, "sync", self._respond_sync, self._handler_failed
        )
        self.p2p_host.set_stream_handler(
            PEERS_PROTOCOL, "peers", self.peers.answer_exchange, self._handler_failed
        )
        async with trio.open_nursery() as nursery:
            await self.scopes.start(nursery)  # gossip topics; with --scope auto, the keeper
            nursery.start_soon(gossip.publish_loop)
            nursery.start_soon(self.peers.maintain, self.listen_addrs)
            nursery.start_soon(self.peers.schedule_syncs, self._initiate_sync)
            nursery.start_soon(self._lift_bans)
            if services.gc.enabled:
                nursery.start_soon(services.gc.loop)
            nursery.start_soon(compact_erasures, services.writer, services.metrics)
            nursery.start_soon(self.acks.run)
            nursery.start_soon(self._sample)
            if cfg.http:
                from node.api import serve_http  # loads FastAPI: only when serving

                await nursery.start(serve_http, self, cfg.http_host_port, shutdown_trigger)
                log.info("admin token: %s", Path(cfg.data) / ADMIN_FILE)
            log.info("node %s listening on %s", self.peer_id, ", ".join(self.listen_addrs))
            task_status.started()

    # --- scopes (node/scopes.py) ---

    def holds_chat(self, chat: bytes) -> bool:
        return self.scopes.holds_chat(chat)

    def holders_of(self, chat: bytes) -> list[str]:
        return self.scopes.holders_of(chat)

    def indexes_user(self, user: bytes) -> bool:
        return self.scopes.indexes_user(user)

    def user_holders_of(self, user: bytes) -> list[str]:
        return self.scopes.user_holders_of(user)

    # --- sync over libp2p streams ---

    async def _initiate_sync(self, peer: PeerId) -> bool:
        """One session with ``peer``; True if it ended cleanly, moved records (either way), and
        used up its passes (a catch-up with more to come): then the next one starts at once
        (the scheduler caps such runs). The peer that feeds a node catching up follows up
        too: the node's own sessions with it are refused while this one runs. A pair that
        differs in records neither side sends nor accepts (expired) moves none: it keeps the
        normal interval."""
        sync = self.services.sync
        name = peer.to_base58()
        if name in self.services.blocklist or not sync.may_initiate(name):
            return False  # no stream opened: the peer's slot or our side is taken
        stream = await self.p2p_host.new_stream(
            peer, SYNC_PROTOCOL, self.config.sync_idle_timeout_s
        )  # PeerUnreachable
        frames = stream.frames(self.config.sync_max_frame)
        outcome = await sync.initiate(name, frames)
        return outcome.more_to_do(sync.config.max_passes)

    async def _respond_sync(self, stream: Libp2pStream) -> None:
        peer = stream.peer_id
        if peer in self.services.blocklist:
            await stream.reset()
            return
        await self.services.sync.respond(peer, stream.frames(self.config.sync_max_frame))

    def _handler_failed(self, kind: str) -> None:
        self.metrics.inc("handler_errors", kind=kind, help="stream handlers that raised")

    async def _sample(self) -> None:
        while True:
            self.series.add(self._sampler.take(self.services.clock.wall_ms()))
            await trio.sleep(SAMPLE_INTERVAL_S)

    async def _lift_bans(self) -> None:
        while True:
            for peer in self.services.judge.lift_expired_bans():
                log.info("ban of peer %s lifted", peer)
            await trio.sleep(BAN_CHECK_S)

    # --- what the HTTP layer uses (node.api.NodeApi) ---

    @property
    def db(self) -> ChatDb:
        """The store (the node's own parts; the HTTP layer gets ``reads``)."""
        return self.services.db

    @property
    def reads(self) -> ChatReads:
        return self.services.db.reads

    @property
    def metrics(self) -> Metrics:
        return self.services.metrics

    @property
    def max_payload(self) -> int:
        return self.config.max_payload

    async def submit_ops(self, ops: list[Op], *, wait_for_room: bool = True) -> Submitted:
        return await self.services.intake.submit(ops, wait_for_room=wait_for_room)

    async def settle_chat_lists(self) -> None:
        await self.services.writer.settle_chat_lists()

    async def block_peer(self, peer_id: str) -> list[str]:
        await self.peers.block(peer_id)
        return self.services.blocklist.sorted()

    def unblock_peer(self, peer_id: str) -> list[str]:
        self.peers.unblock(peer_id)
        return self.services.blocklist.sorted()

    def arrivals(self) -> dict[str, list[tuple[int, int]]]:
        return {
            "arrivals": list(self.services.gossip.arrivals),
            "sync_arrivals": list(self.services.sync_arrivals),
        }

    def network(self) -> dict[str, Any]:
        """Our roots, and per peer we know the roots it last agreed on with us."""
        services = self.services
        sync, now = services.sync, services.clock.wall_ms()
        sessions = {p: LastSession(o.result, o.ended_ms) for p, o in sync.last_sync.items()}
        ours = sync.roots()
        rows = peer_rows(
            ours, sync.agreement, set(self.peers.connected()), set(services.blocklist.sorted()),
            sessions, now,
        )  # fmt: skip
        return {"peer_id": self.peer_id, "now_ms": now, "roots": ours, "peers": rows}

    def status(self) -> dict[str, Any]:
        services = self.services
        roots = services.sync.roots()
        domains = {
            d.name.lower(): {"root": roots[d.name.lower()], "count": services.replica.tree(d).count}
            for d in Domain
        }
        return {
            "peer_id": self.peer_id,
            "listen": self.listen_addrs,
            "connected_peers": sorted(self.peers.connected()),
            "blocked_peers": services.blocklist.sorted(),
            "domains": domains,
            "last_sync": {peer: asdict(o) for peer, o in services.sync.last_sync.items()},
            "writer": asdict(services.writer.statistics()),
            "durable": self.config.durable,
        }


def db_config(cfg: NodeConfig) -> ChatDbConfig:
    """The store's configuration from the node's."""
    return ChatDbConfig(
        path=cfg.data,
        write_sync=cfg.durable,
        block_cache_mb=cfg.db_block_cache_mb,
        memtable_mb=cfg.db_memtable_mb,
        compression=cfg.db_compression,
        max_payload=cfg.max_payload,
        max_offset_ms=cfg.max_offset_ms,
    )


def open_replica(db: ChatDb, cfg: NodeConfig) -> DbReplica:
    """The store with its trees, holding the node's scope: ``StartupRefused`` if the store
    holds chats outside it (narrowing a store is not built: SYNC.md, "Scopes"). What the
    store holds stays held until released (sync/serving.py): with ``--scope auto`` its chat
    shards, and with any scope the user shards it indexed (its writes widened them)."""
    scope = cfg.scope
    if not scope.is_full:
        num = scope.num_shards
        shards = frozenset(scope.shards or ())
        if cfg.scope_auto:
            shards |= held_shards(db, num)
        scope = Scope(shards, num, held_user_shards(db, num))
    try:
        return DbReplica(db, scope=scope)
    except ScopeError as exc:
        raise StartupRefused(f"data directory {cfg.data}: {exc}") from exc


def _count_dropped(metrics: Metrics, reason: str) -> None:
    metrics.inc("gossip_rpcs_dropped", reason=reason, help="outbound gossip RPCs py-libp2p dropped")


async def _close(recorder: OpRecorder | None, db: ChatDb, cfg: NodeConfig) -> None:
    """Close the trace, then RocksDB; neither may keep the other from closing."""
    if recorder is not None:
        try:
            recorder.close()
        except Exception as exc:  # shutdown goes on (e.g. a full disk): RocksDB must close
            log.error("closing the trace %s failed: %s", cfg.trace_out, exc)
    try:
        await trio.to_thread.run_sync(db.close)
        log.info("node stopped, RocksDB closed")
    except Exception as exc:  # shutdown must finish (e.g. no space to flush)
        log.error("closing RocksDB failed (%s); the WAL keeps the writes", exc)
