"""Shards: ranges of the 16-bit shard key, and what the oracle expects of one shard.

A message's and a member op's shard key is a hash of its chat id (whether a
message is stored and shown is a function of its chat's member ops, so they must
meet in one shard); an identity's is a hash of its user (``store.trace``'s
``chat_shard_key`` and ``row_shard_key``). Shard ``s`` of ``P`` holds the keys
``k`` with ``k * P >> 16 == s``. A shard's trees hold ids of every bucket; ids
are uniform, so roots still combine across shards by XOR and sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def shard_of(key: int, shards: int) -> int:
    return (key * shards) >> 16


@dataclass
class Expected:
    """The oracle's final state restricted to one shard (what the check compares with)."""

    messages: set[bytes] = field(default_factory=set)  # stored: valid, admissible, not aged
    visible: set[bytes] = field(default_factory=set)  # of those, the ones readers see
    member_ops: set[bytes] = field(default_factory=set)  # the MEMBERS domain: op ids
    # (chat, user) -> (the row's version: member_record_id of the folded row, active)
    members: dict[tuple[bytes, bytes], tuple[bytes, bool]] = field(default_factory=dict)
    identities: dict[bytes, bytes] = field(default_factory=dict)  # user -> record id
