"""The per-shard simulation: every node of the trace, restricted to one shard's records.

A shard is a range of 16-bit keys: for a message or a member op a hash of its
chat (a message's fate is a function of its chat's member ops, so they must meet
in one shard), for an identity a hash of its user. Each Spark task simulates all
N nodes over its own slice, and the slices' roots combine by XOR and sum into
whole-domain roots.

Each task walks virtual time over the trace's ``sim.schedule``: trace events
(every shard sees every fault and every op's time and node; only the owner of an
op's record applies and gossips it), gossip deliveries, anti-entropy rounds (each
live node runs a ``SyncSession`` pair with its hashed peer through
``sync.loopback.run_session``), the heal at ``heal_ms``, and a final **GC** and
**check** at ``end_ms``.

Ingress on a node runs the project's code: ``store.ingress.validate_op`` at the
origin (signature, authorization, drift), ``HlcClock.update`` on every gossip
receipt (drift check), the retention cutoff, and the merge rules and the
message rule (``store.access``) inside ``SimReplica``. Nothing
reads the wall clock or a PRNG; the result depends only on the trace, the shard
count and the planted bug, never on which executor ran it.
"""

from __future__ import annotations

import gc
import json
import resource
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import blake3

from sim import retention_model
from sim.bugs import Rules, book_for, rules_for
from sim.handover import Handovers
from sim.rand import derive
from sim.replica import DELETES, IDENTITY, INDEX, MEMBERS, MESSAGES, ShardContext, SimReplica
from sim.schedule import (
    REPLAY_COLUMNS,
    UNIFORM,
    Delivery,
    HealAll,
    Round,
    Schedule,
    Session,
    TraceEvent,
    op_key,
)
from sim.scope_book import ScopeBook
from sim.scope_check import check_scopes
from sim.scopes import GRACE_MS, ScopeParams, split_group
from sim.shards import Expected, content_item, shard_of, tombstone_item, view_digest
from store import trace as tr
from store.errors import ClockDriftError, InvalidInput
from store.hlc import HlcClock
from store.ingress import validate_op
from store.kinds import ChatView, MessageView, delete_is_valid, erases
from store.ops import MembershipOp, decode_op
from store.records import IdentityRecord, MessageKind, MsgV1
from sync.loopback import run_session
from sync.protocol import KINDS, SyncConfig
from sync.replica import Record
from sync.scope import EVERYTHING, Scope

# What the check counts per honest live node; a run passes only if every one is 0.
CHECK_COUNTERS = (
    "lost",
    "extra",
    "stale",
    "resurrected",
    "wrong_active",
    "unauthorized_visible",  # shown by a node, not visible by the oracle
    "authorized_hidden",  # visible by the oracle, held by a node that does not show it
    "resurrected_deleted",  # a message stored again by a node that had erased it
    "payload_after_delete",  # a node holds an erased message: a target, an edit, a reaction
    "wrong_view",  # chats whose view (MESSAGES.md) differs from the oracle's
)
# Scoped traces (sim/scope_check.py): per node, and per chat over the task's chats.
SCOPE_COUNTERS = ("out_of_scope_held",)
SCOPE_CHAT_COUNTERS = ("chats_diverged", "under_replicated")
# What the overlay did over the run (``discovery``), summed over rounds; ``connections``
# sums each round's count (divided by ``rounds``: the mean), ``peak_degree`` is the maximum.
OVERLAY_FIELDS = (
    "rounds",
    "dials",
    "dials_failed",
    "connects",
    "closed_surplus",
    "dropped",
    "exchanges",
    "exchange_bytes",
    "connections",
    "peak_degree",
    "sessions",
)
UNCHECKED_OFFSET_MS = 1 << 47  # "no drift check": larger than any physical time
ROUND_FIELDS = (
    "t_ms",
    "divergence",
    "gossip",
    "tree",
    "ids",
    "records",
    "control",
    "sessions",
    "converged",
)


@dataclass
class ShardTask:
    shard: int
    shards: int
    trace_file: str
    plant: str | None
    expected: Expected
    progress: tuple[str, int] | None = None
    peering: str = UNIFORM  # who syncs with whom (sim.schedule: uniform or discovery)


class _Progress:
    """Best-effort progress lines to the driver's socket; silent if it is unreachable."""

    def __init__(self, address: tuple[str, int] | None, shard: int) -> None:
        self.shard = shard
        self.sock: socket.socket | None = None
        if address is not None:
            try:
                self.sock = socket.create_connection(address, timeout=5)
            except OSError:
                self.sock = None

    def send(self, done_ms: int, total_ms: int) -> None:
        if self.sock is None:
            return
        line = json.dumps({"shard": self.shard, "done": done_ms, "total": total_ms}) + "\n"
        try:
            self.sock.sendall(line.encode())
        except OSError:
            self.sock = None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


def _record_of(op: Any) -> Record:
    assert isinstance(op, MsgV1 | MembershipOp | IdentityRecord)
    return op


class ShardSim:
    def __init__(self, task: ShardTask) -> None:
        self.task = task
        trace = tr.read_trace(task.trace_file, REPLAY_COLUMNS)
        self.header = h = trace.header
        self.schedule = Schedule(trace, task.peering, book_for(task.plant))
        self.rules: Rules = rules_for(task.plant)
        self.n = h.nodes
        self.ctx = ShardContext(h.max_offset_ms)
        offset_limit = h.max_offset_ms if self.rules.check_drift else UNCHECKED_OFFSET_MS
        self.offset_limit = offset_limit
        # Sessions skip messages too far ahead of the receiver, as a node configures them.
        self.sync_offset = h.max_offset_ms if self.rules.check_drift else None
        self.clocks = [HlcClock(max_offset_ms=offset_limit) for _ in range(self.n)]
        scope = ScopeParams.of(h.params)
        # scoped traces: who holds what, from the trace's scope events (None: every node full)
        self.book = ScopeBook(self.n, scope.shards, h.seed) if scope.scoped else None
        # and the user shards a node holds for its writes until handed over (sim/handover.py)
        self.handovers = Handovers(self.n, scope.shards, GRACE_MS) if scope.scoped else None
        self.reps = [SimReplica(self.ctx, self.rules, c) for c in self.clocks]
        if self.book is not None:
            for rep in self.reps:
                rep.set_scope(Scope(frozenset(), scope.shards))  # nothing until its first event
        self.alive = [True] * self.n
        self.offset = [0] * self.n
        self.stats: dict[str, int] = {
            "ops_applied": 0,
            "ops_rejected_at_origin": 0,
            "ops_at_down_node": 0,
            "posts_waiting_at_origin": 0,
            "gossip_sent": 0,
            "gossip_sent_scoped": 0,
            "gossip_dropped": 0,
            "gossip_duplicated": 0,
            "gossip_to_down_node": 0,
            "gossip_rejected_drift": 0,
            "gossip_rejected_old": 0,
            "gossip_applied": 0,
            "sessions": 0,
            "sessions_converged": 0,
            "sessions_unreachable": 0,
            "sessions_cut": 0,
            "sessions_aborted": 0,
            "sync_records_applied": 0,
            "sync_rejected_old": 0,
            "sync_rejected_future": 0,
            "gc_runs": 0,
            "crashes": 0,
            "writes_lost_in_crashes": 0,
            "in_flight_at_end": 0,
            "waiting_at_end": 0,
            "waiting_lost_in_crashes": 0,
            "erased_waiting_at_end": 0,
            "index_handovers": 0,
            "index_unhanded_at_end": 0,
        }
        self.abort_reasons: dict[str, int] = {}
        self.round_bytes = dict.fromkeys(("gossip", *KINDS), 0)
        self.round_sessions = [0, 0]
        self.rounds: list[list[int]] = []
        self.overlay: dict[str, int] = dict.fromkeys(OVERLAY_FIELDS, 0)
        self.ops = self._shard_ops(trace)
        self.poisoned = self.schedule.far_future_nodes()
        self.honest = [n not in self.poisoned for n in range(self.n)]
        for n in self.poisoned:
            self.reps[n].set_counting(False)

    def _shard_ops(self, trace: tr.Trace) -> dict[int, tuple[Any, Record, int, int]]:
        """This shard's ops, decoded: trace row -> (op, record, gossip key, size)."""
        column = trace.table.column
        keys: list[int | None] = column("shard_key").to_pylist()
        ops: list[bytes | None] = column("op").to_pylist()
        op_ids: list[bytes | None] = column("op_id").to_pylist()
        shard, shards, seed = self.task.shard, self.task.shards, self.header.seed
        out: dict[int, tuple[Any, Record, int, int]] = {}
        for i, kind in enumerate(self.schedule.kinds):
            if kind not in tr.OP_CODES:
                continue
            key, data, op_id = keys[i], ops[i], op_ids[i]
            if key is None or data is None or op_id is None:
                raise ValueError(f"trace row {i}: op without shard_key, op or op_id")
            if shard_of(key, shards) == shard:
                op = decode_op(tr.OP_CODES[kind], data)
                out[i] = (op, _record_of(op), op_key(seed, op_id), len(data))
        return out

    # --- time ---

    def phys(self, node: int, t_ms: int) -> int:
        return t_ms + self.offset[node]

    def cutoff(self, node: int, t_ms: int) -> int:
        h = self.header
        return retention_model.cutoff(
            self.phys(node, t_ms), h.retention_ms, self.reps[node].horizon, h.gc_grain_ms
        )

    # --- the loop ---

    def run(self) -> dict[str, Any]:
        h = self.header
        progress = _Progress(self.task.progress, self.task.shard)
        started, cpu0 = time.perf_counter(), time.process_time()
        span = max(1, h.end_ms - h.start_ms)
        # Python's automatic collections walk every record of every replica again and again
        # (~15 % of a shard's CPU, SIM.md); the simulation makes few reference cycles, so
        # the young ones are collected once a round instead.
        gc.disable()
        try:
            for step in self.schedule.steps():
                match step:
                    case Delivery():
                        self._deliver(step)
                    case TraceEvent():
                        self._event(step)
                    case Round():
                        self._round(step)
                        gc.collect(1)
                        progress.send(step.t_ms - h.start_ms, span)
                    case HealAll():
                        self._heal()
        finally:
            gc.enable()
        self.stats["in_flight_at_end"] = self.schedule.in_flight
        # messages no op admits (yet): what a node holds in memory beside its store
        self.stats["waiting_at_end"] = sum(len(r.waiting) for r in self.reps)
        self.stats["waiting_lost_in_crashes"] = sum(r.counters.waiting_lost for r in self.reps)
        self.stats["erased_waiting_at_end"] = sum(
            _erased_waiting(rep)
            for n, rep in enumerate(self.reps)
            if self.alive[n] and self.honest[n]
        )
        self._settle_handovers()
        self._final_gc()
        result = self._result()
        result["wall_s"] = time.perf_counter() - started
        result["cpu_s"] = time.process_time() - cpu0
        # the worker process's peak (a Python worker may have run another shard before)
        result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        progress.send(span, span)
        progress.close()
        return result

    def _event(self, event: TraceEvent) -> None:
        """An op at its origin, or a node's fault (the schedule handles the network's)."""
        kind, node, t = event.kind, event.node, event.t_ms
        if event.args is None:
            self._local_op(event.row, node, t)
        elif kind == tr.CRASH:
            self._crash(node, t)
        elif kind == tr.RESTART:
            self._restart(node, t)
        elif kind == tr.SKEW or kind == tr.FAR_FUTURE:
            self.offset[node] = int(event.args["offset_ms"] or 0)
        elif kind == tr.GC:
            self._gc(node, t)
        elif kind == tr.SCOPE:
            self._set_scope(node, event.args["group"] or ())

    def _set_scope(self, node: int, group: Sequence[int]) -> None:
        """The node's scope from now on: the network (topics, holders) learns the trace's;
        the replica holds what the rules make of it (a planted bug may forget a shard).
        An operator's step: what came before it is durable."""
        assert self.book is not None, "a scope event in a trace without scope_shards"
        rep = self.reps[node]
        held = rep.scope.shards or frozenset()
        shards, users = split_group(group, self.book.num_shards)
        if self.handovers is not None:
            self.handovers.kept[node] = users
            users = self.handovers.user_shards(node)
        told = self.book.set(node, shards, users)
        rep.flush()
        chats = self.rules.next_scope(held, shards)
        rep.set_scope(Scope(chats, told.num_shards, told.user_shards))

    def _hold_users(self, node: int) -> None:
        """The node's user shards changed for its writes (held, or handed over and their
        grace ended): the trace's, and those it holds for its writes (sim/handover.py)."""
        assert self.book is not None and self.handovers is not None
        rep, told = self.reps[node], self.book.scopes[node]
        users = self.handovers.user_shards(node)
        self.book.set(node, frozenset(told.shards or ()), users)
        rep.flush()
        rep.set_scope(Scope(rep.scope.shards, told.num_shards, users))

    def _settle_handovers(self) -> None:
        """The run ends quiescent: graces end (``Handovers.settle``); what no session
        handed over stays held, and counted on the honest live nodes (the checked ones)."""
        if self.handovers is None:
            return
        for node in self.handovers.settle(self.header.end_ms, self.alive):
            self._hold_users(node)
        self.stats["index_handovers"] = self.handovers.handed_over
        checked = [n for n in range(self.n) if self.alive[n] and self.honest[n]]
        self.stats["index_unhanded_at_end"] = self.handovers.unhanded(checked)

    def _local_op(self, i: int, node: int, t: int) -> None:
        if not self.alive[node]:
            self.stats["ops_at_down_node"] += 1
            return
        rep = self.reps[node]
        entry = self.ops.get(i)
        if entry is None:  # another shard's record: only the write's WAL sync matters here
            rep.flush()
            return
        op, record, key, size = entry
        phys = self.phys(node, t)
        try:
            validate_op(op, now_ms=phys, max_offset_ms=self.offset_limit)
            self.clocks[node].update(op.hlc, phys)
        except InvalidInput:
            self.stats["ops_rejected_at_origin"] += 1
            rep.flush()
            return
        rep.t_ms, rep.now_ms = t, phys
        if self.handovers is not None and isinstance(record, (MembershipOp, IdentityRecord)):
            assert self.book is not None  # it indexes what it writes, first (sim/handover.py)
            if self.handovers.wrote_for(node, self.book.user_shard(record.user_id), t):
                self._hold_users(node)
        if not rep.apply_record(record) and isinstance(record, MsgV1):
            # no op admits it here (yet): a stranger's post, or one that overtook its add
            self.stats["posts_waiting_at_origin"] += record.msg_id in rep.waiting
        rep.flush()
        self.stats["ops_applied"] += 1
        # scoped: a message to its shard's topic, a member op to its two, an identity to its
        # user shard's
        subscribed = None
        if self.book is not None and isinstance(record, MsgV1):
            subscribed = self.book.subscribed(record.chat_id)
        elif self.book is not None and isinstance(record, MembershipOp):
            subscribed = self.book.subscribed_op(record.chat_id, record.user_id)
        elif self.book is not None and isinstance(record, IdentityRecord):
            subscribed = self.book.subscribed_user(record.user_id)
        fanout = self.schedule.publish(key, i, node, t, subscribed)
        self.stats["gossip_dropped"] += fanout.dropped
        self.stats["gossip_duplicated"] += fanout.duplicated
        self.stats["gossip_sent"] += fanout.sent
        if subscribed is not None:
            self.stats["gossip_sent_scoped"] += fanout.sent  # to a shard's topic only
        self.round_bytes["gossip"] += size * fanout.sent

    def _deliver(self, delivery: Delivery) -> None:
        t, node, i = delivery.t_ms, delivery.receiver, delivery.row
        if not self.alive[node]:
            self.stats["gossip_to_down_node"] += 1
            return
        op, record, _, _ = self.ops[i]
        phys = self.phys(node, t)
        try:
            self.clocks[node].update(op.hlc, phys)
        except ClockDriftError:
            self.stats["gossip_rejected_drift"] += 1
            return
        rep = self.reps[node]
        if (
            isinstance(record, MsgV1)
            and record.kind is not MessageKind.DELETE  # deletes never expire
            and self.rules.retention_filter
            and retention_model.too_old(record.hlc.physical_ms, self.cutoff(node, t))
        ):
            self.stats["gossip_rejected_old"] += 1
            return
        rep.t_ms, rep.now_ms = t, phys
        if rep.apply_record(record):
            self.stats["gossip_applied"] += 1

    def _round(self, step: Round) -> None:
        t = step.t_ms
        if self.handovers is not None:  # graces that ended: those user shards leave
            for node in self.handovers.step(t, self.alive):
                self._hold_users(node)
        peer_of = None if self.book is None else self.book.peer_of(self.schedule.net.peer)
        sessions, unreachable = self.schedule.sessions(step.number, self.alive, peer_of)
        self.stats["sessions_unreachable"] += unreachable
        for session in sessions:
            self._session(step.number, session, t)
        self._count_overlay()
        live = sum(1 for n in range(self.n) if self.alive[n] and self.honest[n])
        rb = self.round_bytes
        self.rounds.append(
            [
                t,
                self.ctx.divergence(live),
                rb["gossip"],
                rb["tree"],
                rb["ids"],
                rb["records"],
                rb["control"],
                *self.round_sessions,
            ]
        )
        self.round_bytes = dict.fromkeys(rb, 0)
        self.round_sessions = [0, 0]

    def _count_overlay(self) -> None:
        overlay = self.schedule.overlay
        if overlay is None:
            return
        totals, stats = self.overlay, overlay.stats
        for name in OVERLAY_FIELDS:
            if name not in ("rounds", "peak_degree"):
                totals[name] += getattr(stats, name)
        totals["peak_degree"] = max(totals["peak_degree"], stats.peak_degree)
        totals["rounds"] += 1

    def _session(self, round_no: int, session: Session, t: int) -> None:
        a, b = session.initiator, session.responder
        ra, rb = self.reps[a], self.reps[b]
        ra.t_ms = rb.t_ms = t
        ra.now_ms, rb.now_ms = self.phys(a, t), self.phys(b, t)
        own_scope = ra.scope
        if self.rules.session_beyond_scope:
            ra.scope = EVERYTHING  # BUG: offers every shard and keeps whatever comes
        outcome = run_session(
            ra,
            rb,
            now_ms=ra.now_ms,
            responder_now_ms=rb.now_ms,
            config=self._sync_config(a, t),
            responder_config=self._sync_config(b, t),
            salt_seed=derive(self.header.seed, "salt", round_no, a, b)[:16],
            cut_after=session.cut_after,
            raise_errors=False,
        )
        ra.scope = own_scope
        if outcome.converged and self.handovers is not None:
            assert self.book is not None
            ua, ub = self.book.scopes[a].user_shards, self.book.scopes[b].user_shards
            self.handovers.reconciled(a, b, frozenset(ua or ()) & frozenset(ub or ()), t)
        s = self.stats
        s["sessions"] += 1
        self.round_sessions[0] += 1
        if outcome.converged:
            s["sessions_converged"] += 1
            self.round_sessions[1] += 1
        if outcome.cut:
            s["sessions_cut"] += 1
        if outcome.error is not None:
            s["sessions_aborted"] += 1
            self.abort_reasons[outcome.error] = self.abort_reasons.get(outcome.error, 0) + 1
        s["sync_records_applied"] += outcome.records_applied
        s["sync_rejected_old"] += outcome.rejected_old
        s["sync_rejected_future"] += outcome.rejected_future
        for kind, count in outcome.bytes_sent.items():
            self.round_bytes[kind] += count

    def _sync_config(self, node: int, t: int) -> SyncConfig:
        """A node's session settings: its retention cutoff, signed members, its drift limit."""
        cutoff = self.cutoff(node, t) if self.rules.retention_filter else None
        return SyncConfig(
            cutoff_ms=cutoff,
            authenticate=True,
            max_offset_ms=self.sync_offset,
            verify_messages=self.ctx.verify_messages,  # each message's signature checked once
        )

    # --- faults ---

    def _crash(self, node: int, t: int) -> None:
        if not self.alive[node]:
            return
        flushed_at = t - t % self.header.flush_ms
        self.stats["crashes"] += 1
        self.stats["writes_lost_in_crashes"] += self.reps[node].crash(flushed_at)
        self.alive[node] = False
        self.reps[node].set_counting(False)

    def _restart(self, node: int, t: int) -> None:
        """Back up; one GC cycle at start-up, as the node's GC loop runs one."""
        if self.alive[node]:
            return
        self.alive[node] = True
        self.reps[node].set_counting(self.honest[node])
        if self.handovers is not None:
            self.handovers.restarted(node, t)
        self._gc(node, t)

    def _gc(self, node: int, t: int) -> None:
        if not self.alive[node]:
            return
        rep = self.reps[node]
        rep.flush()
        h = self.header
        retention_model.run_gc(rep, self.phys(node, t), h.retention_ms, h.gc_grain_ms)
        self.stats["gc_runs"] += 1

    def _heal(self) -> None:
        """The faults are over (the schedule healed the network): clocks right, every node up."""
        h = self.header
        self.offset = [0] * self.n
        for node in range(self.n):
            self._restart(node, h.heal_ms)

    def _final_gc(self) -> None:
        for node in range(self.n):
            if self.alive[node]:
                self._gc(node, self.header.end_ms)

    # --- the check ---

    def _result(self) -> dict[str, Any]:
        exp = self.task.expected
        per_node: list[dict[str, Any]] = []
        for node, rep in enumerate(self.reps):
            roots = [
                [int.from_bytes(x, "big"), c] for x, c in (rep.tree(d).root() for d in DOMAINS)
            ]
            row: dict[str, Any] = {
                "node": node,
                "alive": self.alive[node],
                "honest": self.honest[node],
                "roots": roots,
                "resurrected": rep.counters.resurrected,
                "rolled_back": rep.counters.rolled_back,
                "collected": rep.counters.collected,
                "rejected_drift_sync": rep.counters.rejected_drift,
                "clock_ahead_ms": self.clocks[node].last.physical_ms - self.header.end_ms,
            }
            row.update(_compare(rep, exp) if self.book is None else {})
            per_node.append(row)
        scoped = None
        if self.book is not None:
            live = [self.alive[n] and self.honest[n] for n in range(self.n)]
            book = self.book
            scoped = check_scopes(self.reps, exp, book.shard, book.user_shard, live, _compare)
            for row, counts in zip(per_node, scoped.per_node, strict=True):
                row.update(counts)
        return {
            "scoped": None if scoped is None else scoped.summary(),
            "shard": self.task.shard,
            "rounds": self.rounds,
            "nodes": per_node,
            "stats": self.stats,
            "abort_reasons": self.abort_reasons,
            "ops_in_shard": len(self.ops),
            # the same in every shard (the overlay does not see the sessions' outcome)
            "overlay": self.overlay if self.schedule.overlay is not None else None,
        }


DOMAINS = (MESSAGES, MEMBERS, IDENTITY, DELETES, INDEX)  # Domain's order: the runner zips by it


def _compare(
    rep: SimReplica, exp: Expected, wrong_views: set[bytes] | None = None
) -> dict[str, int]:
    """How one replica differs from the oracle's state of the shard (``wrong_views``
    collects the chats whose view differs)."""
    held = set(rep.messages)
    ops = set(rep.member_ops)
    deletes = set(rep.deletes)
    shown = {i for i, m in rep.messages.items() if rep.is_visible(m)}
    counts = {
        "lost": len(exp.messages - held) + len(exp.member_ops - ops) + len(exp.deletes - deletes),
        "extra": len(held - exp.messages) + len(ops - exp.member_ops) + len(deletes - exp.deletes),
        "stale": 0,
        "wrong_active": 0,
        "unauthorized_visible": len(shown - exp.visible),
        "authorized_hidden": len((exp.visible & held) - shown),
        "resurrected_deleted": rep.counters.resurrected_deleted + len(held & rep.erased),
        "payload_after_delete": len(held & exp.erased),
        "wrong_view": 0,
    }
    views = rep.views(exp.views)
    for chat, digest in exp.views.items():
        if view_digest_of(views[chat]) != digest:
            counts["wrong_view"] += 1
            if wrong_views is not None:
                wrong_views.add(chat)
    members = {key: (rep.member_row_version(key), rep.member_active(key)) for key in rep.members}
    _compare_rows(members, exp.members, counts, count_presence=False)
    identities = {user: (rep.identity_record_id(user), None) for user in rep.identities}
    _compare_rows(identities, {u: (i, None) for u, i in exp.identities.items()}, counts)
    return counts


def _compare_rows(
    have: Mapping[Any, tuple[bytes | None, bool | None]],
    want: Mapping[Any, tuple[bytes, bool | None]],
    counts: dict[str, int],
    *,
    count_presence: bool = True,
) -> None:
    """Rows (key -> version id, active) expected and absent (lost), held and not expected
    (extra), held at another version (stale) or with the other active state (wrong_active).
    A member row is a fold of ops whose presence is counted already (``count_presence``)."""
    for key in have.keys() | want.keys():
        if key not in want:
            counts["extra"] += count_presence
        elif key not in have:
            counts["lost"] += count_presence
        else:
            (have_id, have_active), (want_id, want_active) = have[key], want[key]
            counts["stale"] += have_id != want_id
            counts["wrong_active"] += have_active != want_active


def _erased_waiting(rep: SimReplica) -> int:
    """Messages waiting for an admitting op that a delete the replica holds erases (their
    payload is in the room: MESSAGES.md says no replica keeps it)."""
    count = 0
    for msg in rep.waiting.waiting():
        for ref in (msg.msg_id, msg.ref):
            deletes = rep.deletes_by_ref.get(ref or b"", ())
            admins = rep.admins(msg.chat_id)
            if any(delete_is_valid(d, admins) and erases(d, msg) for d in deletes):
                count += 1
                break
    return count


def view_digest_of(view: ChatView) -> bytes:
    """A replica's view of a chat in the oracle's canonical form (``sim.shards``)."""
    items = []
    for item in view.items:
        if isinstance(item, MessageView):
            edited = None if item.edited_at is None else item.edited_at.pack()
            m = item.msg
            items.append(
                content_item(
                    m.msg_id,
                    m.hlc.pack(),
                    item.payload,
                    edited,
                    item.reply_state,
                    item.reactions.items(),
                )
            )
        else:
            items.append(
                tombstone_item(
                    item.msg_id,
                    item.hlc.pack(),
                    item.sender,
                    item.deleted_by,
                    item.deleted_at.pack(),
                )
            )
    return view_digest(items, ((u, p.pack()) for u, p in view.read_positions.items()))


def run_shard(task: ShardTask) -> dict[str, Any]:
    """Simulate one shard to the end and check it; a plain dict comes back to the driver."""
    return ShardSim(task).run()


def digest_rows(rows: list[list[int]]) -> str:
    hasher = blake3.blake3()
    for row in rows:
        hasher.update(json.dumps(row).encode())
    return hasher.hexdigest()
