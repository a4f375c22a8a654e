"""A simulated node's replica: ``sync.replica.MemoryReplica`` with what a simulation needs.

``SimReplica`` is a ``MemoryReplica`` — the same dicts, record-id index, merge
steps and trees in step — with its hooks set for the simulator:

* **Rules**: merges through ``Rules`` (``store.merge`` unless a planted bug swaps
  a piece, ``sim/bugs.py``), and the message tree is ``Rules.message_tree``.
* **Drift check on every record a session applies** (``HlcClock.check_drift``
  against the node's local physical time). Sessions skip far-future records
  themselves (``SyncConfig.max_offset_ms``); this check is a second line.
* **Durability**: writes received from peers go to an undo log until the next
  flush; ``crash()`` rolls back whatever was not flushed.
* **Retention**: ``collect_messages`` (the GC, ``sim/retention_model.py``) and
  the resurrection counter. The replica itself refuses nothing as too old
  (``expire_before_ms`` stays None): the cutoff is applied at ingress, so that a
  planted bug that skips it shows as resurrections.
* **The divergence metric**: records entering and leaving honest live replicas
  are counted shard-wide (``ShardContext.holders``).
* **Memory for hundreds of replicas per process**: decoded messages are shared
  between replicas, bucket listings come from one shard-wide index (filtered by
  what this replica holds), member record ids are remembered shard-wide, and the
  small member and identity trees use dict-backed levels (``SparseMerkleTree``:
  ``MerkleTree``'s own code over sparse storage).

``tests/sim/test_replica.py`` asserts that with the real rules it agrees with a
plain ``MemoryReplica`` record for record.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

from sim.bugs import Rules
from sim.trees import SparseMerkleTree
from store.errors import ClockDriftError
from store.hlc import Hlc, HlcClock
from store.records import (
    MemberInfo,
    MemberRecord,
    MsgV1,
    compute_identity_record_id,
    member_record_id,
)
from sync.frames import Domain
from sync.replica import (
    IDENTITY,
    MEMBERS,
    MESSAGES,
    BucketIndex,
    MemoryReplica,
    Record,
    new_bucket_index,
)

__all__ = ["IDENTITY", "MEMBERS", "MESSAGES", "Counters", "ShardContext", "SimReplica"]


@dataclass
class ShardContext:
    """What all replicas of one shard share: a bucket index, decoded messages, the metrics."""

    max_offset_ms: int
    buckets: BucketIndex = field(default_factory=new_bucket_index)  # only grows
    interned: dict[bytes, MsgV1] = field(default_factory=dict)
    member_ids: dict[tuple[tuple[bytes, bytes], MemberInfo], bytes] = field(default_factory=dict)
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


class SimReplica(MemoryReplica):
    """One node's replica within one shard."""

    def __init__(self, ctx: ShardContext, rules: Rules, clock: HlcClock) -> None:
        trees = {
            MESSAGES: rules.message_tree(),
            MEMBERS: SparseMerkleTree(),
            IDENTITY: SparseMerkleTree(),
        }
        super().__init__(trees, ctx.buckets)
        self.ctx = ctx
        self.rules = rules
        self.clock = clock
        self.now_ms = 0  # local physical time of the current event (drift checks)
        self.horizon = 0  # retention: highest cutoff collected at
        self.counting = True  # contributes to ShardContext.holders (honest and live)
        self.counters = Counters()
        self._undo: list[tuple[int, Domain, Any, Any]] = []  # (t, domain, key, before)
        self._by_time: list[tuple[int, bytes]] = []  # (physical_ms, msg_id) heap for the GC
        self.t_ms = 0  # true time of the current event (undo log)

    def apply(self, domain: Domain, records: list[Record]) -> int:
        """Records from a sync session: drift-checked, merged, not yet durable."""
        if self.rules.check_drift:
            records = [r for r in records if self._within_offset(r)]
        return super().apply(domain, records)

    def _within_offset(self, record: Record) -> bool:
        if isinstance(record, MemberRecord):
            info = record.info
            stamp = max(info.added_at, info.removed_at or info.added_at)
        else:
            stamp = record.hlc
        try:
            self.clock.check_drift(stamp, self.now_ms)
        except ClockDriftError:
            self.counters.rejected_drift += 1
            return False
        return True

    # --- MemoryReplica's hooks ---

    def _put_message(self, msg: MsgV1) -> bool:
        msg = self.ctx.interned.setdefault(msg.msg_id, msg)
        if not super()._put_message(msg):
            return False
        physical = msg.hlc.physical_ms
        if physical <= self.horizon:
            self.counters.resurrected += 1
        heapq.heappush(self._by_time, (physical, msg.msg_id))
        return True

    def _merge_member_states(
        self, local: MemberInfo | None, remote: MemberInfo
    ) -> MemberInfo | None:
        return self.rules.merge_member(local, remote)

    def _identity_wins(self, incoming: tuple[Hlc, bytes], stored: tuple[Hlc, bytes] | None) -> bool:
        return self.rules.identity_wins(incoming, stored)

    def _member_id(self, key: tuple[bytes, bytes], info: MemberInfo) -> bytes:
        """``member_record_id``, remembered shard-wide (it hashes both signed proofs)."""
        cache = self.ctx.member_ids
        record_id = cache.get((key, info))
        if record_id is None:
            record_id = cache[(key, info)] = member_record_id(key[0], key[1], info)
        return record_id

    def _listed(self, domain: Domain, record_id: bytes) -> None:
        super()._listed(domain, record_id)  # into the shard-wide bucket index
        if self.counting:
            self.ctx.gained(record_id)

    def _unlisted(self, domain: Domain, record_id: bytes) -> None:
        """The shard-wide bucket index keeps the id: other replicas may hold it."""
        if self.counting:
            self.ctx.lost(record_id)

    def _wrote(self, domain: Domain, key: Any, before: Any) -> None:
        self._undo.append((self.t_ms, domain, key, before))

    # --- durability ---

    def flush(self) -> None:
        """Everything written so far is durable (a flush, a local write's WAL sync, a GC batch)."""
        self._undo.clear()

    def crash(self, flushed_at: int) -> int:
        """Roll back every write made after ``flushed_at``; return how many."""
        undone = 0
        while self._undo and self._undo[-1][0] > flushed_at:
            _, domain, key, before = self._undo.pop()
            if domain is MESSAGES:
                self._drop_message(key)
            elif domain is MEMBERS:
                self._set_member(key, self.members.get(key), before)
            else:
                self._set_identity(key, self.identities.get(key), before)
            undone += 1
        self._undo.clear()
        self.counters.rolled_back += undone
        return undone

    # --- retention ---

    def collect_messages(self, cutoff_ms: int) -> int:
        """GC: delete messages with HLC physical time <= cutoff (retention_model calls this)."""
        heap, removed = self._by_time, 0
        while heap and heap[0][0] <= cutoff_ms:
            _, msg_id = heapq.heappop(heap)
            msg = self.messages.get(msg_id)
            if msg is not None and msg.hlc.physical_ms <= cutoff_ms:
                self._drop_message(msg_id)
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

    def member_active(self, key: tuple[bytes, bytes]) -> bool | None:
        info = self.members.get(key)
        return None if info is None else self.rules.member_active(info)

    def member_record_id(self, key: tuple[bytes, bytes]) -> bytes | None:
        info = self.members.get(key)
        return None if info is None else self._member_id(key, info)

    def identity_record_id(self, user: bytes) -> bytes | None:
        stored = self.identities.get(user)
        return None if stored is None else compute_identity_record_id(user, *stored)
