"""One node of the in-process replay: the node's own services, wired as ``node/node.py`` wires them.

What runs is the node's code, minus libp2p: a ``ChatDb`` (RocksDB in a directory
of its own) seen through ``DbReplica``, the ``DbWriter`` task, ``GossipService``'s
validator and receive loop (fed by a memory channel standing in for the
GossipSub subscription), a ``SyncService`` for both ends of sessions (with the
node's threaded signature check), and ``run_gc_cycle`` for retention. Settings come from ``NodeConfig`` as the node
reads them. The node's clock is the trio clock plus the node's offset (``skew``,
``far_future``); an ``HlcClock`` follows every op the node takes in, as the
simulator's does, to report honest clocks pushed ahead.

A crash cancels the node's tasks and closes RocksDB: what the writer had
acknowledged survives (RocksDB's WAL), as it does when the process dies; a
restart reopens the store, rebuilds the trees from it and runs one GC cycle,
as ``Node.run`` and ``gc_loop`` do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from node.config import NodeConfig
from node.gc import run_gc_cycle
from node.gossip import GossipService
from node.metrics import Metrics
from node.syncer import SyncService
from node.verify import ParallelVerifier
from node.writer import DbWriter
from store.chatdb import ChatDb
from store.hlc import HlcClock
from store.ops import Op
from store.retention import RetentionPolicy
from store.rocks import ChatDbConfig
from sync.frames import Domain
from sync.protocol import SyncConfig
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


def peer_id(index: int) -> bytes:
    return f"node-{index}".encode()


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
        self.config = config
        self.policy = RetentionPolicy(config.retention_days)
        self.retention_ms = retention_ms
        self.gc_grain_ms = gc_grain_ms
        self._true_ms = now_ms
        self.offset_ms = 0
        self.clock = HlcClock(max_offset_ms=config.max_offset_ms)
        self.metrics = Metrics()
        self.alive = False
        self.db: ChatDb | None = None
        self.replica: DbReplica | None = None
        self.writer: DbWriter | None = None
        self.sync: SyncService | None = None
        self.gossip: GossipService | None = None
        self._verifier: ParallelVerifier | None = None
        self._inbox: trio.MemorySendChannel[GossipMessage] | None = None
        self._acks = _Acks()
        self._scope = trio.CancelScope()
        self._stopped = trio.Event()

    def clock_ms(self) -> int:
        """The node's wall clock: true (trio) time plus its offset."""
        return self._true_ms() + self.offset_ms

    # --- lifecycle ---

    async def start(self, nursery: trio.Nursery) -> None:
        """Open the store and start the services, as ``Node.run`` does."""
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
        self.replica = DbReplica(self.db)  # trees rebuilt from RocksDB
        self._verifier = ParallelVerifier(cfg.verify_threads)
        self.writer = DbWriter(
            self.db, self.replica, trio.Lock(), self.metrics,
            queue_size=cfg.write_queue, batch_max=cfg.write_batch_max,
        )  # fmt: skip
        self.sync = SyncService(
            self.replica, self.writer.db_lock, self.metrics,
            config=SyncConfig(
                max_frame=cfg.sync_max_frame,
                max_payload=cfg.max_payload,
                authenticate=True,
                max_offset_ms=cfg.max_offset_ms,
                verify_messages=self._verifier,
            ),
            read_timeout_s=cfg.sync_read_timeout_s,  # no spurious timeouts: inprocess.py
            clock_ms=self.clock_ms,
        )  # fmt: skip
        self._acks = _Acks()
        self.gossip = GossipService(
            None, TOPIC, self.writer, self.metrics,
            own_peer_id=peer_id(self.index), clock_ms=self.clock_ms,
            max_offset_ms=cfg.max_offset_ms, max_payload=cfg.max_payload,
            max_bytes=cfg.gossip_max_bytes, batch_ops=cfg.gossip_batch_ops,
            batch_delay_ms=cfg.gossip_batch_delay_ms, on_applied=self._applied,
        )  # fmt: skip
        self._inbox, receive = trio.open_memory_channel[GossipMessage](SUBSCRIPTION_SLOTS)
        self._scope, self._stopped = trio.CancelScope(), trio.Event()
        await nursery.start(self._serve, Subscription(receive))
        self.alive = True
        await self.run_gc()  # gc_loop's first cycle: expire what aged while the node was down

    async def _serve(
        self,
        subscription: Subscription,
        *,
        task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        assert self.writer is not None and self.gossip is not None
        try:
            with self._scope:
                async with trio.open_nursery() as services:
                    await services.start(self.writer.run)
                    services.start_soon(self.gossip.receive_loop, subscription)
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
        if self._verifier is not None:
            self._verifier.close()
            self._verifier = None
        if self.db is not None:
            self.db.close()
            self.db = None

    # --- ingress ---

    async def write(self, op: Op) -> bool:
        """A validated op from a client: written, acknowledged; True if it was new."""
        assert self.writer is not None
        new = await self.writer.submit([op])
        self.clock.update(op.hlc, self.clock_ms())
        return new[0]

    async def deliver(self, msg: GossipMessage, forwarder: bytes) -> bool:
        """A gossip message, as the router hands it over: validated, then through the
        receive loop to the writer. Waits until the write is acknowledged; False if refused.

        (A failed write, which the receive loop only logs, would leave this waiting: RocksDB
        in a local directory with no free-disk minimum does not fail a write.)"""
        assert self.gossip is not None and self._inbox is not None
        if not self.gossip.validate(PeerRef(forwarder), msg):
            return False
        self._acks.expected += 1
        await self._inbox.send(msg)
        await self._acks.wait()
        return True

    def _applied(self, fresh: list[Op]) -> None:
        """GossipService.on_applied, once per message after its write: follow the stamps."""
        for op in fresh:
            self.clock.update(op.hlc, self.clock_ms())
        self._acks.ack()

    # --- retention ---

    async def run_gc(self) -> int:
        """One ``run_gc_cycle`` at the node's clock; returns the messages it expired.

        The node's cutoff is exactly ``now - retention``; the trace's GC runs on a grain
        (SIM.md, "The replay", retention). The cycle is given the time at which the node's
        own cutoff is the grain-rounded one, so both replays collect the same messages.
        """
        assert self.db is not None and self.replica is not None and self.writer is not None
        now = self.clock_ms()
        cutoff = self.policy.age_cutoff(now)
        if cutoff is not None:
            raw = now - self.retention_ms
            now = raw - raw % self.gc_grain_ms + (now - cutoff)  # + the node's retention span
        cycle = await run_gc_cycle(
            self.db, self.replica, self.writer.db_lock, self.policy, now,
            metrics=self.metrics, sync=self.sync,
        )  # fmt: skip
        return cycle.messages_expired

    # --- state ---

    def roots(self) -> dict[Domain, tuple[int, int]]:
        assert self.replica is not None
        out = {}
        for domain in Domain:
            xor, count = self.replica.tree(domain).root()
            out[domain] = (int.from_bytes(xor, "big"), count)
        return out
