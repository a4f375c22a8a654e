"""What a peer may reconcile with us: its claimed scope, bounded by what it is entitled to.
Pure. (SECURITY.md, "Scopes".)

A peer's HELLO claims a scope, and without a bound a session serves it whatever we hold in
that claim: a peer claiming everything harvests everything. With scope authentication on, a
peer is entitled to a shard when

* a member of one of the shard's chats names the peer among its home nodes (signed, in the
  member's identity: the peer serves that member), or
* the peer is one of the shard's ``R`` holders among the nodes we know (``sync.scope``'s
  replication-factor rule).

``PeerScoped`` is our replica seen through that bound: a session driven over it offers,
lists, ships and accepts only the entitled shards (the session code is unchanged — it reads
``scope`` and asks the replica for what lies in a scope). A peer's user shards (the member
index) are bounded the same way: those of the users naming it, and its R-rule shards.
Identities are global and not bounded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sync.frames import Domain
from sync.merkle import MerkleTree, TreeReader
from sync.replica import Record, Replica
from sync.scope import EVERYTHING, Scope, shard_of, user_shard_of


def entitled_shards(
    homes: Iterable[tuple[bytes, Sequence[bytes]]],
    rows: Iterable[tuple[bytes, bytes, bool]],
    num_shards: int,
) -> dict[bytes, frozenset[int]]:
    """Node -> the shards of the chats whose active members name it as a home node.
    ``homes``: (user, home nodes); ``rows``: (chat, user, active) member rows."""
    nodes_of = {user: tuple(nodes) for user, nodes in homes if nodes}
    out: dict[bytes, set[int]] = {}
    for chat, user, active in rows:
        if active and user in nodes_of:
            shard = shard_of(chat, num_shards)
            for node in nodes_of[user]:
                out.setdefault(node, set()).add(shard)
    return {node: frozenset(shards) for node, shards in out.items()}


def entitled_user_shards(
    homes: Iterable[tuple[bytes, Sequence[bytes]]], num_shards: int
) -> dict[bytes, frozenset[int]]:
    """Node -> the user shards of the users naming it as a home node (their index entries)."""
    out: dict[bytes, set[int]] = {}
    for user, nodes in homes:
        for node in nodes:
            out.setdefault(node, set()).add(user_shard_of(user, num_shards))
    return {node: frozenset(shards) for node, shards in out.items()}


class PeerScoped:
    """``replica`` as a session with one peer sees it: holding only ``bound`` of its scope."""

    def __init__(self, replica: Replica, bound: Scope) -> None:
        self._replica = replica
        self.scope = replica.scope & bound

    def tree(self, domain: Domain) -> MerkleTree:
        return self._replica.tree(domain)  # global domains; scoped ones go by scope_tree

    def scope_tree(self, domain: Domain, scope: Scope) -> TreeReader:
        return self._replica.scope_tree(domain, scope & self.scope)

    def bucket_ids(
        self, domain: Domain, bucket: int, cutoff_ms: int | None, scope: Scope = EVERYTHING
    ) -> list[bytes]:
        return self._replica.bucket_ids(domain, bucket, cutoff_ms, scope & self.scope)

    def ids_in_range(
        self, domain: Domain, start: int, end: int, cutoff_ms: int | None, scope: Scope = EVERYTHING
    ) -> bytes:
        return self._replica.ids_in_range(domain, start, end, cutoff_ms, scope & self.scope)

    def ids_in_runs(
        self,
        domain: Domain,
        runs: Sequence[tuple[int, int]],
        cutoff_ms: int | None,
        scope: Scope = EVERYTHING,
    ) -> bytes:
        return self._replica.ids_in_runs(domain, runs, cutoff_ms, scope & self.scope)

    def get_records(
        self,
        domain: Domain,
        ids: list[bytes],
        cutoff_ms: int | None,
        settled_ms: int | None = None,
        scope: Scope = EVERYTHING,
    ) -> list[bytes | None]:
        return self._replica.get_records(domain, ids, cutoff_ms, settled_ms, scope & self.scope)

    def apply(self, domain: Domain, records: list[Record]) -> int:
        return self._replica.apply(domain, records)
