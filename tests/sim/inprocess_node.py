"""One node of the in-process replay: the node's own services, built by ``node.services.build_services``.

What runs is the node's code, minus libp2p: a ``ChatDb`` (RocksDB in a directory
of its own) seen through ``DbReplica``, and the services a node builds over it — the
``DbWriter`` task, ``GossipService``'s validator and receive loop (fed by a memory
channel standing in for the GossipSub subscription; a stand-in ``Pubsub`` that never
publishes: the replay delivers gossip itself), a ``SyncService`` for both ends of
sessions (with the node's threaded signature check), and ``RetentionGc`` cycles.
Settings come from ``NodeConfig`` as the node reads them, minus what the replay does not
model (per-author and per-peer rates, penalties: switched off). The node's clock is a
``node.clock.Clock`` on the trio clock plus the node's offset (``skew``,
``far_future``); an ``HlcClock`` follows every op the node takes in, as the simulator's
does, to report honest clocks pushed ahead.

A crash cancels the node's tasks and closes RocksDB: what the writer had
acknowledged survives (RocksDB's WAL), as it does when the process dies; a
restart reopens the store, rebuilds the trees from it and runs one GC cycle,
as ``Node.run`` and ``RetentionGc.loop`` do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from node.clock import Clock
from node.config import NodeConfig
from node.metrics import Metrics
from node.services import Services, build_services
from node.syncer import SyncService
from node.verify import ProcessVerifier
from store.chatdb import ChatDb
from store.hlc import HlcClock
from store.kinds import ChatView
from store.ops import Op
from store.retention import RetentionPolicy
from store.rocks import ChatDbConfig
from sync.frames import Domain
from sync.replica import DbReplica

if TYPE_CHECKING:
    from collections.abc import Callable

    from trio_typing import TaskStatus

TOPIC = "chatsync-ops"
SUBSCRIPTION_SLOTS = 32  # py-libp2p's subscription channel holds 32 messages


@dataclass(frozen=True)
class GossipMessage:
    """What GossipService reads of a py-libp2p pubsub message."""

    from_id: bytes
    seqno: bytes
    data: bytes


@dataclass(frozen=True)
class PeerRef:
    """A forwarder as the validator sees it (``to_bytes()`` of a libp2p peer id)."""

    peer_id: bytes

    def to_bytes(self) -> bytes:
        return self.peer_id


class Subscription:
    """The receiving end of a pubsub subscription: ``get()`` the next message."""

    def __init__(self, channel: trio.MemoryReceiveChannel[GossipMessage]) -> None:
        self._channel = channel

    async def get(self) -> GossipMessage:
        return await self._channel.receive()


class _Acks:
    """Counts messages handed to the receive loop and the writes it reported back."""

    def __init__(self) -> None:
        self.expected = 0
        self.done = 0
        self._event = trio.Event()

    def ack(self) -> None:
        self.done += 1
        self._event.set()

    async def wait(self) -> None:
        while self.done < self.expected:
            self._event = trio.Event()
            await self._event.wait()


class NoPubsub:
    """The stand-in for py-libp2p's Pubsub: the replay delivers gossip itself (each op one
    message, as in the Spark replay); the node's publisher is not run."""

    @property
    def peer_queues(self) -> dict[bytes, list[object]]:
        return {}

    async def publish(self, topic_id: str, data: bytes) -> None:
        raise AssertionError("the in-process replay delivers gossip itself")


def peer_id(index: int) -> bytes:
    return f"node-{index}".encode()


def unlimited(config: NodeConfig) -> NodeConfig:
    """``config`` without what the replay does not model: rate limits and penalties."""
    inf = math.inf
    return replace(
        config, author_ops_per_s=inf, author_ops_burst=inf, peer_sync_frames_per_s=inf,
        peer_sync_bytes_per_s=inf, penalty_threshold=inf, gossip_peer_waste_per_s=inf,
        gossip_peer_waste_bytes_per_s=inf,
    )  # fmt: skip


class InProcessNode:
    def __init__(
        self,
        index: int,
        data: Path,
        config: NodeConfig,
        now_ms: Callable[[], int],
        *,
        retention_ms: int,
        gc_grain_ms: int,
    ) -> None:
        self.index = index
        self.name = f"node{index}"
        self.data = data
        self.config = unlimited(config)
        self.policy = RetentionPolicy(config.retention_days)
        self.retention_ms = retention_ms
        self.gc_grain_ms = gc_grain_ms
        self._true_ms = now_ms
        self._node_clock: Clock | None = None  # made in trio: Clock(epoch of now_ms)
        self._offset_ms = 0
        self.clock = HlcClock(max_offset_ms=config.max_offset_ms)
        self.metrics = Metrics()
        self.alive = False
        self.db: ChatDb | None = None
        self.services: Services | None = None  # while the node is up
        self._verifier: ProcessVerifier | None = None
        self._inbox: trio.MemorySendChannel[GossipMessage] | None = None
        self._acks = _Acks()
        self._scope = trio.CancelScope()
        self._stopped = trio.Event()

    @property
    def offset_ms(self) -> int:
        """The node's clock offset from true time (``skew``, ``far_future``)."""
        return self._offset_ms

    @offset_ms.setter
    def offset_ms(self, value: int) -> None:
        self._offset_ms = value
        if self._node_clock is not None:
            self._node_clock.offset_ms = value

    def node_clock(self) -> Clock:
        """The node's ``Clock``: trio's, its wall time the replay's true time plus the offset."""
        if self._node_clock is None:
            epoch_ms = self._true_ms() - round(trio.current_time() * 1000)
            self._node_clock = Clock(epoch_ms, self._offset_ms)
        return self._node_clock

    def clock_ms(self) -> int:
        """The node's wall clock: true (trio) time plus its offset."""
        return self.node_clock().wall_ms()

    @property
    def sync(self) -> SyncService | None:
        return self.services.sync if self.services is not None else None

    # --- lifecycle ---

    async def start(self, nursery: trio.Nursery) -> None:
        """Open the store and build the services, as ``Node.run`` does."""
        cfg = self.config
        self.db = ChatDb(
            ChatDbConfig(
                path=str(self.data),
                block_cache_mb=8,
                memtable_mb=8,
                parallelism=1,
                write_sync=cfg.durable,
                max_payload=cfg.max_payload,
                max_offset_ms=cfg.max_offset_ms,
            )
        )
        self.db.expire_before_ms = self.policy.age_cutoff(self.clock_ms())
        # in the calling thread: the same answers (tests/node/test_verify.py), and no worker
        # processes for each of the replay's nodes
        self._verifier = ProcessVerifier(0)
        self.services = build_services(
            cfg,
            DbReplica(self.db),
            clock=self.node_clock(),
            pubsub=NoPubsub(),
            own_peer_id=peer_id(self.index),
            verifier=self._verifier,
            topic=TOPIC,
            metrics=self.metrics,
            on_gossip_applied=self._applied,
        )
        self._acks = _Acks()
        self._inbox, receive = trio.open_memory_channel[GossipMessage](SUBSCRIPTION_SLOTS)
        self._scope, self._stopped = trio.CancelScope(), trio.Event()
        await nursery.start(self._serve, self.services, Subscription(receive))
        self.alive = True
        await self.run_gc()  # the GC loop's first cycle: expire what aged while it was down

    async def _serve(
        self,
        services: Services,
        subscription: Subscription,
        *,
        task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            with self._scope:
                async with trio.open_nursery() as tasks:
                    await tasks.start(services.writer.run)
                    tasks.start_soon(services.gossip.receive_loop, subscription)
                    task_status.started()
        finally:
            self._stopped.set()

    async def crash(self) -> None:
        """The process dies: tasks gone, RocksDB left with what was written (its WAL)."""
        self._scope.cancel()
        await self._stopped.wait()
        self.alive = False
        self.close()

    async def stop(self) -> None:
        if self.alive:
            await self.crash()

    def close(self) -> None:
        """Close RocksDB and the verifier's threads (idempotent); the tasks must be gone."""
        self.services = None
        if self._verifier is not None:
            self._verifier.close()
            self._verifier = None
        if self.db is not None:
            self.db.close()
            self.db = None

    def _up(self) -> Services:
        assert self.services is not None, f"{self.name} is down"
        return self.services

    # --- ingress ---

    async def write(self, op: Op) -> bool:
        """A validated op from a client: written, acknowledged; True if it is to be gossiped:
        new, or a message waiting for its member op (another node may hold the op), as the
        node's intake (``OpIntake.submit``) does."""
        writer = self._up().writer
        request = await writer.enqueue([op])
        new = await writer.wait(request)
        self.clock.update(op.hlc, self.clock_ms())
        return new[0] or request.waiting[0]

    async def deliver(self, msg: GossipMessage, forwarder: bytes) -> bool:
        """A gossip message, as the router hands it over: validated, then through the
        receive loop to the writer. Waits until the write is acknowledged; False if refused.

        (A failed write, which the receive loop only logs, would leave this waiting: RocksDB
        in a local directory with no free-disk minimum does not fail a write.)"""
        assert self._inbox is not None
        if not self._up().gossip.validate(PeerRef(forwarder), msg):
            return False
        self._acks.expected += 1
        await self._inbox.send(msg)
        await self._acks.wait()
        return True

    def _applied(self, fresh: list[Op]) -> None:
        """The gossip service's on_applied, once per message after its write: follow the stamps."""
        for op in fresh:
            self.clock.update(op.hlc, self.clock_ms())
        self._acks.ack()

    # --- retention ---

    async def run_gc(self) -> int:
        """One GC cycle at the node's clock; returns the messages it expired.

        The node's cutoff is exactly ``now - retention``; the trace's GC runs on a grain
        (SIM.md, "The replay", retention). The cycle is given the time at which the node's
        own cutoff is the grain-rounded one, so both replays collect the same messages.
        """
        now = self.clock_ms()
        cutoff = self.policy.age_cutoff(now)
        if cutoff is not None:
            raw = now - self.retention_ms
            now = raw - raw % self.gc_grain_ms + (now - cutoff)  # + the node's retention span
        cycle = await self._up().gc.cycle(now)
        return cycle.messages_expired

    # --- state ---

    def view(self, chat: bytes) -> ChatView:
        """The chat as the node's readers see it (DbReplica.view: the store's fold)."""
        return self._up().replica.view(chat)

    def visible_ids(self, chats: set[bytes]) -> set[bytes]:
        """The messages of these chats that the node's readers are shown."""
        replica = self._up().replica
        return {i for chat in chats for i in replica.visible_ids(chat)}

    def roots(self) -> dict[Domain, tuple[int, int]]:
        replica = self._up().replica
        out = {}
        for domain in Domain:
            xor, count = replica.tree(domain).root()
            out[domain] = (int.from_bytes(xor, "big"), count)
        return out
