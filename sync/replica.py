"""The narrow storage interface a sync session needs, and two implementations.

``Replica`` is what the protocol reads and writes: a tree per domain, the ids
of one bucket, encoded records by id, and "apply these validated records".
``MemoryReplica`` keeps everything in dicts (tests, benchmarks; the simulator's
``SimReplica`` is one with its hooks overridden); ``DbReplica`` drives a ``ChatDb`` handed to it. Both apply records through the
store's merge rules and keep their trees in step with what they store, and a
test asserts they agree (same roots after the same ops).

``cutoff_ms`` is the retention soft-filter: messages whose HLC physical time is
at or below it are neither listed nor returned (members and identity have no cutoff).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

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


MESSAGES, MEMBERS, IDENTITY = Domain.MESSAGES, Domain.MEMBERS, Domain.IDENTITY
# domain -> bucket -> record ids; an id may stay after it left (readers check what is held)
BucketIndex = dict[Domain, defaultdict[int, set[bytes]]]


def new_bucket_index() -> BucketIndex:
    return {d: defaultdict(set) for d in Domain}


class MemoryReplica:
    """A whole replica in dicts, merged by the same rules as ChatDb.

    The simulator's replica (``sim.replica.SimReplica``) is this class with its hooks
    overridden: the merge rules (``_merge_member_states``, ``_identity_wins``), what a
    record id entering or leaving the replica does (``_listed``, ``_unlisted``),
    ``_wrote`` (told of every change with the row's state before it) and
    ``_member_id``. ``trees`` and ``buckets`` replace the default storage.
    """

    def __init__(
        self, trees: dict[Domain, MerkleTree] | None = None, buckets: BucketIndex | None = None
    ) -> None:
        self.expire_before_ms: int | None = None  # retention: older messages are refused
        self.trees = trees if trees is not None else {d: MerkleTree() for d in Domain}
        self.messages: dict[bytes, MsgV1] = {}
        self.members: dict[tuple[bytes, bytes], MemberInfo] = {}
        self.identities: dict[bytes, tuple[Hlc, bytes]] = {}
        # record id -> row key: (chat, user) for members, the user for identity
        self._rows: dict[Domain, dict[bytes, Any]] = {MEMBERS: {}, IDENTITY: {}}
        self._buckets = buckets if buckets is not None else new_bucket_index()

    # --- the Replica protocol ---

    def tree(self, domain: Domain) -> MerkleTree:
        return self.trees[domain]

    def record_ids(self, domain: Domain) -> list[bytes]:
        return list(self.messages) if domain is MESSAGES else list(self._rows[domain])

    def bucket_ids(self, domain: Domain, bucket: int, cutoff_ms: int | None) -> list[bytes]:
        known = self._buckets[domain].get(bucket, ())
        if domain is not MESSAGES:
            rows = self._rows[domain]
            return sorted(i for i in known if i in rows)
        msgs = self.messages
        if cutoff_ms is None:
            return sorted(i for i in known if i in msgs)
        return sorted(i for i in known if i in msgs and msgs[i].hlc.physical_ms > cutoff_ms)

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
            row = self._rows[domain].get(record_id)
            if row is None:
                out.append(None)
            elif domain is MEMBERS:
                out.append(MemberRecord(row[0], row[1], self.members[row]).encode())
            else:
                out.append(IdentityRecord(row, *self.identities[row]).encode())
        return out

    def apply(self, domain: Domain, records: list[Record]) -> int:
        changed = 0
        for record in records:
            changed += self.apply_record(record)
        return changed

    # --- merging one record ---

    def apply_record(self, record: Record) -> bool:
        """Merge one validated record; True if it changed the replica."""
        if isinstance(record, MsgV1):
            return self._put_message(record)
        if isinstance(record, MemberRecord):
            return self._merge_member((record.chat_id, record.user_id), record.info)
        return self._put_identity(record.user_id, record.hlc, record.blob)

    def _put_message(self, msg: MsgV1) -> bool:
        msg_id = msg.msg_id
        if msg_id in self.messages:
            return False
        expire = self.expire_before_ms
        if expire is not None and msg.hlc.physical_ms <= expire:
            return False  # GC removed (or would remove) it: never store it again
        self.messages[msg_id] = msg
        self._index(MESSAGES, None, msg_id, msg_id)
        self._wrote(MESSAGES, msg_id, None)
        return True

    def _merge_member(self, key: tuple[bytes, bytes], info: MemberInfo) -> bool:
        before = self.members.get(key)
        after = self._merge_member_states(before, info)
        if after is None or after == before:
            return False
        self._set_member(key, before, after)
        self._wrote(MEMBERS, key, before)
        return True

    def _put_identity(self, user: bytes, hlc: Hlc, blob: bytes) -> bool:
        stored = self.identities.get(user)
        if stored == (hlc, blob) or not self._identity_wins((hlc, blob), stored):
            return False
        self._set_identity(user, stored, (hlc, blob))
        self._wrote(IDENTITY, user, stored)
        return True

    # --- setting a row: the dicts, the record-id index, the buckets and the tree in step ---

    def _drop_message(self, msg_id: bytes) -> None:
        del self.messages[msg_id]
        self._index(MESSAGES, msg_id, None, msg_id)

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
        rows = self._rows.get(domain)  # messages are their own index
        if old is not None:
            if rows is not None:
                del rows[old]
            self._unlisted(domain, old)
        if new is not None:
            if rows is not None:
                rows[new] = row
            self._listed(domain, new)
        self.trees[domain].replace(old, new)

    # --- hooks (the simulator overrides them) ---

    def _merge_member_states(
        self, local: MemberInfo | None, remote: MemberInfo
    ) -> MemberInfo | None:
        return merge_member_states(local, remote)

    def _identity_wins(self, incoming: tuple[Hlc, bytes], stored: tuple[Hlc, bytes] | None) -> bool:
        return identity_wins(incoming, stored)

    def _member_id(self, key: tuple[bytes, bytes], info: MemberInfo) -> bytes:
        return member_record_id(key[0], key[1], info)

    def _listed(self, domain: Domain, record_id: bytes) -> None:
        self._buckets[domain][_bucket(record_id)].add(record_id)

    def _unlisted(self, domain: Domain, record_id: bytes) -> None:
        self._buckets[domain][_bucket(record_id)].discard(record_id)

    def _wrote(self, domain: Domain, key: Any, before: Any) -> None:
        """After a change to row ``key`` of ``domain``, which held ``before`` (None: nothing)."""

    # --- retention ---

    def expire_messages(self, cutoff_ms: int) -> list[bytes]:
        """Retention GC, as ChatDb's: drop messages at or before the cutoff, refuse them after."""
        self.expire_before_ms = max(self.expire_before_ms or cutoff_ms, cutoff_ms)
        aged = [i for i, m in self.messages.items() if m.hlc.physical_ms <= cutoff_ms]
        for msg_id in aged:
            self._drop_message(msg_id)
        return aged


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
