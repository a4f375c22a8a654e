"""The narrow storage interface a sync session needs, and two implementations.

``Replica`` is what the protocol reads and writes: a tree per domain, the ids
of one bucket, encoded records by id, and "apply these validated records".
``MemoryReplica`` keeps everything in dicts (tests, benchmarks; the simulator's
``SimReplica`` is one with its hooks overridden); ``DbReplica`` drives a ``ChatDb``
handed to it. Both apply records through the store's rules and keep their trees in
step with what they store, and a test asserts they agree (same roots, same visible
messages after the same ops).

The MEMBERS domain is the grow-only set of signed member ops (record id: BLAKE3 of
the op's bytes); the member rows are folded from them. A message is stored only
once the chat's ops admit it (``store.access``); until then it waits in a bounded
``WaitingRoom`` and is neither stored nor listed. Whether a stored message is shown
is decided from the ops as well, when reading.

``cutoff_ms`` is the retention soft-filter: messages whose HLC physical time is
at or below it are neither listed nor returned (members and identity have no cutoff).
``settled_ms`` holds back the newest: messages stamped after it are listed but not
returned (a session leaves them to gossip, which is still carrying them).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from store.access import NO_HISTORY, Access, MemberHistory, admin_adds, admissible, visible
from store.authz import DmProof
from store.hlc import Hlc
from store.kinds import ChatView, IsAdmin, delete_is_valid, erases, fold_chat
from store.merge import identity_wins, merge_member_states
from store.ops import MembershipAction, MembershipOp, Op, member_op_id
from store.records import (
    IdentityRecord,
    MemberInfo,
    MessageKind,
    MsgV1,
    Role,
    compute_identity_record_id,
)
from store.retention import expire_seen, iter_seen_aged, trim_chats
from store.waiting import WaitingRoom
from sync.frames import Domain
from sync.merkle import MerkleTree

if TYPE_CHECKING:  # a ChatDb is passed in; sync never imports rocksdict itself
    from store.chatdb import ChatDb

Record = MsgV1 | MembershipOp | IdentityRecord


class Replica(Protocol):
    def tree(self, domain: Domain) -> MerkleTree: ...

    def bucket_ids(self, domain: Domain, bucket: int, cutoff_ms: int | None) -> list[bytes]: ...

    def get_records(
        self,
        domain: Domain,
        ids: list[bytes],
        cutoff_ms: int | None,
        settled_ms: int | None = None,
    ) -> list[bytes | None]: ...

    def apply(self, domain: Domain, records: list[Record]) -> int:
        """Merge validated records into the store and its tree; return how many changed it."""
        ...


def _bucket(record_id: bytes) -> int:
    return (record_id[0] << 8) | record_id[1]


MESSAGES, MEMBERS, IDENTITY, DELETES = (
    Domain.MESSAGES,
    Domain.MEMBERS,
    Domain.IDENTITY,
    Domain.DELETES,
)
# domain -> bucket -> record ids; an id may stay after it left (readers check what is held)
BucketIndex = dict[Domain, defaultdict[int, set[bytes]]]


def new_bucket_index() -> BucketIndex:
    return {d: defaultdict(set) for d in Domain}


class MemoryReplica:
    """A whole replica in dicts, under the same rules as ChatDb.

    The simulator's replica (``sim.replica.SimReplica``) is this class with its hooks
    overridden: the merge rules (``_merge_member_states``, ``_identity_wins``), the
    message rule (``_admissible``, ``_visible``), what a record id entering or leaving
    the replica does (``_listed``, ``_unlisted``), and ``_wrote`` (told of every
    change with the row's state before it). ``trees`` and ``buckets`` replace the
    default storage.
    """

    def __init__(
        self,
        trees: dict[Domain, MerkleTree] | None = None,
        buckets: BucketIndex | None = None,
        waiting: WaitingRoom | None = None,
        *,
        admit_all: bool = False,
    ) -> None:
        self.admit_all = admit_all  # every message stored and shown: the sync engine alone
        self.expire_before_ms: int | None = None  # retention: older messages are refused
        self.trees = trees if trees is not None else {d: MerkleTree() for d in Domain}
        self.messages: dict[bytes, MsgV1] = {}
        self.member_ops: dict[bytes, MembershipOp] = {}  # op id -> op: the MEMBERS domain
        self.members: dict[tuple[bytes, bytes], MemberInfo] = {}  # rows, folded from the ops
        self.histories: dict[tuple[bytes, bytes], MemberHistory] = {}
        self.dm_parties: dict[bytes, bytes] = {}  # chat -> its two parties (from a DmProof)
        self.identities: dict[bytes, tuple[Hlc, bytes]] = {}
        self.deletes: dict[bytes, MsgV1] = {}  # DELETE messages: the DELETES domain
        self.deletes_by_ref: dict[bytes, list[MsgV1]] = {}
        self.refs: dict[bytes, set[bytes]] = {}  # message id -> held messages that refer to it
        self.erased: set[bytes] = set()  # held once, erased by a delete: refused from now on
        self.creators: dict[bytes, bytes] = {}  # group chat -> its creator's user id
        self.admin_since: dict[tuple[bytes, bytes], Hlc] = {}  # the first admin add's stamp
        self.waiting = waiting if waiting is not None else WaitingRoom()
        # record id -> row key: the user for identity (messages and ops are their own index)
        self._rows: dict[Domain, dict[bytes, Any]] = {IDENTITY: {}}
        self._buckets = buckets if buckets is not None else new_bucket_index()

    # --- the Replica protocol ---

    def tree(self, domain: Domain) -> MerkleTree:
        return self.trees[domain]

    def record_ids(self, domain: Domain) -> list[bytes]:
        if domain is MESSAGES:
            return list(self.messages)
        if domain is DELETES:
            return list(self.deletes)
        return list(self.member_ops) if domain is MEMBERS else list(self._rows[domain])

    def bucket_ids(self, domain: Domain, bucket: int, cutoff_ms: int | None) -> list[bytes]:
        known = self._buckets[domain].get(bucket, ())
        if domain is MEMBERS:
            return sorted(i for i in known if i in self.member_ops)
        if domain is DELETES:
            return sorted(i for i in known if i in self.deletes)
        if domain is IDENTITY:
            rows = self._rows[domain]
            return sorted(i for i in known if i in rows)
        msgs = self.messages
        if cutoff_ms is None:
            return sorted(i for i in known if i in msgs)
        return sorted(i for i in known if i in msgs and msgs[i].hlc.physical_ms > cutoff_ms)

    def get_records(
        self,
        domain: Domain,
        ids: list[bytes],
        cutoff_ms: int | None,
        settled_ms: int | None = None,
    ) -> list[bytes | None]:
        out: list[bytes | None] = []
        for record_id in ids:
            if domain is MESSAGES:
                msg = self.messages.get(record_id)
                stamp = 0 if msg is None else msg.hlc.physical_ms
                old = cutoff_ms is not None and stamp <= cutoff_ms
                new = settled_ms is not None and stamp > settled_ms
                out.append(None if msg is None or old or new else msg.encoded)
            elif domain is MEMBERS:
                op = self.member_ops.get(record_id)
                out.append(None if op is None else op.encode())
            elif domain is DELETES:
                delete = self.deletes.get(record_id)
                out.append(None if delete is None else delete.encoded)
            else:
                row = self._rows[domain].get(record_id)
                out.append(
                    None if row is None else IdentityRecord(row, *self.identities[row]).encode()
                )
        return out

    def apply(self, domain: Domain, records: Sequence[Record]) -> int:
        return self.apply_ops(records).changed

    # --- applying ops: member ops first, so a batch may carry a message and its op ---

    def apply_ops(self, ops: Sequence[Op | Record]) -> Applied:
        """Merge validated ops; per op whether it changed the replica (a message: stored),
        and how many changes in all (messages released from waiting included)."""
        new = [False] * len(ops)
        chats: set[bytes] = set()
        promoted: set[tuple[bytes, bytes]] = set()  # (chat, user) who may delete more now
        for i, op in enumerate(ops):
            if isinstance(op, MembershipOp):
                new[i] = self._add_member_op(op, promoted)
                if new[i]:
                    chats.add(op.chat_id)
            elif isinstance(op, IdentityRecord):
                new[i] = self._put_identity(op.user_id, op.hlc, op.blob)
        released = self.waiting.release_chats(chats)
        for i, op in enumerate(ops):
            if isinstance(op, MsgV1):
                new[i] = self._admit(op)
        changed = sum(new) + sum(self._admit(msg) for msg in released)
        for d in [d for d in self.deletes.values() if (d.chat_id, d.sender) in promoted]:
            self._erase_for(d)
        chats = {
            op.chat_id for op in ops if isinstance(op, MsgV1) and op.kind is MessageKind.DELETE
        }
        if chats:  # a waiting message a delete erases could never be stored: it goes
            self.waiting.discard(
                {m.msg_id for m in self.waiting.of_chats(chats) if self.erased_by_a_delete(m)}
            )
        return Applied(new, changed)

    def apply_record(self, record: Record) -> bool:
        """Merge one validated record; True if it changed the replica."""
        return self.apply_ops([record]).new[0]

    def _admit(self, msg: MsgV1) -> bool:
        if msg.msg_id in self.messages or msg.msg_id in self.deletes:
            return False
        if not self._admissible(msg):
            if not self.erased_by_a_delete(msg):  # nothing waits that could never be stored
                self.waiting.park(msg)
            return False
        if msg.kind is MessageKind.DELETE:
            return self._put_delete(msg)
        if self._erased_on_arrival(msg):
            return False
        return self._put_message(msg)

    # --- deletes (MESSAGES.md): a valid delete erases its target, its edits, its reactions ---

    def _put_delete(self, delete: MsgV1) -> bool:
        assert delete.ref is not None
        self.deletes[delete.msg_id] = delete
        self.deletes_by_ref.setdefault(delete.ref, []).append(delete)
        self._index(DELETES, None, delete.msg_id, delete.msg_id)
        self._wrote(DELETES, delete.msg_id, None)
        self._erase_for(delete)
        return True

    def _erase_for(self, delete: MsgV1) -> None:
        """Erase the held messages this delete erases (if it is valid, now or later)."""
        if not delete_is_valid(delete, self.admins(delete.chat_id)):
            return
        assert delete.ref is not None
        for msg_id in sorted({delete.ref, *self.refs.get(delete.ref, ())}):
            msg = self.messages.get(msg_id)
            if msg is not None and erases(delete, msg):
                self.erased.add(msg_id)
                self._wrote(MESSAGES, msg_id, msg)
                self._drop_message(msg_id)

    def _erased_on_arrival(self, msg: MsgV1) -> bool:
        """A message a held delete erases is not stored (and remembered as erased)."""
        if msg.msg_id in self.erased:
            return True
        if self.erased_by_a_delete(msg):
            self.erased.add(msg.msg_id)
            return True
        return False

    def erased_by_a_delete(self, msg: MsgV1) -> bool:
        is_admin = self.admins(msg.chat_id)
        return any(
            delete_is_valid(delete, is_admin) and erases(delete, msg)
            for ref in (msg.msg_id, msg.ref)
            for delete in self.deletes_by_ref.get(ref or b"", ())
        )

    def admins(self, chat_id: bytes) -> IsAdmin:
        """Who may delete others' messages in the chat, from when (store.kinds.IsAdmin): the
        group's creator, and each user from their first admin add on."""
        creator, since = self.creators.get(chat_id), self.admin_since

        def is_admin(user: bytes, hlc: Hlc) -> bool:
            first = since.get((chat_id, user))
            return user == creator or (first is not None and first <= hlc)

        return is_admin

    def _put_message(self, msg: MsgV1) -> bool:
        msg_id = msg.msg_id
        if msg_id in self.messages:
            return False
        expire = self.expire_before_ms
        if expire is not None and msg.hlc.physical_ms <= expire:
            return False  # GC removed (or would remove) it: never store it again
        self.messages[msg_id] = msg
        if msg.ref is not None:
            self.refs.setdefault(msg.ref, set()).add(msg_id)
        self._index(MESSAGES, None, msg_id, msg_id)
        self._wrote(MESSAGES, msg_id, None)
        return True

    def _add_member_op(
        self, op: MembershipOp, promoted: set[tuple[bytes, bytes]] | None = None
    ) -> bool:
        """Store a new op; ``promoted`` gets the (chat, user) it lets delete more."""
        op_id = member_op_id(op.encode())
        if op_id in self.member_ops:
            return False
        self.member_ops[op_id] = op
        self._index(MEMBERS, None, op_id, op_id)
        key = (op.chat_id, op.user_id)
        is_add = op.action is MembershipAction.ADD
        self.histories[key] = self.histories.get(key, NO_HISTORY).with_op(op.hlc, is_add)
        proof = op.proof
        if isinstance(proof, DmProof):  # the chat's two parties
            self.dm_parties.setdefault(op.chat_id, proof.parties())
        elif proof is not None and op.chat_id not in self.creators:
            self.creators[op.chat_id] = proof.creator
            if promoted is not None:
                promoted.add((op.chat_id, proof.creator))
        first = self.admin_since.get(key)
        if is_add and op.role is Role.ADMIN and (first is None or op.hlc < first):
            self.admin_since[key] = op.hlc
            if promoted is not None:
                promoted.add(key)
        self._merge_member(key, op.state())
        return True

    def _merge_member(self, key: tuple[bytes, bytes], info: MemberInfo) -> bool:
        before = self.members.get(key)
        after = self._merge_member_states(before, info)
        if after is None or after == before:
            return False
        self.members[key] = after
        self._wrote(MEMBERS, key, before)
        return True

    def _put_identity(self, user: bytes, hlc: Hlc, blob: bytes) -> bool:
        stored = self.identities.get(user)
        if stored == (hlc, blob) or not self._identity_wins((hlc, blob), stored):
            return False
        self._set_identity(user, stored, (hlc, blob))
        self._wrote(IDENTITY, user, stored)
        return True

    # --- what readers see ---

    def access(self, chat_id: bytes, user_id: bytes) -> Access:
        history = self.histories.get((chat_id, user_id), NO_HISTORY)
        return Access(history, self.dm_parties.get(chat_id))

    def is_visible(self, msg: MsgV1) -> bool:
        return msg.msg_id in self.messages and self._visible(msg)

    def view(self, chat_id: bytes) -> ChatView:
        """The chat as readers see it (MESSAGES.md): edits, deletes, reactions, receipts."""
        return fold_chat(
            [m for m in self.messages.values() if m.chat_id == chat_id],
            [d for d in self.deletes.values() if d.chat_id == chat_id],
            self.admins(chat_id),
            shown=self._visible,
        )

    def visible_ids(self, chat_id: bytes | None = None) -> set[bytes]:
        """The stored messages readers see (of one chat, or of all)."""
        return {
            i
            for i, m in self.messages.items()
            if (chat_id is None or m.chat_id == chat_id) and self._visible(m)
        }

    # --- setting a row: the dicts, the record-id index, the buckets and the tree in step ---

    def _drop_message(self, msg_id: bytes) -> None:
        msg = self.messages.pop(msg_id)
        if msg.ref is not None:
            self.refs[msg.ref].discard(msg_id)
        self._index(MESSAGES, msg_id, None, msg_id)

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
        rows = self._rows.get(domain)  # messages and member ops are their own index
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

    def _admissible(self, msg: MsgV1) -> bool:
        return self.admit_all or admissible(msg, self.access(msg.chat_id, msg.sender))

    def _visible(self, msg: MsgV1) -> bool:
        return self.admit_all or visible(msg, self.access(msg.chat_id, msg.sender))

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


@dataclass(frozen=True, slots=True)
class Applied:
    new: list[bool]  # per op: did it change the replica (a message: was it stored)
    changed: int  # changes in all, messages released from the waiting room included
    stored: list[MsgV1] = field(default_factory=list)  # messages new to the store (DbReplica)


class DbReplica:
    """A ChatDb seen through the Replica interface, with trees rebuilt from it on creation."""

    def __init__(
        self, db: ChatDb, waiting: WaitingRoom | None = None, *, admit_all: bool = False
    ) -> None:
        """``admit_all``: store and show every message, members or not — the sync engine on
        its own, as protocol tests and the sync benchmark drive it (a node never does)."""
        self.db = db
        self.admit_all = admit_all
        self.waiting = waiting if waiting is not None else WaitingRoom()
        # told of every message sync stored that was new here (from the applying thread)
        self.on_new_messages: Callable[[list[MsgV1]], None] | None = None
        self.trees = {
            Domain.MESSAGES: MerkleTree.from_ids(i for i, _ in db.iter_msg_ids()),
            Domain.MEMBERS: MerkleTree.from_ids(db.iter_member_record_ids()),
            Domain.IDENTITY: MerkleTree.from_ids(db.iter_identity_record_ids()),
            Domain.DELETES: MerkleTree.from_ids(db.iter_delete_ids()),
        }
        if held := db.load_waiting():  # what waited when the store was last open
            self.apply_ops(held)  # stored if admitted by now, else waits again
            db.save_waiting([], [m.msg_id for m in held if m.msg_id not in self.waiting])

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
        if domain is Domain.DELETES:
            return self.db.get_bucket_delete_ids(bucket)
        return self.db.get_bucket_identity_ids(bucket)

    def get_records(
        self,
        domain: Domain,
        ids: list[bytes],
        cutoff_ms: int | None,
        settled_ms: int | None = None,
    ) -> list[bytes | None]:
        if domain is Domain.MESSAGES:
            return self.db.get_messages_cbor_by_ids(ids, cutoff_ms, settled_ms)
        if domain is Domain.MEMBERS:
            return self.db.get_member_records_by_ids(ids)
        if domain is Domain.DELETES:
            return self.db.get_deletes_by_ids(ids)
        return self.db.get_identity_records_by_ids(ids)

    def apply(self, domain: Domain, records: Sequence[Record]) -> int:
        """Sync's path: one domain's validated records; how many changed the store. The
        messages it stored are reported to ``on_new_messages`` (arrivals by anti-entropy)."""
        applied = self.apply_ops(records)
        if applied.stored and self.on_new_messages is not None:
            self.on_new_messages(applied.stored)
        return applied.changed

    def is_waiting(self, msg: MsgV1) -> bool:
        return msg.msg_id in self.waiting

    def apply_ops(self, ops: Sequence[Op | Record]) -> Applied:
        """Merge validated ops of any domain into the store and the trees; per op, whether it
        changed the store. The node's writer applies its batches here, sync (``apply``) its
        frames: one path from the store to the trees.

        Member ops first (one WriteBatch), then identities, then the messages — the batch's
        and those waiting in chats whose ops just grew — through the message rule
        (``ChatDb.put_authorized``: one WriteBatch, the chat lists kept in step); what the
        rule does not admit yet waits, in the room and in the store (for a restart). Last,
        the senders whose history grew have their stored messages re-decided
        (``ChatDb.reconsider``).
        """
        member_ops = [op for op in ops if isinstance(op, MembershipOp)]
        applied = self.db.apply_member_ops(member_ops) if member_ops else None
        member_new = self._insert(Domain.MEMBERS, applied.op_ids, applied.new) if applied else []
        ident_new = self._store_identities([op for op in ops if isinstance(op, IdentityRecord)])
        msgs = [op for op in ops if isinstance(op, MsgV1)]
        released = []
        if applied is not None:
            released = self.waiting.release_chats(applied.chats)
        admitted = self.db.put_authorized(msgs + released, admit_all=self.admit_all)
        results, waiting = admitted.results, admitted.waiting
        evicted = [msg_id for msg in waiting for msg_id in self.waiting.park(msg)]
        erased_waiting = self._discard_erased_waiting(msgs)
        if released or waiting or erased_waiting:
            room = self.waiting
            self.db.save_waiting(
                [m for m in waiting if m.msg_id in room],
                [i for i in {*(m.msg_id for m in released), *evicted, *erased_waiting}
                 if i not in room],
            )  # fmt: skip
        stored = [r is not None and not r.duplicate for r in results]
        trees = self.trees
        for msg, is_new in zip(msgs + released, stored, strict=True):
            if is_new:
                domain = Domain.DELETES if msg.kind is MessageKind.DELETE else Domain.MESSAGES
                trees[domain].insert(msg.msg_id)
        erased = list(admitted.erased)
        if applied is not None:
            self.db.forget_admins(applied.chats)
            if promoted := admin_adds(member_ops, applied.new):
                erased += self.db.erase_for_senders(promoted)
                self.db.refresh_previews({chat for chat, _ in promoted})
        for msg_id in erased:
            trees[Domain.MESSAGES].remove(msg_id)
        if applied is not None and applied.touched:
            self.db.reconsider(applied.touched)
        fresh = [m for m, is_new in zip(msgs + released, stored, strict=True) if is_new]
        flags = {
            Domain.MESSAGES: iter(stored[: len(msgs)]),
            Domain.MEMBERS: iter(member_new),
            Domain.IDENTITY: iter(ident_new),
        }
        new = [next(flags[_domain_of(op)]) for op in ops]
        return Applied(new, sum(member_new) + sum(ident_new) + sum(stored), fresh)

    def _discard_erased_waiting(self, msgs: list[MsgV1]) -> list[bytes]:
        """What the batch's deletes erase among the waiting messages leaves the room (and its
        payload the store): it could never be stored."""
        chats = {m.chat_id for m in msgs if m.kind is MessageKind.DELETE}
        if not chats:
            return []
        candidates = self.waiting.of_chats(chats)
        return self.waiting.discard(self.db.erased_on_arrival(candidates)) if candidates else []

    def _insert(self, domain: Domain, ids: list[bytes], new: list[bool]) -> list[bool]:
        tree = self.trees[domain]
        for record_id, is_new in zip(ids, new, strict=True):
            if is_new:
                tree.insert(record_id)
        return new

    def _store_identities(self, records: list[IdentityRecord]) -> list[bool]:
        if not records:
            return []
        changes = self.db.put_identities(records)
        tree = self.trees[Domain.IDENTITY]
        for change in changes:
            tree.replace(change.old_id, change.new_id)
        return [c.old_id != c.new_id for c in changes]

    # --- what readers see ---

    def view(self, chat_id: bytes) -> ChatView:
        """The chat as readers see it (MESSAGES.md), folded from what RocksDB holds."""
        held = self.db.chat_messages(chat_id)
        shown = {m.msg_id for m, is_shown in held if is_shown}
        return fold_chat(
            [m for m, _ in held],
            self.db.deletes_of(chat_id),
            self.db.admins(chat_id),
            shown=lambda m: m.msg_id in shown,
        )

    def visible_ids(self, chat_id: bytes) -> set[bytes]:
        """The chat's messages a reader is shown (every page of its history)."""
        out: set[bytes] = set()
        cursor = None
        while True:
            page = self.db.range(chat_id, cursor, limit=200)
            out.update(item.msg.msg_id for item in page.items)
            if page.next_cursor is None:
                return out
            cursor = page.next_cursor


def _domain_of(op: Op | Record) -> Domain:
    if isinstance(op, MsgV1):
        return Domain.MESSAGES
    return Domain.MEMBERS if isinstance(op, MembershipOp) else Domain.IDENTITY
