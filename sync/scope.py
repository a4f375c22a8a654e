"""What a replica holds and a session reconciles: a scope. Pure and deterministic.

A chat's **shard** is ``int(BLAKE3(chat_id)[:4]) mod S``, ``S`` fixed per network. A scope
is a set of shards, or every shard (``EVERYTHING``: a full node, today's default). Identity
and member ops are *global*: every scope holds them (a node decides its chats, and which
chats are its own, from them). Messages and deletes follow their chat's shard. A session
reconciles the intersection of both sides' scopes (``Scope.__and__``); the store refuses a
scoped record outside its scope (``split_by_scope``). SYNC.md, "Scopes", says why that still
converges.

``scope_for`` derives a node's scope from the users it serves (their signed home-node
lists), the member ops that add them to chats, and what its operator pins.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import blake3

from store.ops import MembershipAction, MembershipOp
from store.records import MsgV1
from sync.errors import LocalProtocolError

DEFAULT_SHARDS = 256
MAX_SHARDS = 4_096  # a scope's bitmap is at most 512 bytes; more is refused, from us or a peer


def shard_of(chat_id: bytes, num_shards: int) -> int:
    """The shard a chat's messages and deletes live in."""
    return int.from_bytes(blake3.blake3(chat_id).digest(4), "big") % num_shards


class ScopeError(LocalProtocolError):
    """A scope that cannot be: too many shards, a shard out of range, mismatched networks."""


class ScopeNotServed(LocalProtocolError):
    """A replica asked for a scope it does not hold (wider than its own)."""


@dataclass(frozen=True, slots=True)
class Scope:
    """A set of shards out of ``num_shards`` (``shards=None``: every shard, any ``num_shards``)."""

    shards: frozenset[int] | None = None
    num_shards: int = DEFAULT_SHARDS

    def __post_init__(self) -> None:
        if not 1 <= self.num_shards <= MAX_SHARDS:
            raise ScopeError(f"{self.num_shards} shards: a network has 1..{MAX_SHARDS}")
        if self.shards is not None and any(
            type(s) is not int or not 0 <= s < self.num_shards for s in self.shards
        ):
            raise ScopeError(f"a shard out of range 0..{self.num_shards - 1}")

    @property
    def is_full(self) -> bool:
        return self.shards is None

    def holds_shard(self, shard: int) -> bool:
        return self.shards is None or shard in self.shards

    def holds_chat(self, chat_id: bytes) -> bool:
        return self.shards is None or shard_of(chat_id, self.num_shards) in self.shards

    def covers(self, other: Scope) -> bool:
        if self.shards is None:
            return True
        if other.shards is None:
            return False
        _same_network(self, other)
        return other.shards <= self.shards

    def __and__(self, other: Scope) -> Scope:
        if self.shards is None:
            return other
        if other.shards is None:
            return self
        _same_network(self, other)
        return Scope(self.shards & other.shards, self.num_shards)

    def __repr__(self) -> str:
        if self.shards is None:
            return "Scope(full)"
        return f"Scope({len(self.shards)} of {self.num_shards} shards)"

    # --- on the wire: [S, bitmap of S bits, MSB first] ---

    def to_wire(self) -> list[object] | None:
        if self.shards is None:
            return None
        bits = bytearray((self.num_shards + 7) // 8)
        for s in self.shards:
            bits[s >> 3] |= 0x80 >> (s & 7)
        return [self.num_shards, bytes(bits)]

    @classmethod
    def from_bitmap(cls, num_shards: int, bitmap: bytes) -> Scope:
        """The inverse of ``to_wire``; ``ScopeError`` for a size or padding that does not fit."""
        if not 1 <= num_shards <= MAX_SHARDS:
            raise ScopeError(f"{num_shards} shards: a network has 1..{MAX_SHARDS}")
        if len(bitmap) != (num_shards + 7) // 8:
            raise ScopeError(f"a bitmap of {len(bitmap)} bytes for {num_shards} shards")
        shards = frozenset(i for i in range(len(bitmap) * 8) if bitmap[i >> 3] & (0x80 >> (i & 7)))
        if any(s >= num_shards for s in shards):
            raise ScopeError("bits set beyond the last shard")
        return cls(shards, num_shards)


EVERYTHING = Scope()


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


T = TypeVar("T")


def chat_of(record: object) -> bytes | None:
    """The chat a record follows, or None for a global one (identity, member op)."""
    return record.chat_id if isinstance(record, MsgV1) else None


def split_by_scope(records: Sequence[T], scope: Scope) -> tuple[list[T], list[T]]:
    """(kept, refused): messages and deletes outside ``scope`` are refused; global records
    (identities, member ops) are always kept."""
    if scope.shards is None:
        return list(records), []
    kept: list[T] = []
    refused: list[T] = []
    for record in records:
        chat = chat_of(record)
        (kept if chat is None or scope.holds_chat(chat) else refused).append(record)
    return kept, refused
