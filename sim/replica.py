"""A simulated node's replica: ``sync.replica.MemoryReplica`` with what a simulation needs.

``SimReplica`` is a ``MemoryReplica`` — the same dicts, record-id index, merge
steps and trees in step — with its hooks set for the simulator:

* **Rules**: merges and the message rule (admissible: stored; visible: shown)
  through ``Rules`` (``store.merge`` and ``store.access`` unless a planted bug
  swaps a piece, ``sim/bugs.py``), and the message tree is ``Rules.message_tree``.
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
  messages leaving the waiting room, so that a planted bug that skips it shows
  as resurrections.
* **The divergence metric**: records entering and leaving honest live replicas
  are counted shard-wide (``ShardContext.holders``).
* **Memory for hundreds of replicas per process**: decoded messages are shared
  between replicas, and so are decoded member ops; bucket listings come from one
  shard-wide index (filtered by what this replica holds), and the small member
  and identity trees use dict-backed levels (``SparseMerkleTree``: ``MerkleTree``'s
  own code over sparse storage).

``tests/sim/test_replica.py`` asserts that with the real rules it agrees with a
plain ``MemoryReplica`` record for record.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sim.bugs import Rules
from sim.trees import SparseMerkleTree
from store.access import NO_HISTORY, MemberHistory
from store.authz import DmProof
from store.errors import ClockDriftError
from store.hlc import Hlc, HlcClock
from store.kinds import ChatView, IsAdmin, MessageView, edit_applies
from store.ops import MembershipAction, MembershipOp
from store.records import (
    MemberInfo,
    MessageKind,
    MsgV1,
    Role,
    blake3_id,
    compute_identity_record_id,
    member_record_id,
)
from store.waiting import WaitingRoom
from sync.frames import Domain
from sync.replica import (
    DELETES,
    IDENTITY,
    MEMBERS,
    MESSAGES,
    BucketIndex,
    MemoryReplica,
    Record,
    new_bucket_index,
)

__all__ = ["IDENTITY", "MEMBERS", "MESSAGES", "Counters", "ShardContext", "SimReplica"]

Key = tuple[bytes, bytes]  # (chat, user)
ERASED = "erased"  # undo-log entries: a message refused on arrival as erased


@dataclass
class ShardContext:
    """What all replicas of one shard share: a bucket index, decoded records, the metrics."""

    max_offset_ms: int
    buckets: BucketIndex = field(default_factory=new_bucket_index)  # only grows
    interned: dict[bytes, MsgV1] = field(default_factory=dict)
    member_ops: dict[bytes, MembershipOp] = field(default_factory=dict)  # op id -> op
    # Divergence: how many honest live replicas hold each record id.
    holders: dict[bytes, int] = field(default_factory=dict)
    held: int = 0  # sum of holders

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


class _Waiting(WaitingRoom):
    """The waiting room, where a message leaving it at or below its replica's GC horizon is
    dropped: it passed the retention cutoff when it arrived, the GC may have passed it since,
    and a node's store refuses it then (``expire_before_ms``). Other paths in are filtered at
    ingress, so that a planted bug that skips the cutoff shows as resurrections."""

    def __init__(self, replica: SimReplica) -> None:
        super().__init__()
        self.replica = replica

    def release_chats(self, chat_ids: set[bytes]) -> list[MsgV1]:
        released = super().release_chats(chat_ids)
        replica = self.replica
        if not replica.rules.retention_filter:
            return released
        # deletes never expire (MESSAGES.md): only what the GC collects is dropped
        return [
            m
            for m in released
            if m.kind is MessageKind.DELETE or m.hlc.physical_ms > replica.horizon
        ]


class SimReplica(MemoryReplica):
    """One node's replica within one shard."""

    def __init__(self, ctx: ShardContext, rules: Rules, clock: HlcClock) -> None:
        trees = {
            MESSAGES: rules.message_tree(),
            MEMBERS: SparseMerkleTree(),
            IDENTITY: SparseMerkleTree(),
            DELETES: SparseMerkleTree(),
        }
        super().__init__(trees, ctx.buckets, _Waiting(self))
        self.ctx = ctx
        self.rules = rules
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

    # --- MemoryReplica's hooks ---

    def _put_message(self, msg: MsgV1) -> bool:
        msg = self.ctx.interned.setdefault(msg.msg_id, msg)
        if msg.msg_id in self.erased:  # the rule refuses it before: only a planted bug gets here
            self.counters.resurrected_deleted += 1
        if not super()._put_message(msg):
            return False
        if self.rules.edit_by_arrival:
            self._arrival[msg.msg_id] = len(self._arrival)
        physical = msg.hlc.physical_ms
        if physical <= self.horizon:
            self.counters.resurrected += 1
        heapq.heappush(self._by_time, (physical, msg.msg_id))
        if self.rules.decide_on_arrival:
            self._shown_on_arrival[msg.msg_id] = self.member_active((msg.chat_id, msg.sender))
        return True

    def _add_member_op(
        self, op: MembershipOp, promoted: set[tuple[bytes, bytes]] | None = None
    ) -> bool:
        op_id = blake3_id(op.encode())
        op = self.ctx.member_ops.setdefault(op_id, op)
        if not super()._add_member_op(op, promoted):
            return False
        self._undo.append((self.t_ms, MEMBERS, op_id, None))
        return True

    def _erased_on_arrival(self, msg: MsgV1) -> bool:
        known = msg.msg_id in self.erased
        erased = super()._erased_on_arrival(msg)
        if erased and not known:  # a crash takes it back out with the delete that erased it
            self._undo.append((self.t_ms, ERASED, msg.msg_id, None))
        return erased

    def admins(self, chat_id: bytes) -> IsAdmin:
        if self.rules.anyone_may_delete:
            return lambda user, hlc: True
        return super().admins(chat_id)

    def view(self, chat_id: bytes) -> ChatView:
        view = super().view(chat_id)
        if not self.rules.edit_by_arrival:
            return view
        return ChatView([self._edited_by_arrival(i) for i in view.items], view.read_positions)

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

    def _identity_wins(self, incoming: tuple[Hlc, bytes], stored: tuple[Hlc, bytes] | None) -> bool:
        return self.rules.identity_wins(incoming, stored)

    def _admissible(self, msg: MsgV1) -> bool:
        return self.rules.admissible(msg, self.access(msg.chat_id, msg.sender))

    def _visible(self, msg: MsgV1) -> bool:
        if self.rules.decide_on_arrival:
            return self._shown_on_arrival.get(msg.msg_id, False)
        return self.rules.visible(msg, self.access(msg.chat_id, msg.sender))

    def _listed(self, domain: Domain, record_id: bytes) -> None:
        super()._listed(domain, record_id)  # into the shard-wide bucket index
        if self.counting:
            self.ctx.gained(record_id)

    def _unlisted(self, domain: Domain, record_id: bytes) -> None:
        """The shard-wide bucket index keeps the id: other replicas may hold it."""
        if self.counting:
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
                op = self.member_ops.pop(key)
                self._index(MEMBERS, key, None, key)
                refold.add((op.chat_id, op.user_id))
            else:
                self._set_identity(key, self.identities.get(key), before)
            undone += 1
        self._undo.clear()
        self._refold(refold)
        self.counters.waiting_lost += len(self.waiting)
        self.waiting = _Waiting(self)
        self.counters.rolled_back += undone
        return undone

    def _restore_message(self, msg: MsgV1) -> None:
        self.messages[msg.msg_id] = msg
        if msg.ref is not None:
            self.refs.setdefault(msg.ref, set()).add(msg.msg_id)
        self._index(MESSAGES, None, msg.msg_id, msg.msg_id)
        heapq.heappush(self._by_time, (msg.hlc.physical_ms, msg.msg_id))

    def _drop_delete(self, delete_id: bytes) -> None:
        delete = self.deletes.pop(delete_id)
        assert delete.ref is not None
        self.deletes_by_ref[delete.ref].remove(delete)
        self._index(DELETES, delete_id, None, delete_id)

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
                self.dm_parties[chat] = parties[chat]
            else:
                self.dm_parties.pop(chat, None)
        self._refold_admins(keys, chats)

    def _refold_admins(self, keys: set[Key], chats: set[bytes]) -> None:
        """Who may delete others' messages, from the ops still held (a crash took some)."""
        for key in keys:
            self.admin_since.pop(key, None)
        for chat in chats:
            self.creators.pop(chat, None)
        for op in self.member_ops.values():
            key = (op.chat_id, op.user_id)
            proof = op.proof
            if op.chat_id in chats and proof is not None and not isinstance(proof, DmProof):
                self.creators.setdefault(op.chat_id, proof.creator)
            if key in keys and op.action is MembershipAction.ADD and op.role is Role.ADMIN:
                first = self.admin_since.get(key)
                if first is None or op.hlc < first:
                    self.admin_since[key] = op.hlc

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
            for record_id in self.record_ids(domain):
                change(record_id)

    # --- the check reads ---

    def member_active(self, key: Key) -> bool:
        info = self.members.get(key)
        return info is not None and self.rules.member_active(info)

    def member_row_version(self, key: Key) -> bytes | None:
        """The row's state as one id (``member_record_id``): equal rows, equal ids."""
        info = self.members.get(key)
        return None if info is None else member_record_id(key[0], key[1], info)

    def identity_record_id(self, user: bytes) -> bytes | None:
        stored = self.identities.get(user)
        return None if stored is None else compute_identity_record_id(user, *stored)
