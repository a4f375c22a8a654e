"""The narrow storage interface a sync session needs, and two implementations.

``Replica`` is what the protocol reads and writes: a tree per domain, the ids
of one bucket, encoded records by id, and "apply these validated records".
``MemoryReplica`` keeps everything in dicts (tests, benchmarks, simulator);
``DbReplica`` drives a ``ChatDb`` handed to it. Both apply records through the
store's merge rules and keep their trees in step with what they store, and a
test asserts they agree (same roots after the same ops).

``cutoff_ms`` is the retention soft-filter: messages whose HLC physical time is
at or below it are neither listed nor returned (members and identity have no cutoff).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from store.hlc import Hlc
from store.merge import identity_wins, merge_member_states
from store.ops import MembershipOp, Op
from store.records import (
    IdentityRecord,
    MemberInfo,
    MemberRecord,
    MsgV1,
    compute_identity_record_id,
    member_record_id,
)
from store.retention import expire_seen, iter_seen_aged, trim_chats
from sync.frames import Domain
from sync.merkle import MerkleTree

if TYPE_CHECKING:  # a ChatDb is passed in; sync never imports rocksdict itself
    from store.chatdb import ChatDb

Record = MsgV1 | MemberRecord | IdentityRecord


class Replica(Protocol):
    def tree(self, domain: Domain) -> MerkleTree: ...

    def bucket_ids(self, domain: Domain, bucket: int, cutoff_ms: int | None) -> list[bytes]: ...

    def get_records(
        self, domain: Domain, ids: list[bytes], cutoff_ms: int | None
    ) -> list[bytes | None]: ...

    def apply(self, domain: Domain, records: list[Record]) -> int:
        """Merge validated records into the store and its tree; return how many changed it."""
        ...


def _bucket(record_id: bytes) -> int:
    return (record_id[0] << 8) | record_id[1]


class MemoryReplica:
    """A whole replica in dicts, merged by the same rules as ChatDb."""

    def __init__(self) -> None:
        self.expire_before_ms: int | None = None  # retention: older messages are refused
        self.trees = {d: MerkleTree() for d in Domain}
        self.messages: dict[bytes, MsgV1] = {}
        self.members: dict[tuple[bytes, bytes], MemberInfo] = {}
        self.identities: dict[bytes, tuple[Hlc, bytes]] = {}
        self._index: dict[Domain, dict[bytes, bytes]] = {d: {} for d in Domain}  # id -> row key
        self._buckets: dict[Domain, defaultdict[int, set[bytes]]] = {
            d: defaultdict(set) for d in Domain
        }

    def tree(self, domain: Domain) -> MerkleTree:
        return self.trees[domain]

    def record_ids(self, domain: Domain) -> list[bytes]:
        return list(self._index[domain])

    def _index_replace(self, domain: Domain, old: bytes | None, new: bytes, row: bytes) -> None:
        if old == new:
            return
        if old is not None:
            del self._index[domain][old]
            self._buckets[domain][_bucket(old)].discard(old)
        self._index[domain][new] = row
        self._buckets[domain][_bucket(new)].add(new)
        self.trees[domain].replace(old, new)

    def bucket_ids(self, domain: Domain, bucket: int, cutoff_ms: int | None) -> list[bytes]:
        ids = sorted(self._buckets[domain].get(bucket, ()))
        if domain is Domain.MESSAGES and cutoff_ms is not None:
            ids = [i for i in ids if self.messages[i].hlc.physical_ms > cutoff_ms]
        return ids

    def get_records(
        self, domain: Domain, ids: list[bytes], cutoff_ms: int | None
    ) -> list[bytes | None]:
        out: list[bytes | None] = []
        for record_id in ids:
            row = self._index[domain].get(record_id)
            if row is None:
                out.append(None)
            elif domain is Domain.MESSAGES:
                msg = self.messages[record_id]
                too_old = cutoff_ms is not None and msg.hlc.physical_ms <= cutoff_ms
                out.append(None if too_old else msg.encoded)
            elif domain is Domain.MEMBERS:
                chat, user = row[:32], row[32:]
                out.append(MemberRecord(chat, user, self.members[(chat, user)]).encode())
            else:
                out.append(IdentityRecord(row, *self.identities[row]).encode())
        return out

    def apply(self, domain: Domain, records: list[Record]) -> int:
        changed = 0
        for record in records:
            changed += self._apply_one(record)
        return changed

    def _apply_one(self, record: Record) -> bool:
        if isinstance(record, MsgV1):
            if record.msg_id in self.messages:
                return False
            expire = self.expire_before_ms
            if expire is not None and record.hlc.physical_ms <= expire:
                return False  # GC removed (or would remove) it: never store it again
            self.messages[record.msg_id] = record
            self._index_replace(Domain.MESSAGES, None, record.msg_id, record.msg_id)
            return True
        if isinstance(record, MemberRecord):
            key = (record.chat_id, record.user_id)
            before = self.members.get(key)
            after = merge_member_states(before, record.info)
            assert after is not None
            if after == before:
                return False
            self.members[key] = after
            old = None if before is None else _member_id(key, before)
            self._index_replace(Domain.MEMBERS, old, _member_id(key, after), b"".join(key))
            return True
        stored = self.identities.get(record.user_id)
        if not identity_wins((record.hlc, record.blob), stored):
            return False
        self.identities[record.user_id] = (record.hlc, record.blob)
        old = None if stored is None else compute_identity_record_id(record.user_id, *stored)
        self._index_replace(Domain.IDENTITY, old, record.record_id, record.user_id)
        return True

    def expire_messages(self, cutoff_ms: int) -> list[bytes]:
        """Retention GC, as ChatDb's: drop messages at or before the cutoff, refuse them after."""
        self.expire_before_ms = max(self.expire_before_ms or cutoff_ms, cutoff_ms)
        aged = [i for i, m in self.messages.items() if m.hlc.physical_ms <= cutoff_ms]
        for msg_id in aged:
            del self.messages[msg_id]
            del self._index[Domain.MESSAGES][msg_id]
            self._buckets[Domain.MESSAGES][_bucket(msg_id)].discard(msg_id)
            self.trees[Domain.MESSAGES].remove(msg_id)
        return aged


def _member_id(key: tuple[bytes, bytes], info: MemberInfo) -> bytes:
    return member_record_id(key[0], key[1], info)


class DbReplica:
    """A ChatDb seen through the Replica interface, with trees rebuilt from it on creation."""

    def __init__(self, db: ChatDb) -> None:
        self.db = db
        # told of every message sync stored that was new here (from the applying thread)
        self.on_new_messages: Callable[[list[MsgV1]], None] | None = None
        self.trees = {
            Domain.MESSAGES: MerkleTree.from_ids(i for i, _ in db.iter_msg_ids()),
            Domain.MEMBERS: MerkleTree.from_ids(db.iter_member_record_ids()),
            Domain.IDENTITY: MerkleTree.from_ids(db.iter_identity_record_ids()),
        }

    def tree(self, domain: Domain) -> MerkleTree:
        return self.trees[domain]

    def expire_messages(self, cutoff_ms: int, batch: int = 10_000) -> list[bytes]:
        """Retention GC on the ChatDb, the tree kept in step (one caller at a time)."""
        trim_chats(self.db, cutoff_ms)
        aged = iter_seen_aged(self.db, cutoff_ms)
        expired: list[bytes] = []
        while ids := expire_seen(aged, self.db, batch):
            self.remove_from_tree(ids)
            expired += ids
        return expired

    def remove_from_tree(self, msg_ids: list[bytes]) -> None:
        tree = self.trees[Domain.MESSAGES]
        for msg_id in msg_ids:
            tree.remove(msg_id)

    def bucket_ids(self, domain: Domain, bucket: int, cutoff_ms: int | None) -> list[bytes]:
        if domain is Domain.MESSAGES:
            if cutoff_ms is None:
                return self.db.get_bucket_msg_ids(bucket)
            return self.db.get_bucket_msg_ids_filtered(bucket, cutoff_ms)
        if domain is Domain.MEMBERS:
            return self.db.get_bucket_member_ids(bucket)
        return self.db.get_bucket_identity_ids(bucket)

    def get_records(
        self, domain: Domain, ids: list[bytes], cutoff_ms: int | None
    ) -> list[bytes | None]:
        if domain is Domain.MESSAGES:
            return self.db.get_messages_cbor_by_ids(ids, cutoff_ms)
        if domain is Domain.MEMBERS:
            return self.db.get_member_records_by_ids(ids)
        return self.db.get_identity_records_by_ids(ids)

    def apply(self, domain: Domain, records: list[Record]) -> int:
        """Sync's path: one domain's validated records; how many changed the store. The
        messages that were new are reported to ``on_new_messages``."""
        new = self.apply_ops(records)
        fresh = [
            r for r, is_new in zip(records, new, strict=True) if is_new and isinstance(r, MsgV1)
        ]
        if fresh and self.on_new_messages is not None:
            self.on_new_messages(fresh)
        return sum(new)

    def apply_ops(self, ops: Sequence[Op | Record]) -> list[bool]:
        """Merge validated ops or records of any domain into the store and the trees; per
        item, whether it changed the store. The node's writer applies its batches here, sync
        (``apply``) its frames: one path from the store to the trees.

        Messages, then member rows, then identities, each domain in one WriteBatch; then the
        chat lists of the chats that got new messages (after the member rows: a chat's first
        message may come with its members; the chat lists are local views, kept in step).
        """
        msgs = [op for op in ops if isinstance(op, MsgV1)]
        previous = {m.chat_id: self.db.load_meta(m.chat_id).last_ts for m in msgs}
        msg_new = self._store_messages(msgs)
        member_new = self._store_members([_member_row(op) for op in ops if _is_member(op)])
        ident_new = self._store_identities([op for op in ops if isinstance(op, IdentityRecord)])
        fresh = [m for m, is_new in zip(msgs, msg_new, strict=True) if is_new]
        if fresh:
            self.db.refresh_inboxes(fresh, previous)
        by_domain = {
            Domain.MESSAGES: msg_new,
            Domain.MEMBERS: member_new,
            Domain.IDENTITY: ident_new,
        }
        flags = {domain: iter(new) for domain, new in by_domain.items()}
        return [next(flags[_domain_of(op)]) for op in ops]

    def _store_messages(self, msgs: list[MsgV1]) -> list[bool]:
        if not msgs:
            return []
        tree = self.trees[Domain.MESSAGES]
        new = []
        for result in self.db.put_messages(msgs):
            if not result.duplicate:
                tree.insert(result.msg_id)
            new.append(not result.duplicate)
        return new

    def _store_members(self, rows: list[tuple[bytes, bytes, MemberInfo]]) -> list[bool]:
        if not rows:
            return []
        changes = self.db.apply_member_states(rows)
        return self._replace_in_tree(Domain.MEMBERS, [(c.old_id, c.new_id) for c in changes])

    def _store_identities(self, records: list[IdentityRecord]) -> list[bool]:
        if not records:
            return []
        changes = self.db.put_identities(records)
        return self._replace_in_tree(Domain.IDENTITY, [(c.old_id, c.new_id) for c in changes])

    def _replace_in_tree(
        self, domain: Domain, changes: list[tuple[bytes | None, bytes]]
    ) -> list[bool]:
        tree = self.trees[domain]
        for old_id, new_id in changes:
            tree.replace(old_id, new_id)
        return [old_id != new_id for old_id, new_id in changes]


def _is_member(op: Op | Record) -> bool:
    return isinstance(op, MembershipOp | MemberRecord)


def _member_row(op: Op | Record) -> tuple[bytes, bytes, MemberInfo]:
    if isinstance(op, MembershipOp):
        return op.chat_id, op.user_id, op.state()
    assert isinstance(op, MemberRecord)
    return op.chat_id, op.user_id, op.info


def _domain_of(op: Op | Record) -> Domain:
    if isinstance(op, MsgV1):
        return Domain.MESSAGES
    return Domain.MEMBERS if _is_member(op) else Domain.IDENTITY
