"""Trees per shard: the leaves of one scoped domain's records, per shard, and the tree of a
set of shards summed from them. Pure.

A replica keeps one ``MerkleTree`` per domain over everything it holds. For a session over
a scope narrower than the replica's own it needs the tree of that intersection:
``ShardLeaves`` keeps, per shard, the non-empty leaves (bucket -> count, xor, check: the
same 65,536 two-byte buckets as the seed design), and ``ShardView`` reads a set of shards
as one tree. XOR and counts are linear, so a node of the intersection's tree is the sum of
the shards' nodes; the view sums on demand, so it is always current (records a session
writes are in the next HELLO's roots) and costs memory only for the leaves.
``ScopedTrees`` is what both replicas (``sync.replica``) do with them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from store.keys import RECORD_ID_LEN
from store.ops import MembershipOp
from store.records import MsgV1
from sync.frames import Domain
from sync.merkle import DEPTH, FANOUT_BITS, MerkleTree, TreeReader, check_hash, node_hash
from sync.scope import EVERYTHING, Scope, in_chat_scope, in_index, shard_of, user_shard_of

Leaf = list[int]  # [count, xor, check]
K = TypeVar("K")
V = TypeVar("V")


LEVEL_CACHE = 64  # (shards, depth) levels kept per domain: a session reads a few, often


class ShardLeaves:
    """One domain's non-empty leaves, per shard, and the levels of the views read since the
    last change (a session reads the same view's levels many times: summing the leaves anew
    each time was most of a scoped session's cost)."""

    __slots__ = ("_checks", "_levels", "_shards")

    def __init__(self) -> None:
        self._shards: dict[int, dict[int, Leaf]] = {}
        self._levels: dict[tuple[frozenset[int], int], dict[int, tuple[int, int]]] = {}
        self._checks: dict[frozenset[int], int] = {}  # each view's root check, as levels

    def insert(self, shard: int, record_id: bytes) -> None:
        self._toggle(shard, record_id, +1)

    def remove(self, shard: int, record_id: bytes) -> None:
        self._toggle(shard, record_id, -1)

    def _toggle(self, shard: int, record_id: bytes, delta: int) -> None:
        if len(record_id) != RECORD_ID_LEN:
            raise ValueError(f"record id must be {RECORD_ID_LEN} bytes, got {len(record_id)}")
        self._levels.clear()  # every cached level (and check) may include this leaf
        self._checks.clear()
        leaves = self._shards.setdefault(shard, {})
        bucket = (record_id[0] << 8) | record_id[1]
        leaf = leaves.get(bucket)
        if leaf is None:
            if delta < 0:
                raise ValueError("remove from an empty bucket: the leaves and the store disagree")
            leaf = leaves[bucket] = [0, 0, 0]
        leaf[0] += delta
        leaf[1] ^= int.from_bytes(record_id, "big")
        leaf[2] ^= check_hash(record_id)
        if leaf[0] == 0:
            del leaves[bucket]
            if not leaves:
                del self._shards[shard]

    def shards(self) -> list[int]:
        """The shards that hold at least one record."""
        return sorted(self._shards)

    def view(self, shards: Iterable[int]) -> ShardView:
        return ShardView(self, frozenset(shards))


def _kept(cache: dict[K, V], key: K, compute: Callable[[], V]) -> V:
    """``cache[key]``, computed when missing; a full cache is emptied first (the views a
    session reads are few, and every change empties it anyway)."""
    found = cache.get(key)
    if found is None:
        if len(cache) >= LEVEL_CACHE:
            cache.clear()
        found = cache[key] = compute()
    return found


class ShardView:
    """The tree of a set of shards, read as a ``MerkleTree`` is (root, hashes, cell)."""

    __slots__ = ("_leaves", "_shards")

    def __init__(self, leaves: ShardLeaves, shards: frozenset[int]) -> None:
        self._leaves = leaves
        self._shards = shards

    def _each_leaf(self) -> Iterable[tuple[int, Leaf]]:
        held = self._leaves._shards
        for shard in self._shards:
            yield from held.get(shard, {}).items()

    def _level(self, depth: int) -> dict[int, tuple[int, int]]:
        key = (self._shards, depth)
        return _kept(self._leaves._levels, key, lambda: self._sum_level(depth))

    def _sum_level(self, depth: int) -> dict[int, tuple[int, int]]:
        shift = FANOUT_BITS * (DEPTH - depth)
        out: dict[int, tuple[int, int]] = {}
        get, empty = out.get, (0, 0)
        held = self._leaves._shards
        for shard in self._shards:  # (loops, not _each_leaf's generator: a hot path)
            for bucket, (count, xor, _) in held.get(shard, {}).items():
                index = bucket >> shift
                c, x = get(index, empty)
                out[index] = (c + count, x ^ xor)
        return out

    @property
    def count(self) -> int:
        return sum(leaf[0] for _, leaf in self._each_leaf())

    def root(self) -> tuple[bytes, int]:
        count, xor = self._level(0).get(0, (0, 0))
        return xor.to_bytes(32, "big"), count

    def root_check(self) -> int:
        return _kept(self._leaves._checks, self._shards, self._sum_checks)

    def _sum_checks(self) -> int:
        check = 0
        for _, leaf in self._each_leaf():
            check ^= leaf[2]
        return check

    def leaf_counts(self, buckets: Iterable[int]) -> list[int]:
        counts: dict[int, int] = {}  # one walk over the view's leaves, however many buckets
        for bucket, leaf in self._each_leaf():
            counts[bucket] = counts.get(bucket, 0) + leaf[0]
        return [counts.get(b, 0) for b in buckets]

    def node(self, depth: int, index: int) -> tuple[int, int]:
        count, xor = self._level(depth).get(index, (0, 0))
        return xor, count

    def hashes(self, depth: int, indexes: Iterable[int], salt: bytes, width: int) -> bytes:
        level = self._level(depth)
        empty = node_hash(salt, 0, 0, width)
        out = []
        for i in indexes:
            found = level.get(i)
            out.append(empty if found is None else node_hash(salt, found[1], found[0], width))
        return b"".join(out)

    def cell(self, bucket: int) -> tuple[int, int, int]:
        count = xor = check = 0
        held = self._leaves._shards
        for shard in self._shards:
            leaf = held.get(shard, {}).get(bucket)
            if leaf is not None:
                count += leaf[0]
                xor ^= leaf[1]
                check ^= leaf[2]
        return count, xor, check


# placed by their user's user shard (the index: its subject's); the others by the chat's shard
BY_USER = frozenset({Domain.IDENTITY, Domain.INDEX})


def shard_in(domain: Domain, key: bytes, num_shards: int) -> int:
    """The shard of a scoped domain's record whose placement key (chat, or user) is ``key``."""
    return user_shard_of(key, num_shards) if domain in BY_USER else shard_of(key, num_shards)


def domain_shards(domain: Domain, scope: Scope) -> frozenset[int] | None:
    """The shards of ``scope`` a scoped domain is placed in (None: every one)."""
    return scope.user_shards if domain in BY_USER else scope.shards


def placement_key(domain: Domain, record: MsgV1 | MembershipOp) -> bytes:
    """A held record's placement key (an identity's row is its user: ``sync.replica``)."""
    return (
        record.user_id
        if domain is Domain.INDEX and isinstance(record, MembershipOp)
        else record.chat_id
    )


def in_domain_scope(domain: Domain, record: object, scope: Scope) -> bool:
    """A record of ``domain`` lies in ``scope``."""
    return in_index(record, scope) if domain is Domain.INDEX else in_chat_scope(record, scope)


def ids_run_by_run(
    ids_in_range: Callable[[Domain, int, int, int | None, Scope], bytes],
    domain: Domain,
    runs: Sequence[tuple[int, int]],
    cutoff_ms: int | None,
    scope: Scope,
) -> bytes:
    """``Replica.ids_in_runs`` for a replica that reads one run at a time."""
    return b"".join(ids_in_range(domain, lo, hi, cutoff_ms, scope) for lo, hi in runs)


class ScopedTrees:
    """What the replicas share about scopes: the tree of a scope (the one tree when it is
    the replica's own, else summed from per-shard leaves, built when first needed), and
    which listed ids lie in a scope. Subclasses give ``trees`` and each record's placement
    key (``_keys_of``, ``_iter_keys``: its chat, or for the index its subject user)."""

    scope: Scope
    trees: dict[Domain, MerkleTree]
    # per-shard leaves, for one number of shards (a full replica learns it from its peers)
    _shard_leaves: tuple[int, dict[Domain, ShardLeaves]] | None

    def scope_tree(self, domain: Domain, scope: Scope) -> TreeReader:
        inner = self._within(domain, scope)
        if inner is None:
            return self.trees[domain]
        shards = domain_shards(domain, inner)
        assert shards is not None
        return self._leaves(inner.num_shards)[domain].view(shards)

    def _within(self, domain: Domain, scope: Scope) -> Scope | None:
        """The part of ``scope`` this replica holds, None when that is all it holds."""
        inner = scope & self.scope
        shards = domain_shards(domain, inner)
        if shards is None or shards == domain_shards(domain, self.scope):
            return None
        return inner

    def _in_scope(self, domain: Domain, ids: list[bytes], scope: Scope) -> list[bool]:
        inner = self._within(domain, scope)
        if inner is None:
            return [True] * len(ids)
        shards = domain_shards(domain, inner)
        assert shards is not None
        n = inner.num_shards
        return [
            k is not None and shard_in(domain, k, n) in shards for k in self._keys_of(domain, ids)
        ]

    def ids_in_range(
        self, domain: Domain, start: int, end: int, cutoff_ms: int | None, scope: Scope = EVERYTHING
    ) -> bytes:
        raise NotImplementedError  # each replica's own

    def ids_in_runs(
        self,
        domain: Domain,
        runs: Sequence[tuple[int, int]],
        cutoff_ms: int | None,
        scope: Scope = EVERYTHING,
    ) -> bytes:
        """``ids_in_range`` a run (a replica that reads a region at once overrides it)."""
        return ids_run_by_run(self.ids_in_range, domain, runs, cutoff_ms, scope)

    def _keep_in_scope(self, domain: Domain, ids: list[bytes], scope: Scope) -> list[bytes]:
        """The listed ``ids`` that lie in ``scope`` (all of them when it covers the replica)."""
        if self._within(domain, scope) is None:
            return ids
        return [i for i, ok in zip(ids, self._in_scope(domain, ids, scope), strict=True) if ok]

    def _leaves(self, num_shards: int) -> dict[Domain, ShardLeaves]:
        if self._shard_leaves is None or self._shard_leaves[0] != num_shards:
            leaves = {d: ShardLeaves() for d in Domain}
            for domain in Domain:
                for record_id, key in self._iter_keys(domain):
                    leaves[domain].insert(shard_in(domain, key, num_shards), record_id)
            self._shard_leaves = (num_shards, leaves)
        return self._shard_leaves[1]

    def _shard_change(
        self, domain: Domain, key: bytes, old: bytes | None, new: bytes | None
    ) -> None:
        """Record ``old`` left and ``new`` entered ``domain`` with placement key ``key``."""
        if self._shard_leaves is None:
            return  # not built yet: built from what is held when first needed
        num_shards, by_domain = self._shard_leaves
        leaves, shard = by_domain[domain], shard_in(domain, key, num_shards)
        if old is not None:
            leaves.remove(shard, old)
        if new is not None:
            leaves.insert(shard, new)

    def _keys_of(self, domain: Domain, ids: list[bytes]) -> list[bytes | None]:
        raise NotImplementedError

    def _iter_keys(self, domain: Domain) -> Iterator[tuple[bytes, bytes]]:
        raise NotImplementedError
