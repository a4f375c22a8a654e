"""A simulated node's replica: ``sync.replica.MemoryReplica`` with what a simulation needs.

``SimReplica`` is a ``MemoryReplica`` — the same dicts, record-id index and trees
in step, every batch planned by the node's own planner (``store.plan``) — with its
hooks set for the simulator:

* **Rules**: the planner's predicates (the message rule, identity LWW, who may
  delete) are ``Rules.plan_rules()``, the member-row merge ``Rules.merge_member``
  (the project's own unless a planted bug swaps a piece, ``sim/bugs.py``), and the
  message tree is ``Rules.message_tree``.
* **Drift check on every record a session applies** (``HlcClock.check_drift``
  against the node's local physical time). Sessions skip far-future records
  themselves (``SyncConfig.max_offset_ms``); this check is a second line.
* **Durability**: writes received from peers go to an undo log until the next
  flush; ``crash()`` rolls back whatever was not flushed — a member op is taken
  out and its (chat, user) row and history folded again from the ops left — and
  empties the waiting room (it lives in memory).
* **Retention**: ``collect_messages`` (the GC, ``sim/retention_model.py``) and
  the resurrection counter. The replica itself refuses nothing as too old
  (``expire_before_ms`` stays None): the cutoff is applied at ingress, and to
  messages leaving the waiting room (``waiting_in``), so that a planted bug that
  skips it shows as resurrections.
* **The divergence metric**: records entering and leaving honest live replicas
  are counted shard-wide (``ShardContext.holders``).
* **Memory for hundreds of replicas per process**: decoded messages are shared
  between replicas, and so are decoded member ops; bucket listings come from one
  shard-wide index (filtered by what this replica holds), and every tree keeps only
  its top three levels and reads the nodes below from that index and what the
  replica holds (``sim.trees.IndexedTree``): a message tree's full lists would cost
  ~1.6 MB a replica and shard before any record, and its lower levels in dicts about a
  node per record each (SIM.md, "Memory").

``tests/sim/test_replica.py`` asserts that with the real rules it agrees with a
plain ``MemoryReplica`` record for record.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sim.bugs import Rules
from sim.trees import IndexedTree, TreeCache
from store.access import NO_HISTORY, MemberHistory
from store.authz import DmProof
from store.errors import ClockDriftError, InvalidInput
from store.hlc import HlcClock
from store.ingress import verify_each
from store.kinds import ChatView, MessageView, edit_applies
from store.ops import MembershipAction, MembershipOp
from store.plan import NO_ADMINS, admin_state_of
from store.records import (
    MemberInfo,
    MessageKind,
    MsgV1,
    compute_identity_record_id,
    member_record_id,
)
from store.waiting import WaitingRoom
from sync.frames import Domain
from sync.replica import (
    DELETES,
    IDENTITY,
    INDEX,
    MEMBERS,
    MESSAGES,
    BucketIndex,
    MemoryReplica,
    Record,
    new_bucket_index,
)

__all__ = ["IDENTITY", "INDEX", "MEMBERS", "MESSAGES", "Counters", "ShardContext", "SimReplica"]

Key = tuple[bytes, bytes]  # (chat, user)
ERASED = "erased"  # undo-log entries: a message refused on arrival as erased


@dataclass
class ShardContext:
    """What all replicas of one shard share: a bucket index, decoded records, the metrics."""

    max_offset_ms: int
    buckets: BucketIndex = field(default_factory=new_bucket_index)  # only grows
    trees: TreeCache = field(default_factory=TreeCache)  # ids' tree values, a salt's hashes
    interned: dict[bytes, MsgV1] = field(default_factory=dict)
    member_ops: dict[bytes, MembershipOp] = field(default_factory=dict)  # op id -> op
    row_ids: dict[tuple[bytes, bytes, MemberInfo], bytes] = field(default_factory=dict)
    # Divergence: how many honest live replicas hold each record id.
    holders: dict[bytes, int] = field(default_factory=dict)
    held: int = 0  # sum of holders

    # Signature verdicts by message id (BLAKE3 of the signed bytes, signature included): the
    # simulated nodes run the same honest code, so a message verifies alike on every one of
    # them; the first session to receive it checks it, the others read the verdict (a forged
    # one is refused on every node, as each would refuse it).
    verdicts: dict[bytes, InvalidInput | None] = field(default_factory=dict)

    def verify_messages(self, msgs: Sequence[MsgV1]) -> list[InvalidInput | None]:
        """``SyncConfig.verify_messages`` for every session of the shard: ``verify_each``'s
        verdicts, each message checked once."""
        verdicts, out = self.verdicts, []
        for msg in msgs:
            msg_id = msg.msg_id
            if msg_id in verdicts:
                out.append(verdicts[msg_id])
            else:
                verdict = verdicts[msg_id] = verify_each([msg])[0]
                out.append(verdict)
        return out

    def gained(self, record_id: bytes) -> None:
        self.holders[record_id] = self.holders.get(record_id, 0) + 1
        self.held += 1

    def lost(self, record_id: bytes) -> None:
        left = self.holders[record_id] - 1
        if left:
            self.holders[record_id] = left
        else:
            del self.holders[record_id]
        self.held -= 1

    def divergence(self, live: int) -> int:
        """Missing (replica, record) pairs: records some honest live replica holds, others lack."""
        return len(self.holders) * live - self.held


@dataclass
class Counters:
    rejected_drift: int = 0
    resurrected: int = 0
    rolled_back: int = 0
    collected: int = 0
    waiting_lost: int = 0  # messages in the waiting room when the node crashed
    resurrected_deleted: int = 0  # a message stored again after this replica erased it


class SimReplica(MemoryReplica):
    """One node's replica within one shard."""

    def __init__(self, ctx: ShardContext, rules: Rules, clock: HlcClock) -> None:
        trees = {
            MESSAGES: rules.message_tree(ctx.trees, ctx.buckets[MESSAGES]),
            **{
                d: IndexedTree(ctx.trees, ctx.buckets[d])
                for d in (MEMBERS, IDENTITY, DELETES, INDEX)
            },
        }
        super().__init__(trees, ctx.buckets)
        for domain, tree in trees.items():
            if isinstance(tree, IndexedTree):  # its lower levels are read from what is held
                tree.hold(self._held(domain))
        self.ctx = ctx
        self.rules = rules
        self.plan_rules = rules.plan_rules()
        self.clock = clock
        self.now_ms = 0  # local physical time of the current event (drift checks)
        self.horizon = 0  # retention: highest cutoff collected at
        self.counting = True  # contributes to ShardContext.holders (honest and live)
        self.counters = Counters()
        self._undo: list[tuple[int, Domain | str, Any, Any]] = []  # (t, domain, key, before)
        self._by_time: list[tuple[int, bytes]] = []  # (physical_ms, msg_id) heap for the GC
        self._shown_on_arrival: dict[bytes, bool] = {}  # the authz-arrival bug's frozen verdicts
        self._arrival: dict[bytes, int] = {}  # message id -> arrival number (edit-arrival bug)
        self.t_ms = 0  # true time of the current event (undo log)

    def apply(self, domain: Domain, records: Sequence[Record]) -> int:
        """Records from a sync session: drift-checked, merged, not yet durable."""
        if self.rules.check_drift:
            records = [r for r in records if self._within_offset(r)]
        return super().apply(domain, records)

    def _within_offset(self, record: Record) -> bool:
        try:
            self.clock.check_drift(record.hlc, self.now_ms)
        except ClockDriftError:
            self.counters.rejected_drift += 1
            return False
        return True

    def waiting_in(self, chats: set[bytes]) -> list[MsgV1]:
        """What leaves the room at or below this replica's GC horizon is dropped: it passed
        the retention cutoff when it arrived, the GC may have passed it since, and a node's
        store refuses it then (``expire_before_ms``). Other paths in are filtered at ingress,
        so that a planted bug that skips the cutoff shows as resurrections."""
        waiting = super().waiting_in(chats)
        if not self.rules.retention_filter:
            return waiting
        # deletes never expire (MESSAGES.md): only what the GC collects is dropped
        horizon = self.horizon
        return [m for m in waiting if m.kind is MessageKind.DELETE or m.hlc.physical_ms > horizon]

    # --- MemoryReplica's hooks ---

    def _put_message(self, msg: MsgV1) -> None:
        msg = self.ctx.interned.setdefault(msg.msg_id, msg)
        if msg.msg_id in self.erased:  # the rule refuses it before: only a planted bug gets here
            self.counters.resurrected_deleted += 1
        super()._put_message(msg)
        if self.rules.edit_by_arrival:
            self._arrival[msg.msg_id] = len(self._arrival)
        physical = msg.hlc.physical_ms
        if physical <= self.horizon:
            self.counters.resurrected += 1
        heapq.heappush(self._by_time, (physical, msg.msg_id))
        if self.rules.decide_on_arrival:
            self._shown_on_arrival[msg.msg_id] = self.member_active((msg.chat_id, msg.sender))

    def _add_member_op(self, op_id: bytes, op: MembershipOp) -> None:
        super()._add_member_op(op_id, self.ctx.member_ops.setdefault(op_id, op))
        self._undo.append((self.t_ms, MEMBERS, op_id, None))

    def _add_index_entry(self, op_id: bytes, op: MembershipOp) -> None:
        super()._add_index_entry(op_id, self.ctx.member_ops.setdefault(op_id, op))
        self._undo.append((self.t_ms, INDEX, op_id, None))

    def _mark_erased(self, msg_id: bytes) -> None:
        super()._mark_erased(msg_id)  # a crash takes it back out with the delete that erased it
        self._undo.append((self.t_ms, ERASED, msg_id, None))

    def views(self, chat_ids: Iterable[bytes]) -> dict[bytes, ChatView]:
        views = super().views(chat_ids)
        if not self.rules.edit_by_arrival:
            return views
        return {
            chat: ChatView([self._edited_by_arrival(i) for i in view.items], view.read_positions)
            for chat, view in views.items()
        }

    def _edited_by_arrival(self, item: Any) -> Any:
        """BUG: the applying edit that arrived last decides, not the greatest (hlc, id)."""
        if not isinstance(item, MessageView):
            return item
        target = item.msg
        edits = [
            self.messages[i]
            for i in self.refs.get(target.msg_id, ())
            if self.messages[i].kind is MessageKind.EDIT
            and edit_applies(self.messages[i], target)
            and self._visible(self.messages[i])
        ]
        if not edits:
            return item
        return replace(item, edit=max(edits, key=lambda e: self._arrival.get(e.msg_id, -1)))

    def _merge_member_states(
        self, local: MemberInfo | None, remote: MemberInfo
    ) -> MemberInfo | None:
        return self.rules.merge_member(local, remote)

    def _visible(self, msg: MsgV1) -> bool:
        if self.rules.decide_on_arrival:
            return self._shown_on_arrival.get(msg.msg_id, False)
        return super()._visible(msg)

    def _listed(self, domain: Domain, record_id: bytes) -> None:
        super()._listed(domain, record_id)  # into the shard-wide bucket index
        if self.counting and domain is not INDEX:  # the index repeats member ops' ids
            self.ctx.gained(record_id)

    def _unlisted(self, domain: Domain, record_id: bytes) -> None:
        """The shard-wide bucket index keeps the id: other replicas may hold it."""
        if self.counting and domain is not INDEX:
            self.ctx.lost(record_id)

    def _wrote(self, domain: Domain, key: Any, before: Any) -> None:
        if domain is not MEMBERS:  # a row is a fold of the ops: _add_member_op logs the op
            self._undo.append((self.t_ms, domain, key, before))

    # --- durability ---

    def flush(self) -> None:
        """Everything written so far is durable (a flush, a local write's WAL sync, a GC batch)."""
        self._undo.clear()

    def crash(self, flushed_at: int) -> int:
        """Roll back every write made after ``flushed_at`` and lose the waiting room; return
        how many writes were rolled back."""
        undone = 0
        refold: set[Key] = set()
        while self._undo and self._undo[-1][0] > flushed_at:
            _, domain, key, before = self._undo.pop()
            if domain is ERASED:  # refused on arrival: it may arrive again
                self.erased.discard(key)
            elif domain is MESSAGES and before is not None:  # erased: it is back
                self.erased.discard(key)
                self._restore_message(before)
            elif domain is MESSAGES:
                self._drop_message(key)
                self._shown_on_arrival.pop(key, None)
            elif domain is DELETES:
                self._drop_delete(key)
            elif domain is MEMBERS:
                op = self.member_ops[key]
                self._drop_member_op(key)
                refold.add((op.chat_id, op.user_id))
            elif domain is INDEX:
                self._drop_index_entry(key)
            else:
                self._set_identity(key, self.identities.get(key), before)
            undone += 1
        self._undo.clear()
        self._refold(refold)
        self.counters.waiting_lost += len(self.waiting)
        self.waiting = WaitingRoom()
        self.counters.rolled_back += undone
        return undone

    def _restore_message(self, msg: MsgV1) -> None:
        self.messages[msg.msg_id] = msg
        if msg.ref is not None:
            self.refs.setdefault(msg.ref, set()).add(msg.msg_id)
        self._index(MESSAGES, None, msg.msg_id, msg.msg_id)
        self._shard_change(MESSAGES, msg.chat_id, None, msg.msg_id)  # per-shard leaves too
        heapq.heappush(self._by_time, (msg.hlc.physical_ms, msg.msg_id))

    def _refold(self, keys: set[Key]) -> None:
        """Rows, histories and DM parties of ``keys`` again from the ops still held."""
        if not keys:
            return
        left: dict[Key, list[MembershipOp]] = {key: [] for key in keys}
        chats = {chat for chat, _ in keys}
        parties: dict[bytes, bytes] = {}
        for op in self.member_ops.values():
            key = (op.chat_id, op.user_id)
            if key in left:
                left[key].append(op)
            if op.chat_id in chats and isinstance(op.proof, DmProof):
                pair = sorted((op.proof.user_a, op.proof.user_b))
                parties.setdefault(op.chat_id, b"".join(pair))
        for key, ops in left.items():
            row: MemberInfo | None = None
            for op in ops:
                row = self._merge_member_states(row, op.state())
            if row is None:
                self.members.pop(key, None)
            else:
                self.members[key] = row
            history = MemberHistory.of((op.hlc, op.action is MembershipAction.ADD) for op in ops)
            if history == NO_HISTORY:
                self.histories.pop(key, None)
            else:
                self.histories[key] = history
        for chat in chats:
            if chat in parties:
                self.parties[chat] = parties[chat]
            else:
                self.parties.pop(chat, None)
            # who may delete others' messages, from the ops still held (a crash took some)
            admins = admin_state_of(op for op in self.member_ops.values() if op.chat_id == chat)
            if admins == NO_ADMINS:
                self.admin_states.pop(chat, None)
            else:
                self.admin_states[chat] = admins

    # --- retention ---

    def collect_messages(self, cutoff_ms: int) -> int:
        """GC: delete messages with HLC physical time <= cutoff (retention_model calls this)."""
        heap, removed = self._by_time, 0
        while heap and heap[0][0] <= cutoff_ms:
            _, msg_id = heapq.heappop(heap)
            msg = self.messages.get(msg_id)
            if msg is not None and msg.hlc.physical_ms <= cutoff_ms:
                self._drop_message(msg_id)
                self._shown_on_arrival.pop(msg_id, None)
                removed += 1
        self.counters.collected += removed
        return removed

    # --- membership in the divergence metric ---

    def set_counting(self, counting: bool) -> None:
        """Join or leave the honest-live set: add or withdraw every held id from the metric."""
        if counting == self.counting:
            return
        self.counting = counting
        change = self.ctx.gained if counting else self.ctx.lost
        for domain in Domain:
            if domain is INDEX:  # not counted (``_listed``)
                continue
            for record_id in self.record_ids(domain):
                change(record_id)

    # --- the check reads ---

    def member_active(self, key: Key) -> bool:
        info = self.members.get(key)
        return info is not None and self.rules.member_active(info)

    def member_row_version(self, key: Key) -> bytes | None:
        """The row's state as one id (``member_record_id``): equal rows, equal ids."""
        info = self.members.get(key)
        if info is None:
            return None
        row = (key[0], key[1], info)
        row_ids = self.ctx.row_ids  # most replicas hold the same version of a row
        row_id = row_ids.get(row)
        if row_id is None:
            row_id = row_ids[row] = member_record_id(*row)
        return row_id

    def identity_record_id(self, user: bytes) -> bytes | None:
        stored = self.identities.get(user)
        return None if stored is None else compute_identity_record_id(user, *stored)
