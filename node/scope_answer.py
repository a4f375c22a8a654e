"""Which nodes hold a chat this node does not (SYNC.md, "Scopes": a client asking a node for
a chat outside its scope is told where to go). Reads only; the rule is ``sync.scope``'s.

Two sources: the home nodes its members name in their signed identities (the nodes serving
them hold the chat under ``--scope auto``) — of the members this node's member index knows
(the users of its user shards: a chat's member ops follow the chat, which we do not hold) —
and the shard's holders by the replication-factor rule among the peers we know. At most
``MAX_NAMED`` nodes, members' home nodes first; the members read are bounded too (a big
group's first ``MAX_MEMBERS_READ``).
"""

from __future__ import annotations

from store.chat_reads import ChatReads
from store.ops import decode_identity_doc
from sync.scope import holders, shard_of, user_shard_of

MAX_NAMED = 16
MAX_MEMBERS_READ = 1_000


def nodes_holding(
    chat: bytes,
    reads: ChatReads,
    *,
    own: bytes,
    known: list[bytes],
    replication_factor: int,
    num_shards: int,
) -> list[bytes]:
    """Peer ids of nodes that hold ``chat`` (ourselves left out), best first."""
    named: list[bytes] = []
    for user in reads.indexed_members(chat)[:MAX_MEMBERS_READ]:
        found = reads.get_identity(user)
        if found is not None:
            named.extend(decode_identity_doc(found[1]).home_nodes)
    if replication_factor > 0:
        named.extend(
            holders(shard_of(chat, num_shards), [*known, own], replication_factor, num_shards)
        )
    unique = [n for n in dict.fromkeys(named) if n != own]
    return unique[:MAX_NAMED]


def nodes_holding_user(
    user: bytes, *, own: bytes, known: list[bytes], replication_factor: int, num_shards: int
) -> list[bytes]:
    """Peer ids of nodes holding ``user``'s user shard by the R rule among the peers we know
    (ourselves left out): an `--scope auto` node holds its R-rule shards as user shards too.
    Its home nodes hold it as well, but they are named in the identity we do not hold."""
    if replication_factor <= 0:
        return []
    shard = user_shard_of(user, num_shards)
    found = holders(shard, [*known, own], replication_factor, num_shards)
    return [n for n in found if n != own][:MAX_NAMED]
