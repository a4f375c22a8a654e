"""A Merkle tree of XOR accumulators over 65,536 two-byte buckets.

Shape: fan-out 16, depth 4. Depth ``k`` has ``16**k`` nodes; node ``i`` at
depth ``k`` covers the buckets whose top ``4*k`` bits equal ``i``; depth 4 is
the 65,536 leaves, leaf ``b`` = bucket ``b`` = the first two bytes of a record id.

Every node holds ``(xor, count)``: the XOR of the 256-bit ids below it and how
many there are. Both are order-independent and invertible, so insert, remove
and replace touch one leaf and its four ancestors — no bucket is re-read. Leaves
also keep ``check``: the XOR of a 4-byte BLAKE3 check hash of each id. A leaf
pair whose sets differ by exactly one id is then a *pure cell* (as in an IBLT):
``xor_a ^ xor_b`` is the missing id, and ``check(id) == check_a ^ check_b``
confirms it, so the protocol can name a missing id without listing the bucket.

Peers never see raw accumulators below the root: the protocol compares
*salted, truncated* node hashes (``node_hash``). A fresh salt per pass means an
attacker cannot precompute ids whose truncated hashes collide, and a chance
collision in one pass is not repeated in the next.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain
from typing import Protocol, TypeVar

import blake3

from store.keys import NUM_BUCKETS, RECORD_ID_LEN

FANOUT_BITS = 4
FANOUT = 1 << FANOUT_BITS
DEPTH = 4  # 16**4 == 65,536 leaves
CHECK_LEN = 4
assert FANOUT**DEPTH == NUM_BUCKETS
_Tree = TypeVar("_Tree", bound="MerkleTree")


def check_hash(record_id: bytes) -> int:
    """The leaf purity check of one id: 4 bytes of BLAKE3, independent of the id's bits."""
    return int.from_bytes(blake3.blake3(record_id).digest(CHECK_LEN), "big")


def node_hash(salt: bytes, xor: int, count: int, width: int) -> bytes:
    """What peers compare: a salted, truncated hash of one node's (xor, count)."""
    return blake3.blake3(salt + xor.to_bytes(32, "big") + count.to_bytes(8, "big")).digest(width)


class TreeReader(Protocol):
    """What a session reads of a tree: a ``MerkleTree``, or the tree of some shards
    (``sync.shards.ShardView``)."""

    @property
    def count(self) -> int: ...

    def root(self) -> tuple[bytes, int]: ...

    def root_check(self) -> int: ...

    def leaf_counts(self, buckets: Iterable[int]) -> list[int]: ...

    def hashes(self, depth: int, indexes: Iterable[int], salt: bytes, width: int) -> bytes: ...

    def cell(self, bucket: int) -> tuple[int, int, int]: ...


class MerkleTree:
    """One domain's tree. Not thread-safe: its owner (the DB writer or a session driver) updates it."""

    __slots__ = ("_check", "_check_root", "_count", "_xor")

    def __init__(self) -> None:
        self._xor: list[list[int]] = [[0] * (FANOUT**k) for k in range(DEPTH + 1)]
        self._count: list[list[int]] = [[0] * (FANOUT**k) for k in range(DEPTH + 1)]
        self._check: list[int] = [0] * NUM_BUCKETS
        self._check_root = 0  # XOR of every leaf's check: the root is a cell too (root_check)

    # --- building ---

    @classmethod
    def from_ids(cls, ids: Iterable[bytes]) -> MerkleTree:
        """Build from every id at once: the leaves first, then each non-empty leaf into its ancestors."""
        tree = cls()
        leaf_xor, leaf_count, leaf_check = tree._xor[DEPTH], tree._count[DEPTH], tree._check
        from_bytes = int.from_bytes
        digest = blake3.blake3
        touched: set[int] = set()
        for record_id in ids:
            if len(record_id) != RECORD_ID_LEN:
                raise ValueError(f"record id must be {RECORD_ID_LEN} bytes, got {len(record_id)}")
            bucket = (record_id[0] << 8) | record_id[1]
            leaf_xor[bucket] ^= from_bytes(record_id, "big")
            leaf_count[bucket] += 1
            leaf_check[bucket] ^= from_bytes(digest(record_id).digest(CHECK_LEN), "big")
            touched.add(bucket)
        for bucket in touched:  # each non-empty leaf once into its four ancestors
            xor, count = leaf_xor[bucket], leaf_count[bucket]
            tree._check_root ^= leaf_check[bucket]
            for depth in range(DEPTH):
                index = bucket >> (FANOUT_BITS * (DEPTH - depth))
                tree._xor[depth][index] ^= xor
                tree._count[depth][index] += count
        return tree

    def copy(self) -> MerkleTree:
        return self._copy_into(MerkleTree())

    def _copy_into(self, tree: _Tree) -> _Tree:
        tree._xor = [level[:] for level in self._xor]
        tree._count = [level[:] for level in self._count]
        tree._check = self._check[:]
        tree._check_root = self._check_root
        return tree

    # --- incremental updates ---

    def _toggle(self, record_id: bytes, delta: int) -> None:
        if len(record_id) != RECORD_ID_LEN:
            raise ValueError(f"record id must be {RECORD_ID_LEN} bytes, got {len(record_id)}")
        bucket = (record_id[0] << 8) | record_id[1]
        value = int.from_bytes(record_id, "big")
        if delta < 0 and self._count[DEPTH][bucket] == 0:
            raise ValueError("remove from an empty bucket: the tree and the store disagree")
        for depth in range(DEPTH, -1, -1):
            index = bucket >> (FANOUT_BITS * (DEPTH - depth))
            self._xor[depth][index] ^= value
            self._count[depth][index] += delta
        check = check_hash(record_id)
        self._check[bucket] ^= check
        self._check_root ^= check

    def insert(self, record_id: bytes) -> None:
        self._toggle(record_id, +1)

    def remove(self, record_id: bytes) -> None:
        self._toggle(record_id, -1)

    def replace(self, old_id: bytes | None, new_id: bytes | None) -> None:
        """Apply a store change: old record id out, new one in (either may be None)."""
        if old_id == new_id:
            return
        if old_id is not None:
            self.remove(old_id)
        if new_id is not None:
            self.insert(new_id)

    # --- reading ---

    @property
    def count(self) -> int:
        return self._count[0][0]

    def root(self) -> tuple[bytes, int]:
        """Full-width root: (XOR of every id, number of ids)."""
        return self._xor[0][0].to_bytes(32, "big"), self._count[0][0]

    def root_check(self) -> int:
        """XOR of every id's check hash: with ``root``, the whole set as one IBLT cell."""
        return self._check_root

    def root_digest(self) -> bytes:
        """A 32-byte digest of the root, for display and equality checks."""
        xor, count = self.root()
        return blake3.blake3(xor + count.to_bytes(8, "big")).digest()

    def node(self, depth: int, index: int) -> tuple[int, int]:
        return self._xor[depth][index], self._count[depth][index]

    def hashes(self, depth: int, indexes: Iterable[int], salt: bytes, width: int) -> bytes:
        """Concatenated salted hashes of the given nodes at ``depth``."""
        xors, counts = self._xor[depth], self._count[depth]
        return b"".join(node_hash(salt, xors[i], counts[i], width) for i in indexes)

    def leaf_counts(self, buckets: Iterable[int]) -> list[int]:
        """How many ids the tree files in each of ``buckets``."""
        counts = self._count[DEPTH]
        return [counts[b] for b in buckets]

    def cell(self, bucket: int) -> tuple[int, int, int]:
        """(count, xor, check) of one leaf."""
        return self._count[DEPTH][bucket], self._xor[DEPTH][bucket], self._check[bucket]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MerkleTree):
            return NotImplemented
        return (
            self._xor[DEPTH] == other._xor[DEPTH]
            and self._count[DEPTH] == other._count[DEPTH]
            and self._check == other._check
        )

    __hash__ = None  # type: ignore[assignment]


def children(depth: int, parents: Iterable[int]) -> list[int]:
    """Indexes at ``depth + 1`` of the children of ``parents`` (at ``depth``), in order."""
    return descendants(depth, parents, depth + 1)


def descendants(depth: int, nodes: Iterable[int], at: int) -> list[int]:
    """Indexes at depth ``at`` of the nodes under ``nodes`` (at ``depth``), in order; each
    node's are one ``range``, so the list is built in C (a region is up to 65,536 buckets)."""
    shift = FANOUT_BITS * (at - depth)
    return list(chain.from_iterable(range(n << shift, (n + 1) << shift) for n in nodes))


class VersionedTree(MerkleTree):
    """A tree that also counts the changes of each leaf: a listing of a bucket read from the
    store stays the bucket's listing while its count is unchanged (``sync.listing_cache``).
    A counter, not the leaf's (xor, count): ids can be ground to XOR alike, a count cannot
    be made to repeat."""

    __slots__ = ("versions",)

    def __init__(self) -> None:
        super().__init__()
        self.versions = [0] * NUM_BUCKETS

    def copy(self) -> VersionedTree:
        tree = self._copy_into(VersionedTree())
        tree.versions = self.versions[:]
        return tree

    def _toggle(self, record_id: bytes, delta: int) -> None:
        super()._toggle(record_id, delta)
        self.versions[(record_id[0] << 8) | record_id[1]] += 1
