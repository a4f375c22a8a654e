"""A trace replayed through the node's own code, in one process: the differential test's other half.

``chatsync sim run`` replays a trace through ``store`` and ``sync`` on Spark, with
its own replica (``sim/replica.py``), gossip model and retention model. This
replay runs the same trace through ``node/`` instead — one ``InProcessNode`` per
trace node (``tests/sim/inprocess_node.py``: RocksDB, the writer task, the gossip
validator and receive loop, ``SyncService``, ``run_gc_cycle``) — under trio with
``MockClock(autojump_threshold=0)``, so minutes of trace take seconds. For small
traces both must end with the same roots (``tests/sim/test_differential.py``).

The schedule is the Spark replay's (``sim.schedule``, which ``sim/engine.py``
walks too), with the same hashed draws (``sim.network``): ops at their origin
(``validate_op`` on the origin's clock, then the writer; gossiped if new or waiting
for its member op, as the intake does),
gossip deliveries with their drop,
duplication, delay and jitter and cut by partitions, anti-entropy every
``anti_entropy_ms`` with the same hashed peer over ``memory_stream_pair`` in
``TrioFrames`` (a session's stream dies after the same hashed number of frames),
the trace's GC runs, crashes and restarts, clock offsets, then heal, quiescence
and a final GC at ``end_ms``.

**Time.** The driver handles one event at a time — a write, a delivery, a
session, a GC cycle — and waits for it to finish. Node code runs RocksDB work
in worker threads (``trio.to_thread``); while one runs, every task is blocked,
and an autojump clock would leap to the nearest deadline — a session's read
timeout — and end the session spuriously (and spin the event loop, competing
with the thread for the GIL). So the clock autojumps only while the driver
sleeps to its next event (``autojump_threshold = 0``) and not while an event is
handled (``inf``): virtual time stands still while node code runs, the node's
own read timeouts stay as it configures them, and a run is reproducible.

**Not modelled**: libp2p itself (GossipSub's mesh and its seen-cache — a
duplicate reaches the validator again — and yamux streams); the publisher's
batching (each op is one gossip message, as in the Spark replay); per-author
and per-peer rate limits and peer penalties; ``gc_loop``'s
interval (the trace's GC events run instead). A crash loses nothing the writer
acknowledged (RocksDB's WAL, as when the process dies), where the Spark replay
also rolls back received writes not yet flushed; anti-entropy repairs both.

It lives under ``tests/`` because only the differential test uses it; the
simulator (``sim/``) never imports ``node/``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import trio
import trio.testing

from node.config import NodeConfig
from node.framing import FrameStream, StreamClosed, TrioFrames
from sim.engine import view_digest_of
from sim.schedule import (
    REPLAY_COLUMNS,
    Delivery,
    HealAll,
    Round,
    Schedule,
    Session,
    TraceEvent,
    op_key,
)
from sim.shards import views_digest
from store import trace as tr
from store.errors import InvalidInput
from store.ingress import validate_op
from store.ops import MembershipOp, Op, decode_op, encode_ops
from store.records import MsgV1
from store.retention import DAY_MS
from sync.frames import Domain
from sync.merkle import MerkleTree

from inprocess_node import GossipMessage, InProcessNode, peer_id


@dataclass
class NodeResult:
    node: int
    alive: bool
    honest: bool  # never had a far-future clock
    roots: dict[str, str]  # domain -> "xor:count", as the Spark report writes roots
    clock_ahead_ms: int
    visible: str = ""  # the messages its readers are shown, as one "xor:count"
    views: str = ""  # every chat's view (MESSAGES.md) as one digest (sim.shards.views_digest)


@dataclass
class InProcessResult:
    nodes: list[NodeResult]
    stats: dict[str, int] = field(default_factory=dict)
    abort_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def checked(self) -> list[NodeResult]:
        """Honest live nodes: the ones the check covers (SIM.md, "The oracle and the check")."""
        return [n for n in self.nodes if n.alive and n.honest]

    def distinct_roots(self, domain: str) -> set[str]:
        return {n.roots[domain] for n in self.checked}

    @property
    def converged(self) -> bool:
        return bool(self.checked) and all(
            len(self.distinct_roots(d.name.lower())) == 1 for d in Domain
        )


def root_text(xor: int, count: int) -> str:
    return f"{xor:064x}:{count}"


@dataclass(frozen=True)
class _TraceOp:
    op: Op
    envelope: bytes  # what its origin gossips
    key: int  # its gossip fates' key (``sim.schedule.op_key``)


class _CutConnection:
    """Frames in both directions of one session; the connection dies after ``limit`` of them."""

    def __init__(self, limit: int | None) -> None:
        self.left = limit

    def take(self) -> bool:
        if self.left is None:
            return True
        self.left -= 1
        return self.left >= 0


class _CutFrames:
    """A ``FrameStream`` end whose connection can be cut: the stream closes under both ends."""

    def __init__(self, inner: TrioFrames, connection: _CutConnection) -> None:
        self.inner = inner
        self.connection = connection

    async def read_frame(self) -> bytes:
        return await self.inner.read_frame()

    async def read_length(self) -> int:
        return await self.inner.read_length()

    async def read_body(self, size: int) -> bytes:
        return await self.inner.read_body(size)

    async def write_frame(self, data: bytes) -> None:
        if not self.connection.take():
            await self.inner.aclose()  # the peer reads "end of stream"
            raise StreamClosed("connection cut")
        await self.inner.write_frame(data)

    async def aclose(self) -> None:
        await self.inner.aclose()


class InProcessReplay:
    def __init__(self, trace_path: str | Path, workdir: str | Path) -> None:
        trace = tr.read_trace(trace_path, REPLAY_COLUMNS)
        self.header = h = trace.header
        self.schedule = Schedule(trace)
        self.ops = _decode_ops(trace)
        self.chats = {t.op.chat_id for t in self.ops.values() if isinstance(t.op, MsgV1)}
        # the oracle has a view of every chat with member ops (empty when nothing is shown)
        self.group_chats = {
            t.op.chat_id for t in self.ops.values() if isinstance(t.op, MembershipOp)
        }
        self.n = h.nodes
        config = NodeConfig(max_offset_ms=h.max_offset_ms, retention_days=h.retention_ms / DAY_MS)
        self.max_frame = config.sync_max_frame
        self.nodes = [
            InProcessNode(
                i,
                Path(workdir) / f"node{i}",
                config,
                self.now_ms,
                retention_ms=h.retention_ms,
                gc_grain_ms=h.gc_grain_ms,
            )
            for i in range(self.n)
        ]
        far_future = self.schedule.far_future_nodes()
        self.honest = [i not in far_future for i in range(self.n)]
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "ops_applied", "ops_rejected_at_origin", "ops_at_down_node", "gossip_sent",
                "gossip_dropped", "gossip_duplicated", "gossip_to_down_node", "gossip_rejected",
                "gossip_accepted", "sessions", "sessions_converged", "sessions_unreachable",
                "sessions_failed", "sync_records_applied", "gc_runs", "gc_messages_expired",
                "crashes",
            ),
            0,
        )  # fmt: skip
        self.abort_reasons: dict[str, int] = {}
        self.clock = trio.testing.MockClock(autojump_threshold=0)

    # --- time ---

    def now_ms(self) -> int:
        """True virtual time: the trio clock counts seconds since the trace's start."""
        return self.header.start_ms + round(trio.current_time() * 1000)

    async def _sleep_until(self, t_ms: int) -> None:
        """Jump to the next event; time stands still again while it is handled (see above)."""
        self.clock.autojump_threshold = 0
        await trio.sleep_until((t_ms - self.header.start_ms) / 1000)
        self.clock.autojump_threshold = math.inf

    # --- the run ---

    async def run(self) -> InProcessResult:
        h = self.header
        self.clock.autojump_threshold = math.inf
        try:
            async with trio.open_nursery() as nursery:
                for node in self.nodes:
                    await node.start(nursery)
                await self._loop(nursery)
                for node in self.nodes:  # the final GC, then the check
                    if node.alive:
                        await self._gc(node.index)
                result = self._result()
                for node in self.nodes:
                    await node.stop()
        finally:
            for node in self.nodes:
                node.close()
        assert self.now_ms() == h.end_ms
        return result

    async def _loop(self, nursery: trio.Nursery) -> None:
        for step in self.schedule.steps():
            await self._sleep_until(step.t_ms)
            match step:
                case Delivery():
                    await self._deliver(step)
                case TraceEvent():
                    await self._event(step, nursery)
                case Round():
                    await self._round(step.number)
                case HealAll():
                    await self._heal(nursery)
        await self._sleep_until(self.header.end_ms)

    async def _event(self, event: TraceEvent, nursery: trio.Nursery) -> None:
        """An op at its origin, or a node's fault (the schedule handles the network's)."""
        node, args = event.node, event.args
        if args is None:
            await self._local_op(event)
        elif event.kind == tr.CRASH:
            if self.nodes[node].alive:
                await self.nodes[node].crash()
                self.stats["crashes"] += 1
        elif event.kind == tr.RESTART:
            await self._restart(node, nursery)
        elif event.kind in (tr.SKEW, tr.FAR_FUTURE):
            self.nodes[node].offset_ms = int(args["offset_ms"] or 0)
        elif event.kind == tr.GC:
            await self._gc(node)

    # --- ops and gossip ---

    async def _local_op(self, event: TraceEvent) -> None:
        """A client's op at its origin: ``Node.submit_ops`` (validate, write, gossip if new or waiting)."""
        node, traced = self.nodes[event.node], self.ops[event.row]
        if not node.alive:
            self.stats["ops_at_down_node"] += 1
            return
        try:
            validate_op(traced.op, now_ms=node.clock_ms(), max_offset_ms=node.config.max_offset_ms)
        except InvalidInput:
            self.stats["ops_rejected_at_origin"] += 1
            return
        self.stats["ops_applied"] += 1
        if not await node.write(traced.op):
            return
        fanout = self.schedule.publish(traced.key, event.row, event.node, event.t_ms)
        self.stats["gossip_sent"] += fanout.sent
        self.stats["gossip_dropped"] += fanout.dropped
        self.stats["gossip_duplicated"] += fanout.duplicated

    async def _deliver(self, delivery: Delivery) -> None:
        node = self.nodes[delivery.receiver]
        if not node.alive:
            self.stats["gossip_to_down_node"] += 1
            return
        origin = peer_id(self.schedule.nodes[delivery.row])
        envelope = self.ops[delivery.row].envelope
        msg = GossipMessage(origin, delivery.seq.to_bytes(8, "big"), envelope)
        accepted = await node.deliver(msg, forwarder=origin)
        self.stats["gossip_accepted" if accepted else "gossip_rejected"] += 1

    # --- anti-entropy ---

    async def _round(self, round_no: int) -> None:
        alive = [node.alive for node in self.nodes]
        sessions, unreachable = self.schedule.sessions(round_no, alive)
        self.stats["sessions_unreachable"] += unreachable
        for session in sessions:
            await self._session(session)

    async def _session(self, session: Session) -> None:
        """``initiate`` on one node, ``respond`` on its peer, over one in-memory stream."""
        initiator, responder = self.nodes[session.initiator], self.nodes[session.responder]
        assert initiator.sync is not None and responder.sync is not None
        left, right = trio.testing.memory_stream_pair()
        connection = _CutConnection(session.cut_after)
        ends: tuple[FrameStream, FrameStream] = (
            _CutFrames(TrioFrames(left, self.max_frame), connection),
            _CutFrames(TrioFrames(right, self.max_frame), connection),
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(responder.sync.respond, initiator.name, ends[1])
            outcome = await initiator.sync.initiate(responder.name, ends[0])
        self.stats["sessions"] += 1
        self.stats["sessions_converged"] += bool(outcome.converged)
        self.stats["sync_records_applied"] += outcome.records_applied
        if outcome.error is not None:
            self.stats["sessions_failed"] += 1
            self.abort_reasons[outcome.error] = self.abort_reasons.get(outcome.error, 0) + 1

    # --- faults ---

    async def _restart(self, node: int, nursery: trio.Nursery) -> None:
        if not self.nodes[node].alive:
            await self.nodes[node].start(nursery)  # start() runs the start-up GC cycle
            self.stats["gc_runs"] += 1

    async def _gc(self, node: int) -> None:
        if self.nodes[node].alive:
            self.stats["gc_messages_expired"] += await self.nodes[node].run_gc()
            self.stats["gc_runs"] += 1

    async def _heal(self, nursery: trio.Nursery) -> None:
        """The faults are over (the schedule healed the network): clocks right, every node up."""
        for node in self.nodes:
            node.offset_ms = 0
        for i in range(self.n):
            await self._restart(i, nursery)

    # --- the result ---

    def _result(self) -> InProcessResult:
        rows = []
        for node in self.nodes:
            roots, visible, views = {}, "", ""
            if node.alive:
                roots = {d.name.lower(): root_text(*r) for d, r in node.roots().items()}
                xor, count = MerkleTree.from_ids(node.visible_ids(self.chats)).root()
                visible = root_text(int.from_bytes(xor, "big"), count)
                views = views_digest({c: view_digest_of(node.view(c)) for c in self.group_chats})
            rows.append(
                NodeResult(
                    node=node.index,
                    alive=node.alive,
                    honest=self.honest[node.index],
                    roots=roots,
                    clock_ahead_ms=node.clock.last.physical_ms - self.header.end_ms,
                    visible=visible,
                    views=views,
                )
            )
        stats = dict(self.stats)
        return InProcessResult(rows, stats, self.abort_reasons)


def _decode_ops(trace: tr.Trace) -> dict[int, _TraceOp]:
    """Every op of the trace, by trace row."""
    rows = trace.table.select(["kind", "op", "op_id"]).to_pylist()
    seed = trace.header.seed
    ops = {}
    for i, row in enumerate(rows):
        if row["kind"] in tr.OP_CODES:
            op = decode_op(tr.OP_CODES[row["kind"]], row["op"])
            ops[i] = _TraceOp(op, encode_ops([op]), op_key(seed, row["op_id"]))
    return ops


def run_inprocess(trace_path: str | Path, workdir: str | Path) -> InProcessResult:
    """Replay ``trace_path`` through the node's code (RocksDB directories under ``workdir``)."""
    replay = InProcessReplay(trace_path, workdir)
    return trio.run(replay.run, clock=replay.clock)
