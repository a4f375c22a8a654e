"""Shards: ranges of the 16-bit shard key, and what the oracle expects of one shard.

A message's shard key is its bucket (the first two bytes of its id); a member or
identity row's is a hash of its row key (``store.trace.row_shard_key``), because a
row's record id changes with its state and its key does not. Shard ``s`` of ``P``
holds the keys ``k`` with ``k * P >> 16 == s``: contiguous bucket ranges, so a
shard's message tree is a set of whole Merkle subtrees.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def shard_of(key: int, shards: int) -> int:
    return (key * shards) >> 16


@dataclass
class Expected:
    """The oracle's final state restricted to one shard (what the check compares with)."""

    messages: set[bytes] = field(default_factory=set)
    # (chat, user) -> (record id, active)
    members: dict[tuple[bytes, bytes], tuple[bytes, bool]] = field(default_factory=dict)
    identities: dict[bytes, bytes] = field(default_factory=dict)  # user -> record id
