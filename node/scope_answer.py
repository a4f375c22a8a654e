"""Which nodes hold a chat this node does not (SYNC.md, "Scopes": a client asking a node for
a chat outside its scope is told where to go). Reads only; the rule is ``sync.scope``'s.

Two sources: the home nodes its members name in their signed identities (the nodes serving
them hold the chat under ``--scope auto``) — of the members this node's member index knows
(the users of its user shards: a chat's member ops follow the chat, which we do not hold) —
and the shard's holders by the replication-factor rule among the peers we know — first
over every peer we know of (``known``: connected, reached, told of by peer exchange: the
view nearest the network's), then over the peers we reached lately (``reached``): hearsay
can add names before them, never remove them (SYNC.md, "Replication factor"). At most
``MAX_NAMED`` nodes, members' home nodes first; the members read are bounded too (a big
group's first ``MAX_MEMBERS_READ``).
"""

from __future__ import annotations

from collections.abc import Sequence

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
    known: Sequence[bytes],
    reached: Sequence[bytes] = (),
    replication_factor: int,
    num_shards: int,
) -> list[bytes]:
    """Peer ids of nodes that hold ``chat`` (ourselves left out), best first."""
    return nodes_holding_shard(
        shard_of(chat, num_shards), [chat], reads, own=own, known=known, reached=reached,
        replication_factor=replication_factor, num_shards=num_shards,
    )  # fmt: skip


def nodes_holding_shard(
    shard: int,
    chats: Sequence[bytes],
    reads: ChatReads,
    *,
    own: bytes,
    known: Sequence[bytes],
    reached: Sequence[bytes] = (),
    replication_factor: int,
    num_shards: int,
) -> list[bytes]:
    """Peer ids of nodes that hold ``shard``, best first (ourselves left out): the home
    nodes of the members of ``chats`` (chats of the shard: a node joining it knows those of
    its served users), then the shard's holders by the R rule (``node/join_dials.py``)."""
    named: list[bytes] = []
    for chat in chats:
        for user in reads.indexed_members(chat)[:MAX_MEMBERS_READ]:
            found = reads.get_identity(user)
            if found is not None:
                named.extend(decode_identity_doc(found[1]).home_nodes)
        if len(set(named)) > MAX_NAMED:
            break
    named.extend(_by_rule(shard, own, (known, reached), replication_factor, num_shards))
    unique = [n for n in dict.fromkeys(named) if n != own]
    return unique[:MAX_NAMED]


def nodes_holding_user(
    user: bytes,
    *,
    own: bytes,
    known: Sequence[bytes],
    reached: Sequence[bytes] = (),
    replication_factor: int,
    num_shards: int,
) -> list[bytes]:
    """Peer ids of nodes holding ``user``'s user shard by the R rule among the peers we know
    (ourselves left out): an `--scope auto` node holds its R-rule shards as user shards too.
    Its home nodes hold it as well, but they are named in the identity we do not hold."""
    return nodes_holding_user_shard(
        user_shard_of(user, num_shards), own=own, known=known, reached=reached,
        replication_factor=replication_factor, num_shards=num_shards,
    )  # fmt: skip


def nodes_holding_user_shard(
    shard: int,
    *,
    own: bytes,
    known: Sequence[bytes],
    reached: Sequence[bytes] = (),
    replication_factor: int,
    num_shards: int,
) -> list[bytes]:
    """Peer ids of nodes holding the user shard ``shard`` by the R rule (ourselves left out)."""
    found = _by_rule(shard, own, (known, reached), replication_factor, num_shards)
    return [n for n in dict.fromkeys(found) if n != own][:MAX_NAMED]


def _by_rule(
    shard: int, own: bytes, views: Sequence[Sequence[bytes]], r: int, num_shards: int
) -> list[bytes]:
    """The shard's holders by the R rule over each view in turn (ourselves counted)."""
    if r <= 0:
        return []
    return [n for view in views for n in holders(shard, [*view, own], r, num_shards)]
