"""The chat rules' decisions, once: from ops and a read view of the held state, a plan. Pure.

Theory of operation. A replica — the node's RocksDB one, the in-memory one, each
simulated node — applies a batch of validated ops in two steps: ``plan_ops`` decides
everything the chat rules decide, and the replica carries the ``Plan`` out (dicts;
a WriteBatch and its trees). So a rule written here is the same rule everywhere,
and the simulator proves the node's own rules, not a twin of them.

The decisions, in this order (MESSAGES.md, ``store.access``, ``store.kinds``):

1. **Member ops** not held are stored; each grows its (chat, user)'s history, may
   show the chat to be a DM (its two parties) or name its creator, and an admin
   add may make its user an admin from an earlier stamp.
2. **Identities**: the record that wins (``store.merge.identity_wins``) replaces.
3. **Release**: the messages waiting in chats whose ops grew leave the room and are
   decided again with the messages of the batch — the deletes first, then the rest.
4. **Hold**: a message its chat's ops do not admit yet waits (unless a held delete
   erases it: it could never be stored).
5. **Store** a delete (valid or not yet: an admin add may still come) and **erase**
   what it erases if valid now: its target, the target author's edits, reactions.
6. **Store** a message, marked hidden when its sender was not active at its stamp;
   or refuse it as erased (a held valid delete erases it, or it was erased before),
   or as expired (at or below the retention GC's cutoff).
7. **Erase again**: users the batch made admins (or a group's creator now known) —
   their held deletes may erase more now.
8. **Discard** the waiting messages the batch's deletes erase.
9. **Re-decide**: the senders whose history grew have their held messages from the
   earliest new stamp shown or hidden again (a replica that decides visibility when
   reading has nothing to do).

The read view (``HeldView``) is narrow on purpose: what is held, the histories,
the admins, the deletes and references, what is erased or waiting. The planner
keeps its own decisions in an overlay over it, so that an op sees the ones before
it in the batch. ``RuleSet`` names the predicates; the simulator's planted bugs swap
one of them (``sim/bugs.py``), the sync engine alone admits everything (``ADMIT_ALL``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from store.access import Access, MemberHistory, admissible, visible
from store.authz import DmProof
from store.hlc import Hlc
from store.kinds import IsAdmin, delete_is_valid, erases
from store.merge import identity_wins
from store.ops import MembershipAction, MembershipOp, Op
from store.records import IdentityRecord, MessageKind, MsgV1, Role

Pair = tuple[bytes, bytes]  # (chat, user)
Identity = tuple[Hlc, bytes]  # (stamp, blob)


@dataclass(frozen=True, slots=True)
class AdminState:
    """Who may delete others' messages in a chat: its creator, and each user from their
    first admin add on."""

    creator: bytes | None = None
    since: Mapping[bytes, Hlc] = field(default_factory=dict)  # user -> first admin add


NO_ADMINS = AdminState()


def admin_rule(state: AdminState) -> IsAdmin:
    creator, since = state.creator, state.since

    def is_admin(user: bytes, hlc: Hlc) -> bool:
        first = since.get(user)
        return user == creator or (first is not None and first <= hlc)

    return is_admin


def admin_state_of(ops: Iterable[MembershipOp]) -> AdminState:
    """A chat's admins folded from its member ops (any order)."""
    state = NO_ADMINS
    for op in ops:
        state = _with_op(state, op)
    return state


def _with_op(state: AdminState, op: MembershipOp) -> AdminState:
    creator, since = state.creator, state.since
    proof = op.proof
    if creator is None and proof is not None and not isinstance(proof, DmProof):
        creator = proof.creator
    if op.action is MembershipAction.ADD and op.role is Role.ADMIN:
        first = since.get(op.user_id)
        if first is None or op.hlc < first:
            since = {**since, op.user_id: op.hlc}
    if creator is state.creator and since is state.since:
        return state
    return AdminState(creator, since)


MessageRule = Callable[[MsgV1, Access], bool]
IdentityRule = Callable[[Identity, Identity | None], bool]


def _all(msg: MsgV1, access: Access) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class RuleSet:
    """The predicates a plan is decided by; the defaults are the chat rules."""

    admissible: MessageRule = admissible  # stored (else waits)
    visible: MessageRule = visible  # shown
    identity_wins: IdentityRule = identity_wins
    admins: Callable[[AdminState], IsAdmin] = admin_rule  # who may delete others' messages


CHAT_RULES = RuleSet()
ADMIT_ALL = RuleSet(admissible=_all, visible=_all)  # the sync engine alone: members ignored


class HeldView(Protocol):
    """What a plan reads of the replica it is for (nothing of the batch: the planner
    keeps that itself)."""

    expire_before_ms: int | None  # retention: messages at or below it are refused

    def held(self, msgs: Sequence[MsgV1]) -> set[bytes]:
        """The ids among ``msgs`` this replica holds (a message, or a delete)."""
        ...

    def held_member_ops(self, op_ids: Sequence[bytes]) -> set[bytes]: ...

    def identity(self, user: bytes) -> Identity | None: ...

    def history(self, chat: bytes, user: bytes) -> MemberHistory: ...

    def dm_parties(self, chat: bytes) -> bytes | None: ...

    def admin_state(self, chat: bytes) -> AdminState: ...

    def has_deletes(self, chat: bytes) -> bool:
        """False only if the chat holds no delete (lets most messages skip the checks)."""
        ...

    def deletes_of(self, chat: bytes) -> list[MsgV1]: ...

    def deletes_referring(self, chat: bytes, ref: bytes) -> list[MsgV1]: ...

    def referrers(self, chat: bytes, ref: bytes) -> list[bytes]:
        """The held edits and reactions of ``ref`` (ids)."""
        ...

    def held_message(self, msg_id: bytes) -> MsgV1 | None: ...

    def is_erased(self, msg_id: bytes) -> bool: ...

    def waiting_in(self, chats: set[bytes]) -> list[MsgV1]: ...


@dataclass(slots=True)
class Plan:
    """What the replica must do. ``new`` and ``changed`` are what it reports."""

    new: list[bool]  # per op: does it change the replica (a message: stored)
    member_ops: dict[bytes, MembershipOp] = field(default_factory=dict)  # op id -> op to store
    histories: dict[Pair, MemberHistory] = field(default_factory=dict)  # grown: after
    dm_parties: dict[bytes, bytes] = field(default_factory=dict)  # chats now known as DMs
    admins: dict[bytes, AdminState] = field(default_factory=dict)  # changed: after
    identities: dict[bytes, tuple[Identity | None, IdentityRecord]] = field(
        default_factory=dict
    )  # user -> (before, the record that replaces it)
    released_chats: set[bytes] = field(default_factory=set)  # their waiting messages leave
    deletes: dict[bytes, MsgV1] = field(default_factory=dict)  # DELETE messages to store
    erase: dict[bytes, MsgV1] = field(default_factory=dict)  # held messages to erase
    store: dict[bytes, MsgV1] = field(default_factory=dict)  # messages to store, in order
    hidden: set[bytes] = field(default_factory=set)  # of ``store``: not shown
    refused_erased: dict[bytes, bytes] = field(default_factory=dict)  # came, erased: id -> chat
    park: list[MsgV1] = field(default_factory=list)  # to wait (released ones included)
    discard: set[bytes] = field(default_factory=set)  # waiting ids a delete erased
    redecide: dict[Pair, Hlc] = field(default_factory=dict)  # (chat, sender) -> from stamp
    changed: int = 0

    @property
    def stored(self) -> list[MsgV1]:
        """The messages new to the replica: deletes, then the others."""
        return [*self.deletes.values(), *self.store.values()]


def plan_ops(ops: Sequence[Op], held: HeldView, rules: RuleSet = CHAT_RULES) -> Plan:
    """Decide what applying ``ops`` (validated) does to the replica ``held`` views."""
    if len(ops) == 1:
        plan = _one_message(ops[0], held, rules)
        if plan is not None:
            return plan
    return _Planner(held, rules).plan(ops)


def _one_message(op: Op, held: HeldView, rules: RuleSet) -> Plan | None:
    """A batch of one message that is no delete — what gossip brings most of the time:
    ``_Planner.plan``'s decisions for it, step for step, without the bookkeeping a batch
    needs (no member op grows a history, so nothing is released or decided again; no
    delete in the batch erases anything). None: the planner decides."""
    if type(op) is not MsgV1 or op.kind is MessageKind.DELETE:
        return None
    chat, msg_id = op.chat_id, op.msg_id
    plan = Plan([False])
    if held.held([op]):
        return plan
    deletes = held.has_deletes(chat)
    access = Access(held.history(chat, op.sender), held.dm_parties(chat))
    if not rules.admissible(op, access):
        if not (deletes and _erased_by_held_delete(op, held, rules)):
            plan.park.append(op)  # nothing waits that could never be stored
        return plan
    if deletes:  # _Planner._erased_on_arrival
        if held.is_erased(msg_id):
            return plan
        if _erased_by_held_delete(op, held, rules):
            plan.refused_erased[msg_id] = chat
            return plan
    expire = held.expire_before_ms
    if expire is not None and op.hlc.physical_ms <= expire:
        return plan
    plan.store[msg_id] = op
    if not rules.visible(op, access):
        plan.hidden.add(msg_id)
    plan.new[0] = True
    plan.changed = 1
    return plan


def _erased_by_held_delete(msg: MsgV1, held: HeldView, rules: RuleSet) -> bool:
    """``_Planner._erased_by_a_delete`` when the batch holds no delete."""
    chat = msg.chat_id
    is_admin = rules.admins(held.admin_state(chat))
    return any(
        delete_is_valid(delete, is_admin) and erases(delete, msg)
        for ref in (msg.msg_id, msg.ref)
        if ref is not None
        for delete in held.deletes_referring(chat, ref)
    )


class _Planner:
    def __init__(self, held: HeldView, rules: RuleSet) -> None:
        self.held = held
        self.rules = rules
        self._access: dict[Pair, Access] = {}
        self._is_admin: dict[bytes, IsAdmin] = {}
        self._delete_refs: dict[tuple[bytes, bytes], list[MsgV1]] = {}  # batch deletes
        self._referrers: dict[bytes, list[bytes]] = {}  # ref -> batch messages referring
        self._chats_with_deletes: dict[bytes, bool] = {}
        self._stored_then_erased: set[bytes] = set()  # by a delete its sender may now make

    def plan(self, ops: Sequence[Op]) -> Plan:
        plan = self.p = Plan([False] * len(ops))
        promoted: set[Pair] = set()
        self._member_ops(ops, promoted)
        for i, op in enumerate(ops):
            if isinstance(op, IdentityRecord):
                plan.new[i] = self._identity(op)
        msgs = [(i, op) for i, op in enumerate(ops) if isinstance(op, MsgV1)]
        grown = {chat for chat, _ in plan.histories}
        released = self.held.waiting_in(grown) if grown else []
        plan.released_chats = grown
        candidates = [m for _, m in msgs] + released
        already = self.held.held(candidates) if candidates else set()
        deletes_first = sorted(
            range(len(candidates)), key=lambda j: candidates[j].kind is not MessageKind.DELETE
        )
        for j in deletes_first:
            self._admit(candidates[j], already)
        if promoted:
            self._erase_again(promoted)
        self._discard_erased_waiting(released)
        for i, msg in msgs:
            plan.new[i] = self._stored(msg)
        plan.changed = sum(plan.new) + sum(self._stored(m) for m in released)
        return plan

    def _stored(self, msg: MsgV1) -> bool:
        """Did the plan store ``msg`` (a message erased by the batch was stored, then erased)."""
        p, msg_id = self.p, msg.msg_id
        return msg_id in p.store or msg_id in p.deletes or msg_id in self._stored_then_erased

    # --- member ops and identities ---

    def _member_ops(self, ops: Sequence[Op], promoted: set[Pair]) -> None:
        member_ops = [(i, op) for i, op in enumerate(ops) if isinstance(op, MembershipOp)]
        if not member_ops:
            return
        ids = [op.op_id for _, op in member_ops]
        known = self.held.held_member_ops(ids)
        plan, held = self.p, self.held
        for (i, op), op_id in zip(member_ops, ids, strict=True):
            if op_id in known or op_id in plan.member_ops:
                continue
            plan.new[i] = True
            plan.member_ops[op_id] = op
            pair = (op.chat_id, op.user_id)
            before = plan.histories.get(pair)
            if before is None:
                before = held.history(*pair)
                if before.adds:  # held messages of theirs may change fate
                    plan.redecide[pair] = op.hlc
            elif pair in plan.redecide:
                plan.redecide[pair] = min(plan.redecide[pair], op.hlc)
            plan.histories[pair] = before.with_op(op.hlc, op.action is MembershipAction.ADD)
            self._access.pop(pair, None)
            proof = op.proof
            if isinstance(proof, DmProof) and self._parties(op.chat_id) is None:
                plan.dm_parties[op.chat_id] = proof.parties()
                self._access = {k: v for k, v in self._access.items() if k[0] != op.chat_id}
            admins = self._admin_state(op.chat_id)
            after = _with_op(admins, op)
            if after is not admins:
                plan.admins[op.chat_id] = after
                self._is_admin.pop(op.chat_id, None)
                if after.creator is not None and after.creator != admins.creator:
                    promoted.add((op.chat_id, after.creator))
                if after.since is not admins.since:
                    promoted.add(pair)

    def _identity(self, record: IdentityRecord) -> bool:
        plan, user = self.p, record.user_id
        if user in plan.identities:
            before, current = plan.identities[user]
            stored: Identity | None = (current.hlc, current.blob)
        else:
            before = stored = self.held.identity(user)
        incoming = (record.hlc, record.blob)
        if stored == incoming or not self.rules.identity_wins(incoming, stored):
            return False
        plan.identities[user] = (before, record)
        return True

    # --- what the planner knows: the held state with the batch's decisions over it ---

    def _parties(self, chat: bytes) -> bytes | None:
        return self.p.dm_parties.get(chat) or self.held.dm_parties(chat)

    def _access_of(self, pair: Pair) -> Access:
        access = self._access.get(pair)
        if access is None:
            history = self.p.histories.get(pair)
            if history is None:
                history = self.held.history(*pair)
            access = self._access[pair] = Access(history, self._parties(pair[0]))
        return access

    def _admin_state(self, chat: bytes) -> AdminState:
        state = self.p.admins.get(chat)
        return state if state is not None else self.held.admin_state(chat)

    def _admins(self, chat: bytes) -> IsAdmin:
        is_admin = self._is_admin.get(chat)
        if is_admin is None:
            is_admin = self._is_admin[chat] = self.rules.admins(self._admin_state(chat))
        return is_admin

    def _has_deletes(self, chat: bytes) -> bool:
        known = self._chats_with_deletes.get(chat)
        if known is None:
            known = self._chats_with_deletes[chat] = self.held.has_deletes(chat)
        return known

    def _deletes_referring(self, chat: bytes, ref: bytes) -> list[MsgV1]:
        held = self.held.deletes_referring(chat, ref) if self.held.has_deletes(chat) else []
        return held + self._delete_refs.get((chat, ref), [])

    def _message(self, msg_id: bytes) -> MsgV1 | None:
        """A message held or stored by this plan, and not erased by it."""
        plan = self.p
        if msg_id in plan.erase:
            return None
        msg = plan.store.get(msg_id)
        return msg if msg is not None else self.held.held_message(msg_id)

    # --- messages ---

    def _admit(self, msg: MsgV1, already: set[bytes]) -> None:
        plan, msg_id = self.p, msg.msg_id
        if msg_id in already or msg_id in plan.store or msg_id in plan.deletes:
            return
        if msg_id in plan.erase or msg_id in plan.refused_erased:
            return
        access = self._access_of((msg.chat_id, msg.sender))
        if not self.rules.admissible(msg, access):
            if not self._erased_by_a_delete(msg):  # nothing waits that could never be stored
                plan.park.append(msg)
            return
        if msg.kind is MessageKind.DELETE:
            self._store_delete(msg)
            return
        if self._erased_on_arrival(msg):
            return
        expire = self.held.expire_before_ms
        if expire is not None and msg.hlc.physical_ms <= expire:
            return  # the GC removed (or would remove) it: never store it again
        plan.store[msg_id] = msg
        if not self.rules.visible(msg, access):
            plan.hidden.add(msg_id)
        if msg.ref is not None:
            self._referrers.setdefault(msg.ref, []).append(msg_id)

    def _store_delete(self, delete: MsgV1) -> None:
        assert delete.ref is not None
        self.p.deletes[delete.msg_id] = delete
        self._delete_refs.setdefault((delete.chat_id, delete.ref), []).append(delete)
        self._chats_with_deletes[delete.chat_id] = True
        self._erase_for(delete)

    def _erase_for(self, delete: MsgV1) -> None:
        """Erase the messages this delete erases, if it is valid now."""
        if not delete_is_valid(delete, self._admins(delete.chat_id)):
            return
        ref = delete.ref
        assert ref is not None
        plan = self.p
        held_refs = self.held.referrers(delete.chat_id, ref)
        for msg_id in sorted({ref, *held_refs, *self._referrers.get(ref, ())}):
            msg = self._message(msg_id)
            if msg is None or not erases(delete, msg):
                continue
            if plan.store.pop(msg_id, None) is not None:  # stored by this plan: never is
                plan.hidden.discard(msg_id)
                plan.refused_erased[msg_id] = msg.chat_id
                self._stored_then_erased.add(msg_id)
            else:
                plan.erase[msg_id] = msg

    def _erased_on_arrival(self, msg: MsgV1) -> bool:
        """A message a held valid delete erases, or erased before, is not stored."""
        if not self._has_deletes(msg.chat_id):
            return False
        if self.held.is_erased(msg.msg_id):
            return True
        if self._erased_by_a_delete(msg):
            self.p.refused_erased[msg.msg_id] = msg.chat_id
            return True
        return False

    def _erased_by_a_delete(self, msg: MsgV1) -> bool:
        chat = msg.chat_id
        if not self._has_deletes(chat):
            return False
        is_admin = self._admins(chat)
        return any(
            delete_is_valid(delete, is_admin) and erases(delete, msg)
            for ref in (msg.msg_id, msg.ref)
            if ref is not None
            for delete in self._deletes_referring(chat, ref)
        )

    def _erase_again(self, promoted: set[Pair]) -> None:
        """Users the batch made admins: their deletes may erase more now."""
        plan = self.p
        for chat in sorted({chat for chat, _ in promoted}):
            held = self.held.deletes_of(chat) if self._has_deletes(chat) else []
            batch = [d for d in plan.deletes.values() if d.chat_id == chat]
            for delete in held + batch:
                if (chat, delete.sender) in promoted:
                    self._erase_for(delete)

    def _discard_erased_waiting(self, released: list[MsgV1]) -> None:
        """What the batch's deletes erase among the waiting messages could never be stored."""
        plan = self.p
        chats = {d.chat_id for d in plan.deletes.values()}
        if not chats:
            return
        gone = {m.msg_id for m in plan.park if m.chat_id in chats and self._erased_by_a_delete(m)}
        if gone:
            plan.park = [m for m in plan.park if m.msg_id not in gone]
        out = {m.msg_id for m in released}
        waiting = [m for m in self.held.waiting_in(chats) if m.msg_id not in out]
        plan.discard = {m.msg_id for m in waiting if self._erased_by_a_delete(m)}
