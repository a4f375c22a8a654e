"""The narrow storage interface a sync session needs, and two implementations.

``Replica`` is what the protocol reads and writes: a tree per domain, the ids
of one bucket, encoded records by id, and "apply these validated records".
``MemoryReplica`` keeps everything in dicts (tests, benchmarks; the simulator's
``SimReplica`` is one with its hooks overridden); ``DbReplica`` drives a ``ChatDb``
handed to it. Neither decides anything: ``store.plan`` plans every batch from the
replica's held state, and each carries the plan out and keeps its trees in step
(``tree_changes``); a test asserts they agree (same roots, same visible messages
after the same ops).

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

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from store.access import NO_HISTORY, Access, MemberHistory
from store.hlc import Hlc
from store.keys import NUM_BUCKETS
from store.kinds import ChatView, IsAdmin, fold_chat
from store.leaving import Dropped, drop_chats, drop_users
from store.merge import merge_member_states
from store.ops import MembershipOp, Op
from store.plan import (
    ADMIT_ALL,
    CHAT_RULES,
    NO_ADMINS,
    AdminState,
    Plan,
    RuleSet,
    plan_ops,
)
from store.records import IdentityRecord, MemberInfo, MsgV1, compute_identity_record_id
from store.retention import Expiry
from store.waiting import WaitingRoom
from sync.buckets import Buckets
from sync.frames import Domain
from sync.listing_cache import DEFAULT_MAX_IDS, Change, ListingCache
from sync.merkle import MerkleTree, TreeReader, VersionedTree
from sync.scope import (
    EVERYTHING,
    Scope,
    ScopeError,
    in_chat_scope,
    in_index,
    shard_of,
    user_shard_of,
)
from sync.shards import ScopedTrees, ShardLeaves, placement_key

if TYPE_CHECKING:  # a ChatDb is passed in; sync never imports rocksdict itself
    from store.chatdb import ChatDb

Record = MsgV1 | MembershipOp | IdentityRecord


class Replica(Protocol):
    """What a session reads, per scope (``sync.scope``), and where a driver that owns the
    replica writes what a session received (``apply``). ``scope`` is what the replica
    holds; asked for another scope, it answers for what it holds within it."""

    scope: Scope

    def tree(self, domain: Domain) -> MerkleTree:
        """The tree of everything the replica holds."""
        ...

    def scope_tree(self, domain: Domain, scope: Scope) -> TreeReader:
        """The tree of what the replica holds within ``scope``."""
        ...

    def bucket_ids(
        self, domain: Domain, bucket: int, cutoff_ms: int | None, scope: Scope = EVERYTHING
    ) -> list[bytes]: ...

    def ids_in_range(
        self,
        domain: Domain,
        start: int,
        end: int,
        cutoff_ms: int | None,
        scope: Scope = EVERYTHING,
    ) -> bytes:
        """The ids of buckets ``start <= b < end``, concatenated, in any order: what a sketch
        covers (one range read, where ``bucket_ids`` would be thousands)."""
        ...

    def ids_in_runs(
        self,
        domain: Domain,
        runs: Sequence[tuple[int, int]],
        cutoff_ms: int | None,
        scope: Scope = EVERYTHING,
    ) -> bytes:
        """``ids_in_range`` of each run ``(start, end)`` (ascending, disjoint), concatenated:
        a sketch region in one call (``sync.shards.ScopedTrees`` asks ``ids_in_range`` a run)."""
        ...

    def get_records(
        self,
        domain: Domain,
        ids: list[bytes],
        cutoff_ms: int | None,
        settled_ms: int | None = None,
        scope: Scope = EVERYTHING,
    ) -> list[bytes | None]: ...

    def apply(self, domain: Domain, records: list[Record]) -> int:
        """Merge validated records into the store and its tree; return how many changed it."""
        ...


def _filter_applied(
    ops: Sequence[Any],
    scope: Scope,
    apply: Callable[[list[Any]], Applied],
    put_index: Callable[[list[MembershipOp]], list[bool]],
) -> tuple[Applied, int]:
    """Index the member ops naming a user ``scope`` indexes (``put_index``), apply what lies
    in its chats (``in_chat_scope``): ``new`` per op, new to either (an op new to both is
    one change); and how many ops lie in neither (refused)."""
    to_index = [op for op in ops if in_index(op, scope)]
    if not to_index and scope.is_full:  # gossip's common case: what follows reduces to this
        return apply(list(ops)), 0
    indexed = {id(op) for op, new in zip(to_index, put_index(to_index), strict=True) if new}
    kept = list(ops) if scope.is_full else [op for op in ops if in_chat_scope(op, scope)]
    applied = apply(kept)
    flags = dict(zip(map(id, kept), applied.new, strict=True))
    new = [flags.get(id(op), False) or id(op) in indexed for op in ops]
    only_indexed = sum(1 for op in ops if id(op) in indexed and not flags.get(id(op), False))
    refused = sum(1 for op in ops if id(op) not in flags and not in_index(op, scope))
    return Applied(new, applied.changed + only_indexed, applied.stored), refused


def _key(domain: Domain, row: Any) -> bytes:
    """A held row's placement key: an identity's row is its user; the others are records."""
    return row if domain is Domain.IDENTITY else placement_key(domain, row)


MESSAGES, MEMBERS, IDENTITY, DELETES, INDEX = (
    Domain.MESSAGES,
    Domain.MEMBERS,
    Domain.IDENTITY,
    Domain.DELETES,
    Domain.INDEX,
)
# domain -> its ids by bucket; an id may stay after it left (readers check what is held)
BucketIndex = dict[Domain, Buckets]


def new_bucket_index() -> BucketIndex:
    return {d: Buckets() for d in Domain}


class MemoryReplica(ScopedTrees):
    """A whole replica in dicts. It decides nothing itself: ``store.plan`` plans each batch
    from what it holds (it is its own ``HeldView``), and it carries the plan out.

    The simulator's replica (``sim.replica.SimReplica``) is this class with its hooks
    overridden: the member-row merge (``_merge_member_states``), the rule set handed to
    the planner (``plan_rules``), what a record id entering or leaving the replica does
    (``_listed``, ``_unlisted``), what storing a message or member op or marking an id
    erased does (``_put_message``, ``_add_member_op``, ``_mark_erased``), the shown
    rule when reading (``_visible``), and ``_wrote`` (told of every change with the
    row's state before it). ``trees`` and ``buckets`` replace the default storage.
    """

    def __init__(
        self,
        trees: dict[Domain, MerkleTree] | None = None,
        buckets: BucketIndex | None = None,
        waiting: WaitingRoom | None = None,
        *,
        admit_all: bool = False,
        scope: Scope = EVERYTHING,
    ) -> None:
        # admit_all: every message stored and shown: the sync engine alone
        self.scope = scope  # what it holds: messages and deletes outside are refused
        self.refused_out_of_scope = 0
        self._shard_leaves: tuple[int, dict[Domain, ShardLeaves]] | None = None
        self.plan_rules: RuleSet = ADMIT_ALL if admit_all else CHAT_RULES
        self.expire_before_ms: int | None = None  # retention: older messages are refused
        self.trees = trees if trees is not None else {d: MerkleTree() for d in Domain}
        self.messages: dict[bytes, MsgV1] = {}
        self.member_ops: dict[bytes, MembershipOp] = {}  # op id -> op: the MEMBERS domain
        self.index: dict[bytes, MembershipOp] = {}  # op id -> op: the INDEX domain (by user)
        self.members: dict[tuple[bytes, bytes], MemberInfo] = {}  # rows, folded from the ops
        self.histories: dict[tuple[bytes, bytes], MemberHistory] = {}
        self.parties: dict[bytes, bytes] = {}  # chat -> its two parties (from a DmProof)
        self.identities: dict[bytes, tuple[Hlc, bytes]] = {}
        self.deletes: dict[bytes, MsgV1] = {}  # DELETE messages: the DELETES domain
        self.deletes_by_ref: dict[bytes, list[MsgV1]] = {}
        self.delete_chats: set[bytes] = set()  # chats that held a delete
        self.refs: dict[bytes, set[bytes]] = {}  # message id -> held messages that refer to it
        self.erased: set[bytes] = set()  # held once, erased by a delete: refused from now on
        self.admin_states: dict[bytes, AdminState] = {}  # group chat -> creator, admins
        self.waiting = waiting if waiting is not None else WaitingRoom()
        # record id -> row key: the user for identity (messages and ops are their own index)
        self._rows: dict[Domain, dict[bytes, Any]] = {IDENTITY: {}}
        self._buckets = buckets if buckets is not None else new_bucket_index()

    # --- the Replica protocol ---

    def tree(self, domain: Domain) -> MerkleTree:
        """The tree of everything held (the replica's own scope)."""
        return self.trees[domain]

    def record_ids(self, domain: Domain) -> list[bytes]:
        return list(self._held(domain))

    def bucket_ids(
        self, domain: Domain, bucket: int, cutoff_ms: int | None, scope: Scope = EVERYTHING
    ) -> list[bytes]:
        return self._keep_in_scope(domain, self._held_in_bucket(domain, bucket, cutoff_ms), scope)

    def _held(self, domain: Domain) -> dict[bytes, Any]:
        """A domain's records (identities: record id -> user) by record id."""
        if domain is MESSAGES:
            return self.messages
        if domain is DELETES:
            return self.deletes
        if domain is MEMBERS:
            return self.member_ops
        return self.index if domain is INDEX else self._rows[domain]

    def _held_in_bucket(self, domain: Domain, bucket: int, cutoff_ms: int | None) -> list[bytes]:
        known = self._buckets[domain].of(bucket)
        held = self._held(domain)
        if domain is not MESSAGES or cutoff_ms is None:
            return sorted(i for i in known if i in held)
        msgs = self.messages
        return sorted(i for i in known if i in msgs and msgs[i].hlc.physical_ms > cutoff_ms)

    def ids_in_range(
        self,
        domain: Domain,
        start: int,
        end: int,
        cutoff_ms: int | None,
        scope: Scope = EVERYTHING,
    ) -> bytes:
        is_held = self._held(domain).__contains__
        out: list[bytes] = []
        for known in self._buckets[domain].in_range(start, end):
            out += filter(is_held, known)
        if domain is MESSAGES and cutoff_ms is not None:
            out = [i for i in out if self.messages[i].hlc.physical_ms > cutoff_ms]
        return b"".join(self._keep_in_scope(domain, out, scope))

    def _keys_of(self, domain: Domain, ids: list[bytes]) -> list[bytes | None]:
        held = self._held(domain)
        return [None if (r := held.get(i)) is None else _key(domain, r) for i in ids]

    def _iter_keys(self, domain: Domain) -> Iterator[tuple[bytes, bytes]]:
        return ((i, _key(domain, r)) for i, r in self._held(domain).items())

    def get_records(
        self,
        domain: Domain,
        ids: list[bytes],
        cutoff_ms: int | None,
        settled_ms: int | None = None,
        scope: Scope = EVERYTHING,
    ) -> list[bytes | None]:
        out: list[bytes | None] = []
        for record_id, ok in zip(ids, self._in_scope(domain, ids, scope), strict=True):
            if not ok:
                out.append(None)  # not held, or outside the scope asked for
            elif domain is MESSAGES:
                msg = self.messages.get(record_id)
                stamp = 0 if msg is None else msg.hlc.physical_ms
                old = cutoff_ms is not None and stamp <= cutoff_ms
                new = settled_ms is not None and stamp > settled_ms
                out.append(None if msg is None or old or new else msg.encoded)
            elif domain in (MEMBERS, INDEX):
                op = self._held(domain).get(record_id)
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

    def apply_ops(self, ops: Sequence[Op | Record]) -> Applied:
        """Merge validated ops: member ops naming a user the scope indexes into the index;
        what lies in the scope's chats planned (``store.plan``) and carried out. What lies
        in neither is refused (counted), whatever brought it."""
        applied, refused = _filter_applied(
            ops, self.scope, self._plan_and_carry_out, self._put_index
        )
        self.refused_out_of_scope += refused
        return applied

    def _put_index(self, ops: list[MembershipOp]) -> list[bool]:
        """Add validated member ops to the index: per op, was it new."""
        new = []
        for op in ops:
            op_id = op.op_id
            fresh = op_id not in self.index
            if fresh:
                self._add_index_entry(op_id, op)
            new.append(fresh)
        return new

    def _add_index_entry(self, op_id: bytes, op: MembershipOp) -> None:
        self.index[op_id] = op
        self._index(INDEX, None, op_id, op_id)
        self._shard_change(INDEX, op.user_id, None, op_id)

    def _drop_index_entry(self, op_id: bytes) -> None:
        op = self.index.pop(op_id)
        self._index(INDEX, op_id, None, op_id)
        self._shard_change(INDEX, op.user_id, op_id, None)

    def _plan_and_carry_out(self, ops: list[Any]) -> Applied:
        plan = plan_ops(ops, self, self.plan_rules)
        self._carry_out(plan)
        return Applied(plan.new, plan.changed, plan.stored)

    def set_scope(self, scope: Scope) -> None:
        """Hold ``scope`` from now on: the messages and deletes outside it leave the replica
        (and its trees) at once; a wider scope is filled by later sessions."""
        if not (scope.is_full or self.scope.is_full) and scope.num_shards != self.scope.num_shards:
            raise ScopeError("a replica's network keeps its number of shards")
        self.scope = scope
        for msg_id in [i for i, m in self.messages.items() if not scope.holds_chat(m.chat_id)]:
            self._drop_message(msg_id)
        for delete_id in [i for i, d in self.deletes.items() if not scope.holds_chat(d.chat_id)]:
            self._drop_delete(delete_id)
        for op_id in [i for i, o in self.member_ops.items() if not scope.holds_chat(o.chat_id)]:
            self._drop_member_op(op_id)
        for op_id in [i for i, o in self.index.items() if not scope.indexes_user(o.user_id)]:
            self._drop_index_entry(op_id)
        for user in [u for u in self.identities if not scope.indexes_user(u)]:
            self._set_identity(user, self.identities[user], None)
        self.waiting.discard(
            {m.msg_id for m in self.waiting.waiting() if not scope.holds_chat(m.chat_id)}
        )

    def apply_record(self, record: Record) -> bool:
        """Merge one validated record (refused outside the scope, as ``apply_ops`` does);
        True if it changed the replica."""
        return self.apply_ops([record]).new[0]

    # --- the HeldView the planner reads ---

    def held(self, msgs: Sequence[MsgV1]) -> set[bytes]:
        return {m.msg_id for m in msgs if m.msg_id in self.messages or m.msg_id in self.deletes}

    def held_member_ops(self, op_ids: Sequence[bytes]) -> set[bytes]:
        return {i for i in op_ids if i in self.member_ops}

    def identity(self, user: bytes) -> tuple[Hlc, bytes] | None:
        return self.identities.get(user)

    def history(self, chat: bytes, user: bytes) -> MemberHistory:
        return self.histories.get((chat, user), NO_HISTORY)

    def dm_parties(self, chat: bytes) -> bytes | None:
        return self.parties.get(chat)

    def admin_state(self, chat: bytes) -> AdminState:
        return self.admin_states.get(chat, NO_ADMINS)

    def has_deletes(self, chat: bytes) -> bool:
        return chat in self.delete_chats

    def deletes_of(self, chat: bytes) -> list[MsgV1]:
        return [d for d in self.deletes.values() if d.chat_id == chat]

    def deletes_referring(self, chat: bytes, ref: bytes) -> list[MsgV1]:
        return [d for d in self.deletes_by_ref.get(ref, ()) if d.chat_id == chat]

    def referrers(self, chat: bytes, ref: bytes) -> list[bytes]:
        return list(self.refs.get(ref, ()))

    def held_message(self, msg_id: bytes) -> MsgV1 | None:
        return self.messages.get(msg_id)

    def is_erased(self, msg_id: bytes) -> bool:
        return msg_id in self.erased

    def waiting_in(self, chats: set[bytes]) -> list[MsgV1]:
        return self.waiting.of_chats(chats)

    # --- carrying a plan out ---

    def _carry_out(self, plan: Plan) -> None:
        for op_id, op in plan.member_ops.items():
            self._add_member_op(op_id, op)
        self.histories.update(plan.histories)
        self.parties.update(plan.dm_parties)
        self.admin_states.update(plan.admins)
        for user, (before, record) in plan.identities.items():
            self._set_identity(user, before, (record.hlc, record.blob))
            self._wrote(IDENTITY, user, before)
        if plan.released_chats:
            self.waiting.release_chats(plan.released_chats)
        for delete in plan.deletes.values():
            self._put_delete(delete)
        for msg_id, msg in plan.erase.items():
            self.erased.add(msg_id)
            self._wrote(MESSAGES, msg_id, msg)
            self._drop_message(msg_id)
        if plan.refused_erased:
            for msg_id in sorted(plan.refused_erased):
                self._mark_erased(msg_id)
        for msg in plan.store.values():
            self._put_message(msg)
        for msg in plan.park:
            self.waiting.park(msg)
        if plan.discard:
            self.waiting.discard(plan.discard)

    def _put_delete(self, delete: MsgV1) -> None:
        assert delete.ref is not None
        self.deletes[delete.msg_id] = delete
        self.deletes_by_ref.setdefault(delete.ref, []).append(delete)
        self.delete_chats.add(delete.chat_id)
        self._index(DELETES, None, delete.msg_id, delete.msg_id)
        self._shard_change(DELETES, delete.chat_id, None, delete.msg_id)
        self._wrote(DELETES, delete.msg_id, None)

    def _drop_delete(self, delete_id: bytes) -> None:
        """A delete of a chat that left the scope."""
        delete = self.deletes.pop(delete_id)
        assert delete.ref is not None
        self.deletes_by_ref[delete.ref].remove(delete)
        if not any(d.chat_id == delete.chat_id for d in self.deletes.values()):
            self.delete_chats.discard(delete.chat_id)
        self._index(DELETES, delete_id, None, delete_id)
        self._shard_change(DELETES, delete.chat_id, delete_id, None)

    def _mark_erased(self, msg_id: bytes) -> None:
        """A message that came after the delete erasing it: remembered, never stored."""
        self.erased.add(msg_id)

    def admins(self, chat_id: bytes) -> IsAdmin:
        """Who may delete others' messages in the chat, from when (store.kinds.IsAdmin)."""
        return self.plan_rules.admins(self.admin_state(chat_id))

    def _put_message(self, msg: MsgV1) -> None:
        msg_id = msg.msg_id
        self.messages[msg_id] = msg
        if msg.ref is not None:
            self.refs.setdefault(msg.ref, set()).add(msg_id)
        self._index(MESSAGES, None, msg_id, msg_id)
        self._shard_change(MESSAGES, msg.chat_id, None, msg_id)
        self._wrote(MESSAGES, msg_id, None)

    def _add_member_op(self, op_id: bytes, op: MembershipOp) -> None:
        """Store a new op and fold it into its row."""
        self.member_ops[op_id] = op
        self._index(MEMBERS, None, op_id, op_id)
        self._shard_change(MEMBERS, op.chat_id, None, op_id)
        self._merge_member((op.chat_id, op.user_id), op.state())

    def _drop_member_op(self, op_id: bytes) -> None:
        """An op of a chat that left the scope, with the chat's rows folded from its ops:
        a chat held again is decided afresh from the ops a session brings back."""
        op = self.member_ops.pop(op_id)
        self._index(MEMBERS, op_id, None, op_id)
        self._shard_change(MEMBERS, op.chat_id, op_id, None)
        key = (op.chat_id, op.user_id)
        self.members.pop(key, None)
        self.histories.pop(key, None)
        self.admin_states.pop(op.chat_id, None)

    def _merge_member(self, key: tuple[bytes, bytes], info: MemberInfo) -> bool:
        before = self.members.get(key)
        after = self._merge_member_states(before, info)
        if after is None or after == before:
            return False
        self.members[key] = after
        self._wrote(MEMBERS, key, before)
        return True

    # --- what readers see ---

    def access(self, chat_id: bytes, user_id: bytes) -> Access:
        history = self.histories.get((chat_id, user_id), NO_HISTORY)
        return Access(history, self.parties.get(chat_id))

    def is_visible(self, msg: MsgV1) -> bool:
        return msg.msg_id in self.messages and self._visible(msg)

    def view(self, chat_id: bytes) -> ChatView:
        """The chat as readers see it (MESSAGES.md): edits, deletes, reactions, receipts."""
        return self.views([chat_id])[chat_id]

    def views(self, chat_ids: Iterable[bytes]) -> dict[bytes, ChatView]:
        """Several chats' views, the held messages and deletes read once for all of them
        (a view of each in turn would read them once a chat)."""
        msgs: dict[bytes, list[MsgV1]] = {chat: [] for chat in chat_ids}
        deletes: dict[bytes, list[MsgV1]] = {chat: [] for chat in msgs}
        for msg in self.messages.values():
            if msg.chat_id in msgs:
                msgs[msg.chat_id].append(msg)
        for delete in self.deletes.values():
            if delete.chat_id in deletes:
                deletes[delete.chat_id].append(delete)
        return {
            chat: fold_chat(held, deletes[chat], self.admins(chat), shown=self._visible)
            for chat, held in msgs.items()
        }

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
        self._shard_change(MESSAGES, msg.chat_id, msg_id, None)

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
        self._shard_change(IDENTITY, user, old, new)

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

    def _visible(self, msg: MsgV1) -> bool:
        return self.plan_rules.visible(msg, self.access(msg.chat_id, msg.sender))

    def _listed(self, domain: Domain, record_id: bytes) -> None:
        self._buckets[domain].add(record_id)

    def _unlisted(self, domain: Domain, record_id: bytes) -> None:
        self._buckets[domain].discard(record_id)

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


# the indexes leaving drops ids from (``store.leaving``) -> the tree they leave
_DROPPED_INDEXES = {
    "seen_msg": MESSAGES, "seen_delete": DELETES, "seen_member": MEMBERS,
    "member_index": INDEX, "seen_identity": IDENTITY,
}  # fmt: skip


def _fit_to_scope(db: ChatDb, scope: Scope) -> None:
    """Open a store on ``scope``: it may hold no message or delete outside it (narrowing is
    ``drop_shards``'s); member ops of other chats, index entries and identities of other
    users, which older versions held everywhere, leave."""
    if any(not scope.holds_chat(chat) for d in (MESSAGES, DELETES) for _, chat in _chats(db, d)):
        raise ScopeError(f"the store holds chats outside {scope}: narrowing is not built")
    if any(not scope.holds_chat(chat) for _, chat in db.members.iter_op_chats()):
        drop_chats(db, lambda chat: not scope.holds_chat(chat))
    drop_users(db, lambda user: not scope.indexes_user(user))


def _chats(db: ChatDb, domain: Domain) -> Iterator[tuple[bytes, bytes]]:
    return db.iter_msg_chats() if domain is MESSAGES else db.iter_delete_chats()


def held_user_shards(db: ChatDb, num_shards: int) -> frozenset[int]:
    """The user shards of the users a store holds index entries or an identity of."""
    users = {user for _, user in db.member_index.iter_users()}
    users.update(user for _, user in db.iter_identity_users())
    return frozenset(user_shard_of(user, num_shards) for user in users)


def held_shards(db: ChatDb, num_shards: int) -> frozenset[int]:
    """The shards of the chats a store holds messages or deletes of (a scan of both)."""
    chats = {chat for _, chat in db.iter_msg_chats()}
    chats.update(chat for _, chat in db.iter_delete_chats())
    return frozenset(shard_of(chat, num_shards) for chat in chats)


class DbReplica(ScopedTrees):
    """A ChatDb seen through the Replica interface, with trees rebuilt from it on creation."""

    def __init__(
        self,
        db: ChatDb,
        waiting: WaitingRoom | None = None,
        *,
        admit_all: bool = False,
        scope: Scope = EVERYTHING,
        listing_cache_ids: int = DEFAULT_MAX_IDS,
    ) -> None:
        """``admit_all``: store and show every message, members or not — the sync engine on
        its own, as protocol tests and the sync benchmark drive it (a node never does).
        ``scope``: what the store holds; records outside it are refused.
        ``listing_cache_ids``: ids of sketched regions kept in memory per domain (32 B each),
        0 to read every listing from the store."""
        self.db = db
        self.scope = scope
        self.refused_out_of_scope = 0
        self._shard_leaves: tuple[int, dict[Domain, ShardLeaves]] | None = None
        if not scope.is_full:
            _fit_to_scope(db, scope)
        self.plan_rules = ADMIT_ALL if admit_all else CHAT_RULES
        self.waiting = waiting if waiting is not None else WaitingRoom()
        # told of every message sync stored that was new here (from the applying thread)
        self.on_new_messages: Callable[[list[MsgV1]], None] | None = None
        self.trees = {
            Domain.MESSAGES: VersionedTree.from_ids(i for i, _ in db.iter_msg_ids()),
            Domain.MEMBERS: VersionedTree.from_ids(db.iter_member_record_ids()),
            Domain.IDENTITY: VersionedTree.from_ids(db.iter_identity_record_ids()),
            Domain.DELETES: VersionedTree.from_ids(db.iter_delete_ids()),
            Domain.INDEX: VersionedTree.from_ids(i for i, _ in db.member_index.iter_users()),
        }
        # sketch regions' listings, kept while their leaves do not change (sync.listing_cache)
        self._listings = {domain: ListingCache(listing_cache_ids) for domain in Domain}
        for domain in Domain:  # listed once now (~0.3 us an id), not by the first sessions
            if 0 < self.trees[domain].count <= listing_cache_ids:
                cutoff = self.cutoff_ms if domain is Domain.MESSAGES else None
                self.ids_in_range(domain, 0, NUM_BUCKETS, cutoff)
        if held := db.load_waiting():  # what waited when the store was last open
            self.apply_ops(held)  # stored if admitted by now, else waits again
            db.save_waiting([], [m.msg_id for m in held if m.msg_id not in self.waiting])

    def tree(self, domain: Domain) -> MerkleTree:
        """The tree of everything held (the replica's own scope)."""
        return self.trees[domain]

    def widen_scope(self, scope: Scope) -> None:
        """Hold ``scope`` from now on, which must cover the current one: later sessions fill
        it. (Narrower: ``drop_shards``.)"""
        if not scope.covers(self.scope):
            raise ScopeError(f"{scope} does not cover {self.scope}: narrowing is not built")
        self.scope = scope

    def drop_shards(self, shards: frozenset[int], user_shards: frozenset[int] = frozenset()) -> int:
        """Leave the chat shards ``shards`` and the user shards ``user_shards``: from now on
        their records are refused, and every row of them leaves the store and the trees in
        this step (``store.leaving``: a chat's messages, deletes and member ops; a user's
        index entries and identity); the records dropped. A member op of a chat still held
        stays in MEMBERS when its user's shard leaves, and in INDEX when its chat's does."""
        if self.scope.shards is None:
            raise ScopeError("a full replica leaves no shard: give it a scope first")
        num, users = self.scope.num_shards, self.scope.user_shards or frozenset()
        # refuse first, then drop
        self.scope = Scope(self.scope.shards - shards, num, users - user_shards)

        def leaves(chat: bytes) -> bool:
            return shard_of(chat, num) in shards

        def user_leaves(user: bytes) -> bool:
            return user_shard_of(user, num) in user_shards

        dropped = drop_chats(self.db, leaves) if shards else Dropped({})
        gone_users = drop_users(self.db, user_leaves) if user_shards else Dropped({})
        self._shard_leaves = None  # rebuilt from the store when next needed
        for index, domain in _DROPPED_INDEXES.items():
            ids = dropped.ids.get(index, []) + gone_users.ids.get(index, [])
            self._track(domain, [(record_id, None, None) for record_id in ids])
        gone = [m.msg_id for m in self.waiting.waiting() if leaves(m.chat_id)]
        self.waiting.discard(set(gone))
        self.db.save_waiting([], gone)
        return dropped.count + gone_users.count

    def _keys_of(self, domain: Domain, ids: list[bytes]) -> list[bytes | None]:
        if domain is Domain.MESSAGES:
            return self.db.msg_chats(ids)
        if domain is Domain.DELETES:
            return self.db.chats_of_deletes(ids)
        if domain is Domain.MEMBERS:
            return self.db.members.chats_of_ops(ids)
        if domain is Domain.IDENTITY:
            return self.db.identity_users_of(ids)
        return self.db.member_index.users_of(ids)

    def _iter_keys(self, domain: Domain) -> Iterator[tuple[bytes, bytes]]:
        if domain is Domain.MESSAGES:
            return self.db.iter_msg_chats()
        if domain is Domain.DELETES:
            return self.db.iter_delete_chats()
        if domain is Domain.MEMBERS:
            return self.db.members.iter_op_chats()
        if domain is Domain.IDENTITY:
            return self.db.iter_identity_users()
        return self.db.member_index.iter_users()

    def expire_messages(self, cutoff_ms: int, batch: int = 10_000) -> list[bytes]:
        """Retention GC on the ChatDb, the tree kept in step, every step at once."""
        return self.expiry(cutoff_ms, batch).run()[1]

    def expiry(self, cutoff_ms: int, batch: int = 10_000) -> Expiry:
        """A GC cycle's steps on the ChatDb, each batch's ids out of the tree in its step."""
        return Expiry(self.db, cutoff_ms, batch, on_expired=self.remove_from_tree)

    @property
    def cutoff_ms(self) -> int | None:
        """The retention cutoff the GC last applied (sync sessions filter messages by it)."""
        return self.db.expire_before_ms

    def remove_from_tree(self, msg_ids: list[bytes]) -> None:
        self._shard_leaves = None  # rebuilt from the store when next needed
        self._track(Domain.MESSAGES, [(msg_id, None, None) for msg_id in msg_ids])

    def _track(self, domain: Domain, changes: list[Change]) -> None:
        """The store's changes into the domain's tree, and into its kept listings with it
        (``ListingCache.track``): a session reads nothing from the store for a bucket only
        the replica's own writes changed."""
        tree = self.trees[domain]
        if isinstance(tree, VersionedTree):
            self._listings[domain].track(tree, changes)
            return
        for old, new, _ in changes:
            tree.replace(old, new)

    def bucket_ids(
        self, domain: Domain, bucket: int, cutoff_ms: int | None, scope: Scope = EVERYTHING
    ) -> list[bytes]:
        return self._keep_in_scope(domain, self._held_in_bucket(domain, bucket, cutoff_ms), scope)

    def _held_in_bucket(self, domain: Domain, bucket: int, cutoff_ms: int | None) -> list[bytes]:
        if domain is Domain.MESSAGES:
            if cutoff_ms is None:
                return self.db.get_bucket_msg_ids(bucket)
            return self.db.get_bucket_msg_ids_filtered(bucket, cutoff_ms)
        if domain is Domain.MEMBERS:
            return self.db.get_bucket_member_ids(bucket)
        if domain is Domain.DELETES:
            return self.db.get_bucket_delete_ids(bucket)
        if domain is Domain.INDEX:
            return self.db.member_index.bucket_ids(bucket)
        return self.db.get_bucket_identity_ids(bucket)

    def ids_in_range(
        self,
        domain: Domain,
        start: int,
        end: int,
        cutoff_ms: int | None,
        scope: Scope = EVERYTHING,
    ) -> bytes:
        tree = self.trees[domain]
        if isinstance(tree, VersionedTree) and self._within(domain, scope) is None:
            stamped = self._stamped_ids(domain, cutoff_ms)
            return self._listings[domain].read(  # all we hold there: the kept listings
                tree.versions,
                start,
                end,
                cutoff_ms,
                lambda lo, hi: b"".join(self._range_ids(domain, lo, hi, cutoff_ms)),
                None if stamped is None else lambda lo, hi: stamped([(lo, hi)])[0],
            )
        ids = self._range_ids(domain, start, end, cutoff_ms)
        return b"".join(self._keep_in_scope(domain, ids, scope))

    def ids_in_runs(
        self,
        domain: Domain,
        runs: Sequence[tuple[int, int]],
        cutoff_ms: int | None,
        scope: Scope = EVERYTHING,
    ) -> bytes:
        tree = self.trees[domain]
        if isinstance(tree, VersionedTree) and self._within(domain, scope) is None:
            # the kept listings; the changed buckets of every run read in one store call
            return self._listings[domain].read_runs(
                tree.versions,
                runs,
                cutoff_ms,
                lambda stale: self._runs_ids(domain, stale, cutoff_ms),
                self._stamped_ids(domain, cutoff_ms),
            )
        return super().ids_in_runs(domain, runs, cutoff_ms, scope)

    def _stamped_ids(
        self, domain: Domain, cutoff_ms: int | None
    ) -> Callable[[list[tuple[int, int]]], list[tuple[bytes, bytes]]] | None:
        """Runs' ids with their stamps, for listings kept under a cutoff (messages only)."""
        if domain is not Domain.MESSAGES or cutoff_ms is None:
            return None
        cutoff = cutoff_ms
        return lambda runs: self.db.get_ranges_msg_ids_stamped(runs, cutoff)

    def _runs_ids(
        self, domain: Domain, runs: list[tuple[int, int]], cutoff_ms: int | None
    ) -> list[bytes]:
        if domain is Domain.MESSAGES:
            return self.db.get_ranges_msg_ids(runs, cutoff_ms)
        return [b"".join(self._range_ids(domain, lo, hi, cutoff_ms)) for lo, hi in runs]

    def _range_ids(
        self, domain: Domain, start: int, end: int, cutoff_ms: int | None
    ) -> list[bytes]:
        if domain is Domain.MESSAGES:
            return self.db.get_range_msg_ids(start, end, cutoff_ms)
        if domain is Domain.MEMBERS:
            return self.db.get_range_member_ids(start, end)
        if domain is Domain.DELETES:
            return self.db.get_range_delete_ids(start, end)
        if domain is Domain.INDEX:
            return self.db.member_index.range_ids(start, end)
        return self.db.get_range_identity_ids(start, end)

    def get_records(
        self,
        domain: Domain,
        ids: list[bytes],
        cutoff_ms: int | None,
        settled_ms: int | None = None,
        scope: Scope = EVERYTHING,
    ) -> list[bytes | None]:
        if self._within(domain, scope) is not None:
            # ask the store only for what lies in the scope: the rest is answered None
            mask = self._in_scope(domain, ids, scope)
            inside = [i for i, ok in zip(ids, mask, strict=True) if ok]
            found = iter(self.get_records(domain, inside, cutoff_ms, settled_ms))
            return [next(found) if ok else None for ok in mask]
        if domain is Domain.MESSAGES:
            return self.db.get_messages_cbor_by_ids(ids, cutoff_ms, settled_ms)
        if domain is Domain.MEMBERS:
            return self.db.get_member_records_by_ids(ids)
        if domain is Domain.DELETES:
            return self.db.get_deletes_by_ids(ids)
        if domain is Domain.INDEX:
            return self.db.member_index.records_by_ids(ids)
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
        frames: one path from the store to the trees. The ChatDb plans the batch from what
        it holds (``store.plan``) and carries the plan out; the trees follow the plan.
        Member ops naming a user the scope indexes go to the member index too; what lies
        in neither the scope's chats nor its index is refused (counted)."""
        applied, refused = _filter_applied(
            ops, self.scope, self._plan_and_carry_out, self._put_index
        )
        self.refused_out_of_scope += refused
        return applied

    def _put_index(self, ops: list[MembershipOp]) -> list[bool]:
        new, ids = self.db.member_index.put(ops)
        self._track(
            Domain.INDEX, [(None, i, None) for i, fresh in zip(ids, new, strict=True) if fresh]
        )
        for op, op_id, fresh in zip(ops, ids, new, strict=True):
            if fresh:
                self._shard_change(Domain.INDEX, op.user_id, None, op_id)
        return new

    def _plan_and_carry_out(self, ops: list[Any]) -> Applied:
        plan = self.db.apply_ops(ops, self.waiting, self.plan_rules)
        changes: dict[Domain, list[Change]] = {}
        for domain, old, new in tree_changes(plan):
            # a stored message's stamp: what a retention cutoff filters its kept listing by
            stamp = plan.store[new].hlc.physical_ms if domain is MESSAGES and new else None
            changes.setdefault(domain, []).append((old, new, stamp))
        for domain, domain_changes in changes.items():
            self._track(domain, domain_changes)
        if self._shard_leaves is not None:
            for domain, key, old, new in shard_changes(plan):
                self._shard_change(domain, key, old, new)
        return Applied(plan.new, plan.changed, plan.stored)

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


def tree_changes(plan: Plan) -> Iterator[tuple[Domain, bytes | None, bytes | None]]:
    """The Merkle trees' changes a plan makes: (domain, id leaving, id entering)."""
    for op_id in plan.member_ops:
        yield MEMBERS, None, op_id
    for user, (before, record) in plan.identities.items():
        old = None if before is None else compute_identity_record_id(user, *before)
        yield IDENTITY, old, record.record_id
    for delete_id in plan.deletes:
        yield DELETES, None, delete_id
    for msg_id in plan.erase:
        yield MESSAGES, msg_id, None
    for msg_id in plan.store:
        yield MESSAGES, None, msg_id


def shard_changes(plan: Plan) -> Iterator[tuple[Domain, bytes, bytes | None, bytes | None]]:
    """The per-shard leaves' changes a plan makes: (domain, placement key, id leaving, id
    entering)."""
    for op_id, op in plan.member_ops.items():
        yield MEMBERS, op.chat_id, None, op_id
    for user, (before, record) in plan.identities.items():
        old = None if before is None else compute_identity_record_id(user, *before)
        yield IDENTITY, user, old, record.record_id
    for delete_id, delete in plan.deletes.items():
        yield DELETES, delete.chat_id, None, delete_id
    for msg_id, msg in plan.erase.items():
        yield MESSAGES, msg.chat_id, msg_id, None
    for msg_id, msg in plan.store.items():
        yield MESSAGES, msg.chat_id, None, msg_id
