"""A trace's replay schedule: the ordered steps both replays of a trace handle.

The Spark replay (``sim/engine.py``, one shard per task) and the in-process
replay through the node's code (``tests/sim/inprocess.py``) walk virtual time
over the same steps, in the same order:

* ``TraceEvent``: the trace's rows in ``(t_ms, seq)`` order, ops and faults.
  The network faults (``partition``, ``partition_oneway``, ``heal``, ``net``)
  change the schedule's own ``Network`` before the step is handed out; the
  replay handles the ops and the node faults (crash, restart, skew, far future,
  GC).
* ``Delivery``: one gossip delivery of an op, to one receiver. The replay calls
  ``publish`` when an op is accepted at its origin; the deliveries' fates
  (dropped, delayed with jitter, duplicated, cut by a partition) are hashed from
  (seed, op key, receiver) by ``sim.network``.
* ``Round``: anti-entropy, every ``anti_entropy_ms`` from the trace's start;
  ``sessions`` names the sessions and the frame after which each connection dies.
  ``peering`` says who syncs with whom: ``uniform``, each live node with one hashed
  peer among all nodes (every node knows every node); ``discovery``, the sessions
  ``sim.overlay`` picks — each node's partners among its own connections, found by
  peer exchange from bootstrap nodes 0..2 (round ``k`` is one sync interval).
* ``HealAll`` at ``heal_ms``: the trace's faults are over. Partitions go and
  loss and duplication stop here; the replay restarts every node and sets every
  clock right.

Nothing comes after ``end_ms``: the replay runs its final GC and check there.
At equal times a trace event goes first, then the heal, then a delivery, then a
round. Nothing reads a clock or a PRNG: the steps depend only on the trace and
on what the replay publishes.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sim.network import NetParams, Network
from sim.overlay import BookFactory, Overlay, OverlayParams
from sim.rand import derive
from store import trace as tr
from sync.peering import PeerBook

FAULT_ARGS = ("group", "drop", "dup", "delay_ms", "jitter_ms", "offset_ms")
# The columns a replay reads (``read_trace`` adds t_ms and seq).
REPLAY_COLUMNS = ["node", "kind", "op", "op_id", "shard_key", *FAULT_ARGS]
_NEVER = 1 << 62
UNIFORM, DISCOVERY = "uniform", "discovery"
PEERINGS = (UNIFORM, DISCOVERY)


class TraceEvent(NamedTuple):
    t_ms: int
    row: int  # the trace row, in replay order
    kind: str  # one of store.trace's OP_KINDS or FAULT_KINDS
    node: int
    args: dict[str, Any] | None  # a fault's arguments (FAULT_ARGS); None for an op


class Delivery(NamedTuple):
    t_ms: int
    seq: int  # publication order: at equal times the first published goes first
    receiver: int
    row: int  # the op's trace row


class Round(NamedTuple):
    t_ms: int
    number: int


class HealAll(NamedTuple):
    t_ms: int


Step = TraceEvent | Delivery | Round | HealAll


class Fanout(NamedTuple):
    """What ``publish`` did with one op: deliveries queued, and the fates drawn."""

    sent: int
    dropped: int
    duplicated: int


class _Batch:
    """One published op's deliveries not handed out yet, in (time, seq) order."""

    __slots__ = ("next", "receivers", "row", "seqs", "times")

    def __init__(self, row: int, times: list[int], seqs: list[int], receivers: list[int]) -> None:
        self.row = row
        self.times = times
        self.seqs = seqs
        self.receivers = receivers
        self.next = 0  # the first not handed out


@dataclass(frozen=True)
class Session:
    initiator: int
    responder: int
    cut_after: int | None  # the connection dies after this many frames; None: it holds


def op_key(seed: int, op_id: bytes) -> int:
    """The key an op's gossip fates are drawn from: the same in every replay of a trace."""
    return int.from_bytes(derive(seed, "op", op_id)[:8], "big")


class Schedule:
    """One replay's steps over ``trace`` (read with at least ``REPLAY_COLUMNS``)."""

    def __init__(
        self, trace: tr.Trace, peering: str = UNIFORM, book: BookFactory = PeerBook
    ) -> None:
        if peering not in PEERINGS:
            raise ValueError(f"peering {peering!r}: one of {', '.join(PEERINGS)}")
        self.header = h = trace.header
        column = trace.table.column
        self.times: list[int] = column("t_ms").to_pylist()
        self.nodes: list[int] = column("node").to_pylist()
        self.kinds: list[str] = column("kind").to_pylist()
        faults = [i for i, kind in enumerate(self.kinds) if kind not in tr.OP_CODES]
        values = {name: column(name).to_pylist() for name in FAULT_ARGS}
        self.fault_args = {i: {name: values[name][i] for name in FAULT_ARGS} for i in faults}
        self.net = Network(h.nodes, h.seed, NetParams(h.drop, h.dup, h.delay_ms, h.jitter_ms))
        # A heap of the published ops' pending deliveries, one entry per op: (time, seq,
        # batch) of its next delivery — a merge of the ops' lists, each in (time, seq) order,
        # which hands out the deliveries in the same (time, seq) order as one heap of every
        # delivery would, with a heap as small as the ops in flight.
        self._deliveries: list[tuple[int, int, _Batch]] = []
        self._seq = 0
        self.overlay = (
            Overlay(h.nodes, h.seed, OverlayParams(interval_ms=h.anti_entropy_ms), book)
            if peering == DISCOVERY
            else None
        )

    def far_future_nodes(self) -> set[int]:
        """Nodes whose clock the trace sends beyond max offset: not honest, not checked."""
        return {
            self.nodes[i]
            for i in self.fault_args
            if self.kinds[i] == tr.FAR_FUTURE and 0 <= self.nodes[i] < self.header.nodes
        }

    @property
    def in_flight(self) -> int:
        """Deliveries queued and not handed out (at the end: those due after ``end_ms``)."""
        return sum(len(batch.times) - batch.next for _, _, batch in self._deliveries)

    # --- the steps ---

    def steps(self) -> Iterator[Step]:
        """Every step up to ``end_ms``, in order; ``publish`` between steps adds deliveries."""
        h = self.header
        i, events = 0, len(self.times)
        round_no, next_round, healed = 0, h.start_ms + h.anti_entropy_ms, False
        while True:
            t_trace = self.times[i] if i < events else _NEVER
            t_gossip = self._deliveries[0][0] if self._deliveries else _NEVER
            t_heal = _NEVER if healed else h.heal_ms
            t = min(t_trace, t_gossip, next_round, t_heal)
            if t > h.end_ms:
                return
            if t_trace == t:
                yield self._trace_event(i)
                i += 1
            elif t_heal == t:
                self._heal_network()
                healed = True
                yield HealAll(t)
            elif t_gossip == t:
                yield self._next_delivery()
            else:
                yield Round(t, round_no)
                round_no += 1
                next_round += h.anti_entropy_ms

    def _trace_event(self, i: int) -> TraceEvent:
        args = self.fault_args.get(i)
        if args is not None:
            self._network_fault(self.kinds[i], args)
        return TraceEvent(self.times[i], i, self.kinds[i], self.nodes[i], args)

    def _network_fault(self, kind: str, args: dict[str, Any]) -> None:
        net = self.net
        if kind == tr.PARTITION or kind == tr.PARTITION_ONEWAY:
            net.partition(args["group"] or [], oneway=kind == tr.PARTITION_ONEWAY)
        elif kind == tr.HEAL:
            net.heal()
        elif kind == tr.NET:
            net.params = net.params.after(args)

    def _heal_network(self) -> None:
        h = self.header
        self.net.heal()
        self.net.params = NetParams(0.0, 0.0, h.delay_ms, h.jitter_ms)

    # --- what the replay asks for ---

    def publish(self, key: int, row: int, origin: int, t_ms: int) -> Fanout:
        """Gossip trace row ``row``'s op from ``origin`` (fates drawn from ``key``: ``op_key``)."""
        receivers, times, dropped, duplicated = self.net.gossip(key, origin, t_ms)
        seq = self._seq
        if receivers:
            order = sorted(range(len(times)), key=times.__getitem__)  # stable: seq breaks ties
            batch = _Batch(
                row,
                [times[j] for j in order],
                [seq + j for j in order],
                [receivers[j] for j in order],
            )
            heapq.heappush(self._deliveries, (batch.times[0], batch.seqs[0], batch))
        self._seq = seq + len(receivers)
        return Fanout(len(receivers), dropped, duplicated)

    def _next_delivery(self) -> Delivery:
        t_ms, seq, batch = self._deliveries[0]
        i = batch.next
        receiver = batch.receivers[i]
        i += 1
        if i < len(batch.times):
            batch.next = i
            heapq.heapreplace(self._deliveries, (batch.times[i], batch.seqs[i], batch))
        else:
            heapq.heappop(self._deliveries)
        return Delivery(t_ms, seq, receiver, batch.row)

    def sessions(self, round_no: int, alive: Sequence[bool]) -> tuple[list[Session], int]:
        """Round ``round_no``'s sessions, in node order, and how many live nodes found their
        peer down or cut off (``discovery``: how many dials failed)."""
        if self.overlay is not None:
            return self._overlay_sessions(round_no, alive)
        net, sessions, unreachable = self.net, [], 0
        for a in range(self.header.nodes):
            if not alive[a]:
                continue
            b = net.peer(round_no, a)
            if b == a or not alive[b] or not net.can_talk(a, b):
                unreachable += 1
                continue
            sessions.append(Session(a, b, net.cut_after(round_no, a)))
        return sessions, unreachable

    def _overlay_sessions(self, round_no: int, alive: Sequence[bool]) -> tuple[list[Session], int]:
        assert self.overlay is not None
        h, net = self.header, self.net
        t_ms = h.start_ms + (round_no + 1) * h.anti_entropy_ms  # as ``steps`` times rounds
        pairs = self.overlay.round(t_ms, alive, net.can_talk)
        sessions = [Session(a, b, net.cut_after(round_no, a, b)) for a, b in pairs]
        return sessions, self.overlay.stats.dials_failed
