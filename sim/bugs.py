"""Planted bugs: the checker's own test. Off unless a test or ``--plant`` asks for one.

The simulated nodes take their merge, validation, message-rule and tree behaviour
from a ``Rules`` object; ``rules_for(None)`` is the project's real code
(``store.merge``, ``store.access``, ``HlcClock``'s drift check, the retention
cutoff, ``sync.merkle.MerkleTree``).
Each planted bug swaps one piece for a broken wrapper here, in ``sim/``, so
``store/`` and ``sync/`` never carry a bug switch (``SimReplica`` hands the node's planner,
``store.plan``, the predicates ``Rules.plan_rules`` names — the message rule, identity LWW
and who may delete — and reads the other switches itself: the member-row merge, the drift
and retention checks, the verdicts frozen on arrival, how ``view()`` picks an edit).
``chatsync sim bugs``, ``tests/sim/test_engine.py`` and ``tests/sim/test_spark_run.py`` show that each one is caught.

Generator bugs (``GENERATOR_BUGS``) are the generator's clients' (``sim/sender_keys.py``):
the trace carries them (``GenParams.plant``, ``chatsync sim generate --plant``), the nodes
run the real rules, and the oracle's group-key counters catch them.

Peering bugs (``PeeringBug``) swap the ``sync.peering.PeerBook`` the overlay
(``sim/overlay.py``) gives each node; ``chatsync sim scale --plant`` and
``tests/sim/test_overlay.py`` show that they are caught.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from sim.trees import IndexedTree, SimTree, TreeCache
from store.access import Access, admissible, visible
from store.hlc import Hlc
from store.keys import NUM_BUCKETS, RECORD_ID_LEN
from store.kinds import IsAdmin
from store.merge import identity_wins, merge_member_states
from store.plan import AdminState, RuleSet, admin_rule
from store.records import MemberInfo, MessageKind, MsgV1
from sync.buckets import Buckets
from sync.merkle import DEPTH, FANOUT_BITS, MerkleTree, check_hash
from sync.peering import KnownPeer, PeerBook


class Bug(StrEnum):
    LWW_ARRIVAL = "lww-arrival"  # identity LWW tie broken by arrival order (last one wins)
    ADD_REMOVE_INVERTED = "add-remove-inverted"  # an add and a remove at one stamp: add wins
    NO_MAX_OFFSET = "no-max-offset"  # no HLC drift check on gossip or sync ingress
    GC_RESURRECTION = "gc-resurrection"  # ingress ignores the retention cutoff
    BUCKET_OFF_BY_ONE = "bucket-off-by-one"  # the message tree files each id one bucket up
    # a message is shown iff its sender's row was active when it arrived; never re-decided
    AUTHZ_ARRIVAL = "authz-arrival"
    AUTHZ_NO_REMOVALS = "authz-no-removals"  # removals ignored: every admissible message shown
    ANYONE_MAY_DELETE = "anyone-may-delete"  # delete validity ignores author and admin
    EDIT_ARRIVAL_ORDER = "edit-arrival-order"  # the edit that arrived last wins, not (hlc, id)
    KEYS_FROM_NON_MEMBER = "keys-from-non-member"  # a KEYS message is stored and shown from anyone
    # the generator's group senders keep their epoch after a removal (sim/sender_keys.py)
    NO_ROTATE_ON_REMOVE = "no-rotate-on-remove"
    NO_HAND_OVER = "no-hand-over"  # no member hands over the keys a removed sender owes
    # scoped traces (sim/scopes.py): a node growing its scope drops a shard it held
    SCOPE_FORGETS_CHAT = "scope-forgets-chat"
    # scoped traces: an initiator offers and keeps everything, whatever its scope
    SESSION_BEYOND_INTERSECTION = "session-beyond-intersection"


# Bugs of the generator's clients, not of the nodes: the trace carries them (``GenParams.plant``)
GENERATOR_BUGS = frozenset({Bug.NO_ROTATE_ON_REMOVE, Bug.NO_HAND_OVER})
# Bugs of partial replication: hunted on scoped traces (``sim.hunt``)
SCOPE_BUGS = frozenset({Bug.SCOPE_FORGETS_CHAT, Bug.SESSION_BEYOND_INTERSECTION})


class PeeringBug(StrEnum):
    # connects and syncs with its bootstrap peers only: what it is told it drops
    BOOTSTRAP_ONLY = "bootstrap-only"


PEERING_BUGS = frozenset(b.value for b in PeeringBug)


IdentityWins = Callable[[tuple[Hlc, bytes], tuple[Hlc, bytes] | None], bool]
MergeMember = Callable[[MemberInfo | None, MemberInfo | None], MemberInfo | None]
MessageRule = Callable[[MsgV1, Access], bool]


def _active(info: MemberInfo) -> bool:
    return info.active


def _next_scope(held: frozenset[int], told: frozenset[int]) -> frozenset[int]:
    """A scope change: the node holds what it is told (``sim.scopes``'s event)."""
    return told


def _next_scope_forgetting(held: frozenset[int], told: frozenset[int]) -> frozenset[int]:
    """BUG: a scope that grows forgets the lowest shard it already held (and its chats)."""
    kept = held & told
    if told > held and kept:
        return told - {min(kept)}
    return told


def _everyone_admin(state: AdminState) -> IsAdmin:
    """BUG: everyone is an admin to delete validity (claims are still checked)."""
    return lambda user, hlc: True


@dataclass(frozen=True)
class Rules:
    """What a simulated node runs. The defaults are the project's own functions."""

    identity_wins: IdentityWins = identity_wins
    merge_member: MergeMember = merge_member_states
    member_active: Callable[[MemberInfo], bool] = _active
    check_drift: bool = True
    retention_filter: bool = True
    message_tree: Callable[[TreeCache, Buckets], MerkleTree] = IndexedTree
    admissible: MessageRule = admissible  # stored (store.access)
    visible: MessageRule = visible  # shown, decided when read
    # BUG switch: shown iff the sender's member row was active when the message was stored
    decide_on_arrival: bool = False
    # BUG switch: everyone is an admin to delete validity (claims are still checked)
    anyone_may_delete: bool = False
    # BUG switch: a view shows the edit that arrived last (SimReplica.view)
    edit_by_arrival: bool = False
    # what a scope change leaves the replica holding (held, told) -> shards
    next_scope: Callable[[frozenset[int], frozenset[int]], frozenset[int]] = _next_scope
    # BUG switch: a session's initiator claims and keeps every shard (sim.engine._session)
    session_beyond_scope: bool = False

    def plan_rules(self) -> RuleSet:
        """The predicates the node's planner (``store.plan``) decides a simulated node's
        batches by: the project's own, or one planted bug's."""
        admins = _everyone_admin if self.anyone_may_delete else admin_rule
        return RuleSet(self.admissible, self.visible, self.identity_wins, admins)


# --- the broken pieces ---------------------------------------------------------------------


def _identity_wins_by_arrival(
    incoming: tuple[Hlc, bytes], stored: tuple[Hlc, bytes] | None
) -> bool:
    """BUG: compares stamps only, so on a tie whatever arrives last replaces what is stored."""
    return stored is None or incoming[0] >= stored[0]


def _merge_add_wins(local: MemberInfo | None, remote: MemberInfo | None) -> MemberInfo | None:
    """BUG: an add and a remove with one stamp resolve to the add (the real rule: remove wins)."""
    merged = merge_member_states(local, remote)
    if (
        merged is not None
        and merged.removed_at is not None
        and merged.removed_at == merged.added_at
    ):
        return MemberInfo(merged.role, merged.added_at, None, merged.add_proof, None)
    return merged


def _active_add_wins(info: MemberInfo) -> bool:
    return info.removed_at is None or info.removed_at <= info.added_at


def _visible_ignoring_removals(msg: MsgV1, access: Access) -> bool:
    """BUG: removes and leaves never hide anything: whatever is admitted is shown."""
    return admissible(msg, access)


def _keys_admitted_from_anyone(msg: MsgV1, access: Access) -> bool:
    """BUG: a KEYS message needs no member op: stored whoever sent it."""
    return msg.kind is MessageKind.KEYS or admissible(msg, access)


def _keys_shown_from_anyone(msg: MsgV1, access: Access) -> bool:
    """BUG: ... and shown whoever sent it."""
    return msg.kind is MessageKind.KEYS or visible(msg, access)


class OffByOneTree(SimTree):
    """BUG: ``MerkleTree._toggle`` with the leaf index one too high."""

    __slots__ = ()

    def __init__(self, cache: TreeCache | None = None, known: Buckets | None = None) -> None:
        super().__init__(cache)  # every level its own: the shard's index is not read

    def _toggle(self, record_id: bytes, delta: int) -> None:
        if len(record_id) != RECORD_ID_LEN:
            raise ValueError(f"record id must be {RECORD_ID_LEN} bytes, got {len(record_id)}")
        bucket = (((record_id[0] << 8) | record_id[1]) + 1) % NUM_BUCKETS
        value = int.from_bytes(record_id, "big")
        for depth in range(DEPTH, -1, -1):
            index = bucket >> (FANOUT_BITS * (DEPTH - depth))
            self._xor[depth][index] ^= value
            self._count[depth][index] += delta
        self._check[bucket] ^= check_hash(record_id)


class BootstrapOnlyBook(PeerBook):
    """BUG: never uses exchanged peers — drops what it is told, dials its pins only (it
    still answers exchanges and accepts whoever dials it)."""

    def heard(self, source: str, told: Iterable[tuple[str, Sequence[str]]], now_ms: int) -> int:
        return 0

    def to_dial(
        self, count: int, skip: Collection[str], now_ms: int, rnd: random.Random
    ) -> list[KnownPeer]:
        due = super().to_dial(len(self.peers), skip, now_ms, rnd)
        return [p for p in due if p.pinned][:count]


def book_for(bug: str | None) -> type[PeerBook]:
    """The book a simulated node keeps its peers in: the node's own, or a peering bug's."""
    return BootstrapOnlyBook if bug == PeeringBug.BOOTSTRAP_ONLY else PeerBook


def rules_for(bug: Bug | str | None) -> Rules:
    """The real rules, or the real rules with one planted bug (a peering bug and a generator
    bug change none)."""
    if bug is None or bug in PEERING_BUGS or bug in GENERATOR_BUGS:
        return Rules()
    bug = Bug(bug)
    if bug is Bug.LWW_ARRIVAL:
        return Rules(identity_wins=_identity_wins_by_arrival)
    if bug is Bug.ADD_REMOVE_INVERTED:
        return Rules(merge_member=_merge_add_wins, member_active=_active_add_wins)
    if bug is Bug.NO_MAX_OFFSET:
        return Rules(check_drift=False)
    if bug is Bug.GC_RESURRECTION:
        return Rules(retention_filter=False)
    if bug is Bug.AUTHZ_ARRIVAL:
        return Rules(decide_on_arrival=True)
    if bug is Bug.AUTHZ_NO_REMOVALS:
        return Rules(visible=_visible_ignoring_removals)
    if bug is Bug.ANYONE_MAY_DELETE:
        return Rules(anyone_may_delete=True)
    if bug is Bug.EDIT_ARRIVAL_ORDER:
        return Rules(edit_by_arrival=True)
    if bug is Bug.SCOPE_FORGETS_CHAT:
        return Rules(next_scope=_next_scope_forgetting)
    if bug is Bug.SESSION_BEYOND_INTERSECTION:
        return Rules(session_beyond_scope=True)
    if bug is Bug.KEYS_FROM_NON_MEMBER:
        return Rules(admissible=_keys_admitted_from_anyone, visible=_keys_shown_from_anyone)
    return Rules(message_tree=OffByOneTree)
