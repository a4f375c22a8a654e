"""A simulated node's replica: ``sync.replica.MemoryReplica``'s job, with what a simulation needs.

It implements the ``sync.replica.Replica`` protocol the sync sessions drive, and
applies records through ``Rules`` (``store.merge`` unless a planted bug swaps a
piece), keeping one ``MerkleTree`` per domain in step, as ``MemoryReplica`` does
(``tests/sim/test_replica.py`` asserts the two agree record for record). On top:

* **Drift check on every record a session applies** (``HlcClock.check_drift``
  against the node's local physical time). Sessions skip far-future records
  themselves (``SyncConfig.max_offset_ms``); this check is a second line that
  also advances the replica's HLC.
* **Durability**: writes received from peers go to an undo log until the next
  flush; ``crash()`` rolls back whatever was not flushed.
* **Retention**: ``collect_messages`` (the GC) and the resurrection counter.
* **Memory for hundreds of replicas per process**: decoded messages are shared
  between replicas, bucket listings come from one shard-wide index, and the
  small member and identity trees use dict-backed levels (``SparseMerkleTree``:
  ``MerkleTree``'s own code over sparse storage).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sim.bugs import Rules
from sim.trees import SparseMerkleTree
from store.errors import ClockDriftError
from store.hlc import Hlc, HlcClock
from store.records import (
    IdentityRecord,
    MemberInfo,
    MemberRecord,
    MsgV1,
    compute_identity_record_id,
    member_record_id,
)
from sync.frames import Domain
from sync.merkle import MerkleTree
from sync.replica import Record

MESSAGES, MEMBERS, IDENTITY = Domain.MESSAGES, Domain.MEMBERS, Domain.IDENTITY


def _bucket(record_id: bytes) -> int:
    return (record_id[0] << 8) | record_id[1]


@dataclass
class ShardContext:
    """What all replicas of one shard share: a bucket index, decoded messages, the metrics."""

    max_offset_ms: int
    buckets: dict[Domain, defaultdict[int, set[bytes]]] = field(
        default_factory=lambda: {d: defaultdict(set) for d in Domain}
    )
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


class SimReplica:
    """One node's replica within one shard."""

    def __init__(self, ctx: ShardContext, rules: Rules, clock: HlcClock) -> None:
        self.ctx = ctx
        self.rules = rules
        self.clock = clock
        self.trees: dict[Domain, MerkleTree] = {
            MESSAGES: rules.message_tree(),
            MEMBERS: SparseMerkleTree(),
            IDENTITY: SparseMerkleTree(),
        }
        self.messages: dict[bytes, MsgV1] = {}
        self.members: dict[tuple[bytes, bytes], MemberInfo] = {}
        self.identities: dict[bytes, tuple[Hlc, bytes]] = {}
        self._ids: dict[Domain, dict[bytes, Any]] = {MEMBERS: {}, IDENTITY: {}}  # id -> row key
        self.now_ms = 0  # local physical time of the current event (drift checks)
        self.horizon = 0  # retention: highest cutoff collected at
        self.counting = True  # contributes to ShardContext.holders (honest and live)
        self.counters = Counters()
        self._undo: list[tuple[int, Domain, Any, Any]] = []  # (t, domain, key, before)
        self._by_time: list[tuple[int, bytes]] = []  # (physical_ms, msg_id) heap for the GC
        self.t_ms = 0  # true time of the current event (undo log)

    # --- the Replica protocol ---

    def tree(self, domain: Domain) -> MerkleTree:
        return self.trees[domain]

    def holds(self, domain: Domain, record_id: bytes) -> bool:
        if domain is MESSAGES:
            return record_id in self.messages
        return record_id in self._ids[domain]

    def record_ids(self, domain: Domain) -> list[bytes]:
        return list(self.messages) if domain is MESSAGES else list(self._ids[domain])

    def bucket_ids(self, domain: Domain, bucket: int, cutoff_ms: int | None) -> list[bytes]:
        known = self.ctx.buckets[domain].get(bucket, ())
        if domain is MESSAGES:
            msgs = self.messages
            if cutoff_ms is None:
                return sorted(i for i in known if i in msgs)
            return sorted(i for i in known if i in msgs and msgs[i].hlc.physical_ms > cutoff_ms)
        ids = self._ids[domain]
        return sorted(i for i in known if i in ids)

    def get_records(
        self, domain: Domain, ids: list[bytes], cutoff_ms: int | None
    ) -> list[bytes | None]:
        out: list[bytes | None] = []
        for record_id in ids:
            if domain is MESSAGES:
                msg = self.messages.get(record_id)
                old = msg is not None and cutoff_ms is not None and msg.hlc.physical_ms <= cutoff_ms
                out.append(None if msg is None or old else msg.encoded)
                continue
            row = self._ids[domain].get(record_id)
            if row is None:
                out.append(None)
            elif domain is MEMBERS:
                out.append(MemberRecord(row[0], row[1], self.members[row]).encode())
            else:
                out.append(IdentityRecord(row, *self.identities[row]).encode())
        return out

    def apply(self, domain: Domain, records: list[Record]) -> int:
        """Records from a sync session: drift-checked, merged, not yet durable."""
        changed = 0
        for record in records:
            if self.rules.check_drift and not self._within_offset(record):
                continue
            changed += self.apply_record(record)
        return changed

    # --- applying one record ---

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

    def apply_record(self, record: Record) -> bool:
        if isinstance(record, MsgV1):
            return self._put_message(record)
        if isinstance(record, MemberRecord):
            return self._merge_member((record.chat_id, record.user_id), record.info)
        return self._put_identity(record.user_id, record.hlc, record.blob)

    def _put_message(self, msg: MsgV1) -> bool:
        msg_id = msg.msg_id
        if msg_id in self.messages:
            return False
        msg = self.ctx.interned.setdefault(msg_id, msg)
        self.messages[msg_id] = msg
        physical = msg.hlc.physical_ms
        if physical <= self.horizon:
            self.counters.resurrected += 1
        heapq.heappush(self._by_time, (physical, msg_id))
        self._index(MESSAGES, None, msg_id, msg_id)
        self._log(MESSAGES, msg_id, None)
        return True

    def _merge_member(self, key: tuple[bytes, bytes], info: MemberInfo) -> bool:
        before = self.members.get(key)
        after = self.rules.merge_member(before, info)
        if after is None or after == before:
            return False
        self._set_member(key, before, after)
        self._log(MEMBERS, key, before)
        return True

    def _set_member(
        self, key: tuple[bytes, bytes], before: MemberInfo | None, after: MemberInfo | None
    ) -> None:
        if after is None:
            del self.members[key]
        else:
            self.members[key] = after
        old = None if before is None else self._member_id(key, before)
        new = None if after is None else self._member_id(key, after)
        self._index(MEMBERS, old, new, key)

    def _put_identity(self, user: bytes, hlc: Hlc, blob: bytes) -> bool:
        stored = self.identities.get(user)
        if not self.rules.identity_wins((hlc, blob), stored):
            return False
        if stored is not None and stored == (hlc, blob):
            return False
        self._set_identity(user, stored, (hlc, blob))
        self._log(IDENTITY, user, stored)
        return True

    def _set_identity(
        self, user: bytes, before: tuple[Hlc, bytes] | None, after: tuple[Hlc, bytes] | None
    ) -> None:
        if after is None:
            del self.identities[user]
        else:
            self.identities[user] = after
        old = None if before is None else compute_identity_record_id(user, *before)
        new = None if after is None else compute_identity_record_id(user, *after)
        self._index(IDENTITY, old, new, user)

    def _index(self, domain: Domain, old: bytes | None, new: bytes | None, row: Any) -> None:
        if old == new:
            return
        ids = None if domain is MESSAGES else self._ids[domain]
        if old is not None:
            if ids is not None:
                del ids[old]
            if self.counting:
                self.ctx.lost(old)
        if new is not None:
            if ids is not None:
                ids[new] = row
            self.ctx.buckets[domain][_bucket(new)].add(new)
            if self.counting:
                self.ctx.gained(new)
        self.trees[domain].replace(old, new)

    # --- durability ---

    def _log(self, domain: Domain, key: Any, before: Any) -> None:
        self._undo.append((self.t_ms, domain, key, before))

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

    def _drop_message(self, msg_id: bytes) -> None:
        del self.messages[msg_id]
        self._index(MESSAGES, msg_id, None, msg_id)

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

    def member_active(self, key: tuple[bytes, bytes]) -> bool | None:
        info = self.members.get(key)
        return None if info is None else self.rules.member_active(info)

    def member_record_id(self, key: tuple[bytes, bytes]) -> bytes | None:
        info = self.members.get(key)
        return None if info is None else self._member_id(key, info)

    def _member_id(self, key: tuple[bytes, bytes], info: MemberInfo) -> bytes:
        """``member_record_id``, remembered shard-wide (it hashes both signed proofs)."""
        cache = self.ctx.member_ids
        record_id = cache.get((key, info))
        if record_id is None:
            record_id = cache[(key, info)] = member_record_id(key[0], key[1], info)
        return record_id

    def identity_record_id(self, user: bytes) -> bytes | None:
        stored = self.identities.get(user)
        return None if stored is None else compute_identity_record_id(user, *stored)
