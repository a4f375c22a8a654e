"""What a replica holds and a session reconciles: a scope. Pure and deterministic.

A chat's **shard** is ``int(BLAKE3(chat_id)[:4]) mod S``, ``S`` fixed per network; a user's
**user shard** is the same over a domain-tagged user id. A scope is a set of chat shards and
a set of user shards, or every shard (``EVERYTHING``: a full node, today's default).
Messages, deletes and member ops follow their chat's shard; identities follow their user's
user shard, and so does the member index (the same member ops again, by their subject), so
a node learns which chats its users are in, and who they are, without holding every chat's
ops or every user's identity (docs/design/member-scopes.md). A session reconciles the
intersection of both sides' scopes (``Scope.__and__``); the store refuses a record outside
its scope (``in_chat_scope``, ``in_index``). SYNC.md, "Scopes", says why that still converges.

``scope_for`` derives a node's scope from the users it serves (their signed home-node
lists), the member ops that add them to chats (its index), and what its operator pins. ``holders`` is
the replication-factor rule (SYNC.md, "Replication factor"): which nodes hold a shard so
that every chat is held by at least ``R`` live nodes; the simulator imports it to check R.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import blake3

from store.ops import MembershipAction, MembershipOp
from store.records import IdentityRecord, MsgV1
from sync.errors import LocalProtocolError

DEFAULT_SHARDS = 256
MAX_SHARDS = 4_096  # a scope's bitmap is at most 512 bytes; more is refused, from us or a peer
DEFAULT_REPLICATION = 3  # R: every chat held by at least this many live nodes
HOLDERS_DOMAIN = b"chatsync/holders/v1\x00"
USER_SHARD_DOMAIN = b"chatsync/user-shard/v1\x00"


def shard_of(chat_id: bytes, num_shards: int) -> int:
    """The shard a chat's messages, deletes and member ops live in."""
    return int.from_bytes(blake3.blake3(chat_id).digest(4), "big") % num_shards


def user_shard_of(user_id: bytes, num_shards: int) -> int:
    """The user shard a user's member-index entries live in: the same ``S`` as chat shards,
    a namespace of its own (the domain tag), so a user's and a chat's shard are independent."""
    return int.from_bytes(blake3.blake3(USER_SHARD_DOMAIN + user_id).digest(4), "big") % num_shards


class ScopeError(LocalProtocolError):
    """A scope that cannot be: too many shards, a shard out of range, mismatched networks."""


class ScopeNotServed(LocalProtocolError):
    """A replica asked for a scope it does not hold (wider than its own)."""


@dataclass(frozen=True, slots=True)
class Scope:
    """A set of chat shards and a set of user shards out of ``num_shards`` each
    (``shards=None``: every shard of both, any ``num_shards``; ``user_shards`` is then None
    too). A scoped one holds the messages, deletes and member ops of its chat shards' chats
    and the identities and member-index entries of its user shards' users
    (docs/design/member-scopes.md)."""

    shards: frozenset[int] | None = None
    num_shards: int = DEFAULT_SHARDS
    user_shards: frozenset[int] | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.num_shards <= MAX_SHARDS:
            raise ScopeError(f"{self.num_shards} shards: a network has 1..{MAX_SHARDS}")
        if self.shards is None:
            if self.user_shards is not None:
                raise ScopeError("a full scope holds every user shard: give no user shards")
            return
        if self.user_shards is None:  # a scope of chat shards only indexes no user
            object.__setattr__(self, "user_shards", frozenset())
        for named in (self.shards, self.user_shards):
            assert named is not None
            if any(type(s) is not int or not 0 <= s < self.num_shards for s in named):
                raise ScopeError(f"a shard out of range 0..{self.num_shards - 1}")

    @property
    def is_full(self) -> bool:
        return self.shards is None

    def holds_shard(self, shard: int) -> bool:
        return self.shards is None or shard in self.shards

    def holds_chat(self, chat_id: bytes) -> bool:
        return self.shards is None or shard_of(chat_id, self.num_shards) in self.shards

    def holds_user_shard(self, shard: int) -> bool:
        return self.user_shards is None or shard in self.user_shards

    def indexes_user(self, user_id: bytes) -> bool:
        """Holds the identity and the member-index entries of ``user_id``."""
        return (
            self.user_shards is None or user_shard_of(user_id, self.num_shards) in self.user_shards
        )

    def covers(self, other: Scope) -> bool:
        if self.shards is None:
            return True
        if other.shards is None:
            return False
        _same_network(self, other)
        assert self.user_shards is not None and other.user_shards is not None
        return other.shards <= self.shards and other.user_shards <= self.user_shards

    def __and__(self, other: Scope) -> Scope:
        if self.shards is None:
            return other
        if other.shards is None:
            return self
        _same_network(self, other)
        assert self.user_shards is not None and other.user_shards is not None
        return _valid(
            self.shards & other.shards, self.num_shards, self.user_shards & other.user_shards
        )

    def __repr__(self) -> str:
        if self.shards is None:
            return "Scope(full)"
        users = f", {len(self.user_shards)} user shards" if self.user_shards else ""
        return f"Scope({len(self.shards)} of {self.num_shards} shards{users})"

    # --- on the wire: [S, chat bitmap] or [S, chat bitmap, user bitmap]; S bits, MSB first ---

    def to_wire(self) -> list[object] | None:
        if self.shards is None:
            return None
        wire: list[object] = [self.num_shards, _bitmap(self.shards, self.num_shards)]
        if self.user_shards:
            wire.append(_bitmap(self.user_shards, self.num_shards))
        return wire

    @classmethod
    def from_bitmap(cls, num_shards: int, bitmap: bytes, user_bitmap: bytes = b"") -> Scope:
        """The inverse of ``to_wire`` (``user_bitmap`` b"": no user shards); ``ScopeError`` for
        a size or padding that does not fit."""
        if not 1 <= num_shards <= MAX_SHARDS:
            raise ScopeError(f"{num_shards} shards: a network has 1..{MAX_SHARDS}")
        users = _shards_of_bitmap(user_bitmap, num_shards) if user_bitmap else frozenset()
        return cls(_shards_of_bitmap(bitmap, num_shards), num_shards, users)


EVERYTHING = Scope()


def _bitmap(shards: frozenset[int], num_shards: int) -> bytes:
    bits = bytearray((num_shards + 7) // 8)
    for s in shards:
        bits[s >> 3] |= 0x80 >> (s & 7)
    return bytes(bits)


def _shards_of_bitmap(bitmap: bytes, num_shards: int) -> frozenset[int]:
    if len(bitmap) != (num_shards + 7) // 8:
        raise ScopeError(f"a bitmap of {len(bitmap)} bytes for {num_shards} shards")
    bits = int.from_bytes(bitmap, "big")  # one int, not a Python test per bit
    shift = len(bitmap) * 8 - num_shards
    if bits & ((1 << shift) - 1):
        raise ScopeError("bits set beyond the last shard")
    bits >>= shift
    shards = []
    while bits:  # one step per set bit (bit i from the right is shard S - 1 - i)
        low = bits & -bits
        shards.append(num_shards - low.bit_length())
        bits ^= low
    return frozenset(shards)


def _valid(shards: frozenset[int], num_shards: int, user_shards: frozenset[int]) -> Scope:
    """A scope of parts already checked (an intersection of two scopes), built without the
    check again: sessions intersect scopes many times a frame, and the check was a tenth of
    a scoped simulation's time."""
    scope = object.__new__(Scope)
    object.__setattr__(scope, "shards", shards)
    object.__setattr__(scope, "num_shards", num_shards)
    object.__setattr__(scope, "user_shards", user_shards)
    return scope


def _same_network(a: Scope, b: Scope) -> None:
    if a.num_shards != b.num_shards:
        raise ScopeError(f"scopes of {a.num_shards} and {b.num_shards} shards do not meet")


def shards_scope(shards: Iterable[int], num_shards: int = DEFAULT_SHARDS) -> Scope:
    return Scope(frozenset(shards), num_shards)


def scope_for(
    served: Iterable[bytes],
    member_ops: Iterable[MembershipOp],
    *,
    pinned_chats: Iterable[bytes] = (),
    pinned_shards: Iterable[int] = (),
    num_shards: int = DEFAULT_SHARDS,
) -> Scope:
    """A node's scope: the shards of every chat a member op adds a served user to, of the
    pinned chats, and the pinned shards. A function of the (global) member ops, so two
    nodes serving the same users derive the same scope from the same ops, whatever order
    they came in; it only grows with more ops (leaving is the operator's step)."""
    users = set(served)
    chats = {
        op.chat_id for op in member_ops if op.user_id in users and op.action is MembershipAction.ADD
    }
    chats.update(pinned_chats)
    return Scope(
        frozenset(shard_of(c, num_shards) for c in chats) | frozenset(pinned_shards), num_shards
    )


def served_users(node_id: bytes, home_nodes: Mapping[bytes, Sequence[bytes]]) -> set[bytes]:
    """The users whose signed home-node list (user -> node ids) names ``node_id``."""
    return {user for user, nodes in home_nodes.items() if node_id in nodes}


# --- the replication factor: which nodes hold a shard ------------------------------------


def rendezvous_score(shard: int, node_id: bytes, num_shards: int = DEFAULT_SHARDS) -> bytes:
    """A node's distance to a shard (rendezvous hashing): lower is nearer. Keyed by the
    network's shard count too, so the same peer id ranks independently in two networks."""
    return blake3.blake3(_score_prefix(shard, num_shards) + node_id).digest(8)


def _score_prefix(shard: int, num_shards: int) -> bytes:
    return HOLDERS_DOMAIN + num_shards.to_bytes(2, "big") + shard.to_bytes(2, "big")


def load_cap(num_nodes: int, r: int, num_shards: int) -> int:
    """The most shards the R rule gives one node (unless fewer than ``r`` nodes are below it):
    the mean share ``k·S/N`` rounded up, plus a quarter of it as slack (``k = min(r, N)``). With a few shards a node (3 shards over
    9 nodes: exactly one each) the cap is the mean; with many, the slack keeps a node joining
    or leaving from shifting more than a few shards beyond its own."""
    k = min(r, num_nodes)
    if k <= 0:
        return 0
    share = k * num_shards  # holder slots: the cap in integers, as sim.scopes restates it
    return -(-share // num_nodes) + share // (4 * num_nodes)


def assign_shards(
    nodes: Iterable[bytes],
    r: int = DEFAULT_REPLICATION,
    num_shards: int = DEFAULT_SHARDS,
) -> tuple[tuple[bytes, ...], ...]:
    """Every shard's holders by the R rule (rendezvous hashing with bounded loads): shard by
    shard in order, the ``r`` nodes nearest to it (lowest ``rendezvous_score``, ties by id)
    among those still below ``load_cap`` (the nearest of the others where fewer than ``r``
    are: every shard has ``min(r, N)`` holders). A pure function of the set of nodes, so every node
    that knows the same live nodes picks the same holders. Plain rendezvous hashing gave a
    node up to twice the mean at 1,000 nodes and 4,096 shards (23 against 12.3) and two of
    3 shards to some of 9 nodes; the cap holds each to it (16; one each). Cached per set of
    nodes: ``holders`` of every shard reads one assignment."""
    return _assignment(frozenset(nodes), max(r, 0), num_shards)


@lru_cache(maxsize=8)
def _assignment(nodes: frozenset[bytes], r: int, num_shards: int) -> tuple[tuple[bytes, ...], ...]:
    k = min(r, len(nodes))
    if k == 0:
        return ((),) * num_shards
    cap = load_cap(len(nodes), r, num_shards)
    load = dict.fromkeys(nodes, 0)
    out = []
    for shard in range(num_shards):
        prefix = _score_prefix(shard, num_shards)  # (rendezvous_score, inlined: S·N calls)
        ranked = [n for _, n in sorted([(blake3.blake3(prefix + n).digest(8), n) for n in nodes])]
        chosen = [n for n in ranked if load[n] < cap][:k]
        if len(chosen) < k:  # fewer than k below the cap (few nodes): R holders come first
            chosen += [n for n in ranked if n not in chosen][: k - len(chosen)]
            chosen.sort(key=ranked.index)
        for node in chosen:
            load[node] += 1
        out.append(tuple(chosen))
    return tuple(out)


def holders(
    shard: int,
    nodes: Iterable[bytes],
    r: int = DEFAULT_REPLICATION,
    num_shards: int = DEFAULT_SHARDS,
) -> tuple[bytes, ...]:
    """The shard's ``r`` holders by the R rule among ``nodes`` (``assign_shards``), nearest
    first."""
    if not 0 <= shard < num_shards:
        raise ScopeError(f"shard {shard} out of range 0..{num_shards - 1}")
    return assign_shards(nodes, r, num_shards)[shard]


def chat_holders(
    chat_id: bytes,
    nodes: Iterable[bytes],
    *,
    home_nodes: Iterable[bytes] = (),
    r: int = DEFAULT_REPLICATION,
    num_shards: int = DEFAULT_SHARDS,
) -> frozenset[bytes]:
    """Who holds a chat: its members' home nodes (``home_nodes``, those of them alive) plus
    the ``r`` holders of its shard among ``nodes``. At least ``min(r, len(nodes))`` live
    nodes whatever the home nodes do (a member's home node may be down or gone)."""
    return frozenset(home_nodes) | frozenset(
        holders(shard_of(chat_id, num_shards), nodes, r, num_shards)
    )


def replica_shards(
    node_id: bytes,
    nodes: Iterable[bytes],
    r: int = DEFAULT_REPLICATION,
    num_shards: int = DEFAULT_SHARDS,
) -> frozenset[int]:
    """The shards ``node_id`` holds by the R rule among ``nodes`` (itself counted): what a
    node adds to its pins so every shard has ``r`` holders. About ``r * S / N`` shards, at
    most ``load_cap`` (``assign_shards``)."""
    return rule_shards([*nodes, node_id], r, num_shards)[node_id]


def rule_shards(
    nodes: Iterable[bytes],
    r: int = DEFAULT_REPLICATION,
    num_shards: int = DEFAULT_SHARDS,
) -> dict[bytes, frozenset[int]]:
    """Every node's ``replica_shards`` among ``nodes``: the one assignment, by node."""
    known = frozenset(nodes)
    out: dict[bytes, set[int]] = {node: set() for node in known}
    for shard, chosen in enumerate(assign_shards(known, r, num_shards)):
        for node in chosen:
            out[node].add(shard)
    return {node: frozenset(shards) for node, shards in out.items()}


def in_chat_scope(record: object, scope: Scope) -> bool:
    """A record the scope's rules decide on: messages, deletes and member ops of its chats,
    identities of the users it indexes (a chat's rules read no identity: SYNC.md)."""
    if isinstance(record, MsgV1 | MembershipOp):
        return scope.holds_chat(record.chat_id)
    if isinstance(record, IdentityRecord):
        return scope.indexes_user(record.user_id)
    return True


def in_index(record: object, scope: Scope) -> bool:
    """A member op the scope's member index holds: one naming a user it indexes."""
    return isinstance(record, MembershipOp) and scope.indexes_user(record.user_id)
