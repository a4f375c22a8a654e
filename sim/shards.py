"""Shards: ranges of the 16-bit shard key, and what the oracle expects of one shard.

A message's and a member op's shard key is a hash of its chat id (whether a
message is stored and shown is a function of its chat's member ops, so they must
meet in one shard); an identity's is a hash of its user (``store.trace``'s
``chat_shard_key`` and ``row_shard_key``). Shard ``s`` of ``P`` holds the keys
``k`` with ``k * P >> 16 == s``. A shard's trees hold ids of every bucket; ids
are uniform, so roots still combine across shards by XOR and sum.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import blake3

# A chat's view in canonical form (the oracle and the check both build these tuples, with
# content_item and tombstone_item); stamps packed. Positions: (user, packed position).
ViewItem = tuple[object, ...]


def shard_of(key: int, shards: int) -> int:
    return (key * shards) >> 16


MAX_SIM_SHARDS = 256
TASK_BUDGET_BYTES = 3_500_000_000  # a task's estimated peak RSS: 4 GB a worker, less a margin

# A task's peak RSS, from above: never below the five runs in SIM.md ("Shards, memory and the
# default"; 1.0-1.5x them, from 1,000 nodes x 13,661 ops to 10,000 x 2,746): a base, every
# node's replica of the shard, and the (node, record) pairs, which divide among the shards —
# the replicas do not. The pairs per op depend on the mix (member ops never expire and are
# held twice), so the last term is the worst run's; a shard too many costs little CPU.
_TASK_BASE_BYTES = 200_000_000
_REPLICA_BYTES = 180_000
_NODE_OP_BYTES = 260


def task_bytes(nodes: int, ops: int, shards: int) -> int:
    """A shard task's estimated peak RSS for a trace of ``nodes`` x ``ops``."""
    return _TASK_BASE_BYTES + _REPLICA_BYTES * nodes + _NODE_OP_BYTES * nodes * ops // shards


def shards_for(nodes: int, ops: int, cores: int, budget: int = TASK_BUDGET_BYTES) -> int:
    """How many shards to cut a trace into: one a core at least (a shard is one Spark task,
    and a run's CPU time grows little with shards: SIM.md), more while a task would pass
    ``budget``; ``MAX_SIM_SHARDS`` where no number does."""
    for shards in range(max(1, cores), MAX_SIM_SHARDS + 1):
        if task_bytes(nodes, ops, shards) <= budget:
            return shards
    return MAX_SIM_SHARDS


@dataclass
class Expected:
    """The oracle's final state restricted to one shard (what the check compares with)."""

    messages: set[bytes] = field(default_factory=set)  # stored: valid, admissible, not aged
    visible: set[bytes] = field(default_factory=set)  # of those, the ones readers see
    member_ops: set[bytes] = field(default_factory=set)  # the MEMBERS domain: op ids
    # (chat, user) -> (the row's version: member_record_id of the folded row, active)
    members: dict[tuple[bytes, bytes], tuple[bytes, bool]] = field(default_factory=dict)
    identities: dict[bytes, bytes] = field(default_factory=dict)  # user -> record id
    deletes: set[bytes] = field(default_factory=set)  # the DELETES domain: admissible deletes
    erased: set[bytes] = field(default_factory=set)  # messages a valid delete erases
    views: dict[bytes, bytes] = field(default_factory=dict)  # chat -> view_digest
    # Scoped traces (sim/scopes.py): the network's shards (0: every node full), R, each
    # node's final scope as the trace's scope events leave it, and each id's chat.
    scope_shards: int = 0
    replication: int = 3
    final_scopes: dict[int, frozenset[int]] = field(default_factory=dict)
    # message, delete, member op id -> chat; member op id -> the user it names
    chat_of: dict[bytes, bytes] = field(default_factory=dict)
    user_of: dict[bytes, bytes] = field(default_factory=dict)


def view_digest(items: Iterable[ViewItem], positions: Iterable[tuple[bytes, int]]) -> bytes:
    """One chat's view as 16 bytes: items in (stamp, id) order, positions by user."""
    ordered = sorted(items, key=lambda item: (_stamp(item), item[1]))
    return blake3.blake3(repr((ordered, sorted(positions))).encode()).digest(16)


def views_digest(views: dict[bytes, bytes]) -> str:
    """Every chat's view digest as one hex string (a report field a replay compares with)."""
    return blake3.blake3(b"".join(c + d for c, d in sorted(views.items()))).hexdigest()


def _stamp(item: ViewItem) -> int:
    """The order key: a content item carries its stamp last, a tombstone third."""
    value = item[-1] if item[0] == "m" else item[2]
    assert isinstance(value, int)
    return value


def content_item(
    msg_id: bytes,
    hlc: int,
    payload: bytes,
    edited_at: int | None,
    reply_state: str | None,
    reactions: Iterable[tuple[bytes, Iterable[bytes]]],
) -> ViewItem:
    """A content message's canonical item; its stamp last (the order key)."""
    summary = tuple(sorted((key, tuple(sorted(users))) for key, users in reactions if users))
    return (
        "m",
        msg_id,
        payload,
        -1 if edited_at is None else edited_at,
        reply_state or "",
        summary,
        hlc,
    )


def tombstone_item(
    msg_id: bytes, hlc: int, sender: bytes, deleted_by: bytes, deleted_at: int
) -> ViewItem:
    return ("t", msg_id, hlc, sender, deleted_by, deleted_at)
