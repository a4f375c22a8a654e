"""A trace replayed through the node's own code, in one process: the differential test's other half.

``chatsync sim run`` replays a trace through ``store`` and ``sync`` on Spark, with
its own replica (``sim/replica.py``), gossip model and retention model. This
replay runs the same trace through ``node/`` instead — one ``InProcessNode`` per
trace node (``tests/sim/inprocess_node.py``: RocksDB, the writer task, the gossip
validator and receive loop, ``SyncService``, ``run_gc_cycle``) — under trio with
``MockClock(autojump_threshold=0)``, so minutes of trace take seconds. For small
traces both must end with the same roots (``tests/sim/test_differential.py``).

The schedule is the Spark replay's (``sim/engine.py``), from the same hashed
draws (``sim.network``): ops at their origin (``validate_op`` on the origin's
clock, then the writer; gossiped if new), gossip deliveries with their drop,
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

import heapq
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing

from node.config import NodeConfig
from node.framing import FrameStream, StreamClosed, TrioFrames
from sim.network import NetParams, Network
from sim.rand import derive
from store import trace as tr
from store.errors import InvalidInput
from store.ops import decode_op, encode_ops, validate_op
from store.retention import DAY_MS
from sync.frames import Domain

from inprocess_node import GossipMessage, InProcessNode, peer_id

_FAULT_COLUMNS = ("group", "drop", "dup", "delay_ms", "jitter_ms", "offset_ms")


@dataclass
class NodeResult:
    node: int
    alive: bool
    honest: bool  # never had a far-future clock
    roots: dict[str, str]  # domain -> "xor:count", as the Spark report writes roots
    clock_ahead_ms: int


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


@dataclass
class _Event:
    t_ms: int
    node: int
    kind: str
    op: Any = None  # decoded op (op kinds)
    data: bytes = b""  # the gossip envelope of the op
    op_key: int = 0  # the per-op key of the gossip fates, as the Spark replay derives it
    args: dict[str, Any] = field(default_factory=dict)  # fault arguments


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

    async def write_frame(self, data: bytes) -> None:
        if not self.connection.take():
            await self.inner.aclose()  # the peer reads "end of stream"
            raise StreamClosed("connection cut")
        await self.inner.write_frame(data)

    async def aclose(self) -> None:
        await self.inner.aclose()


class InProcessReplay:
    def __init__(self, trace_path: str | Path, workdir: str | Path) -> None:
        trace = tr.read_trace(trace_path)
        self.header = h = trace.header
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
        self.events = _load(trace)
        self.honest = [True] * self.n
        for event in self.events:
            if event.kind == tr.FAR_FUTURE and 0 <= event.node < self.n:
                self.honest[event.node] = False
        self.net = Network(self.n, h.seed, NetParams(h.drop, h.dup, h.delay_ms, h.jitter_ms))
        self.heap: list[tuple[int, int, int, int]] = []  # (t, seq, receiver, event index)
        self.seq = 0
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
        h = self.header
        inf = 1 << 62
        i, next_round, round_no, healed = 0, h.start_ms + h.anti_entropy_ms, 0, False
        while True:
            t_trace = self.events[i].t_ms if i < len(self.events) else inf
            t_gossip = self.heap[0][0] if self.heap else inf
            t_heal = inf if healed else h.heal_ms
            t = min(t_trace, t_gossip, next_round, t_heal)
            if t > h.end_ms:
                break
            await self._sleep_until(t)
            if t_trace == t:  # the Spark replay's order at equal times
                await self._event(i, nursery)
                i += 1
            elif t_heal == t:
                await self._heal(nursery)
                healed = True
            elif t_gossip == t:
                await self._deliver(*heapq.heappop(self.heap))
            else:
                await self._round(round_no)
                round_no += 1
                next_round += h.anti_entropy_ms
        await self._sleep_until(h.end_ms)

    async def _event(self, i: int, nursery: trio.Nursery) -> None:
        event = self.events[i]
        if event.kind in tr.OP_CODES:
            await self._local_op(i)
            return
        node, args = event.node, event.args
        if event.kind in (tr.PARTITION, tr.PARTITION_ONEWAY):
            self.net.partition(args["group"] or [], oneway=event.kind == tr.PARTITION_ONEWAY)
        elif event.kind == tr.HEAL:
            self.net.heal()
        elif event.kind == tr.NET:
            self.net.params = self.net.params.after(args)
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

    async def _local_op(self, i: int) -> None:
        """A client's op at its origin: ``Node.submit_ops`` (validate, write, gossip if new)."""
        event = self.events[i]
        node = self.nodes[event.node]
        if not node.alive:
            self.stats["ops_at_down_node"] += 1
            return
        try:
            validate_op(event.op, now_ms=node.clock_ms(), max_offset_ms=node.config.max_offset_ms)
        except InvalidInput:
            self.stats["ops_rejected_at_origin"] += 1
            return
        self.stats["ops_applied"] += 1
        if not await node.write(event.op):
            return
        receivers, times, dropped, dups = self.net.gossip(event.op_key, event.node, event.t_ms)
        self.stats["gossip_sent"] += len(receivers)
        self.stats["gossip_dropped"] += dropped
        self.stats["gossip_duplicated"] += dups
        for receiver, at in zip(receivers, times, strict=True):
            heapq.heappush(self.heap, (at, self.seq, receiver, i))
            self.seq += 1

    async def _deliver(self, _t: int, seq: int, receiver: int, i: int) -> None:
        node, event = self.nodes[receiver], self.events[i]
        if not node.alive:
            self.stats["gossip_to_down_node"] += 1
            return
        msg = GossipMessage(peer_id(event.node), seq.to_bytes(8, "big"), event.data)
        accepted = await node.deliver(msg, forwarder=peer_id(event.node))
        self.stats["gossip_accepted" if accepted else "gossip_rejected"] += 1

    # --- anti-entropy ---

    async def _round(self, round_no: int) -> None:
        for a in range(self.n):
            if not self.nodes[a].alive:
                continue
            b = self.net.peer(round_no, a)
            if b == a or not self.nodes[b].alive or not self.net.can_talk(a, b):
                self.stats["sessions_unreachable"] += 1
                continue
            await self._session(a, b, self.net.cut_after(round_no, a))

    async def _session(self, a: int, b: int, cut_after: int | None) -> None:
        """``initiate`` on a, ``respond`` on b, over one in-memory stream."""
        initiator, responder = self.nodes[a], self.nodes[b]
        assert initiator.sync is not None and responder.sync is not None
        left, right = trio.testing.memory_stream_pair()
        connection = _CutConnection(cut_after)
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
        h = self.header
        self.net.heal()
        self.net.params = NetParams(0.0, 0.0, h.delay_ms, h.jitter_ms)
        for node in self.nodes:
            node.offset_ms = 0
        for i in range(self.n):
            await self._restart(i, nursery)

    # --- the result ---

    def _result(self) -> InProcessResult:
        rows = []
        for node in self.nodes:
            roots = {}
            if node.alive:
                roots = {d.name.lower(): root_text(*r) for d, r in node.roots().items()}
            rows.append(
                NodeResult(
                    node=node.index,
                    alive=node.alive,
                    honest=self.honest[node.index],
                    roots=roots,
                    clock_ahead_ms=node.clock.last.physical_ms - self.header.end_ms,
                )
            )
        stats = dict(self.stats)
        return InProcessResult(rows, stats, self.abort_reasons)


def _load(trace: tr.Trace) -> list[_Event]:
    rows = trace.table.select(["t_ms", "node", "kind", "op", "op_id", *_FAULT_COLUMNS]).to_pylist()
    seed = trace.header.seed
    events = []
    for row in rows:
        event = _Event(row["t_ms"], row["node"], row["kind"])
        if event.kind in tr.OP_CODES:
            event.op = decode_op(tr.OP_CODES[event.kind], row["op"])
            event.data = encode_ops([event.op])
            event.op_key = int.from_bytes(derive(seed, "op", row["op_id"])[:8], "big")
        else:
            event.args = {c: row[c] for c in _FAULT_COLUMNS}
        events.append(event)
    return events


def run_inprocess(trace_path: str | Path, workdir: str | Path) -> InProcessResult:
    """Replay ``trace_path`` through the node's code (RocksDB directories under ``workdir``)."""
    replay = InProcessReplay(trace_path, workdir)
    return trio.run(replay.run, clock=replay.clock)
