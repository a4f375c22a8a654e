"""``MerkleTree`` as the simulator stores it: the project's tree code, cheaper per replica.

Hundreds of replicas share one process, each shard's trees hold only the records of
its chats (or users), and the member and identity trees hold few ids. So:

* a ``TreeCache`` shared by every tree of a shard keeps, per record id, what
  ``MerkleTree._toggle`` derives from it — its bucket, its value as an int and its
  leaf check hash (BLAKE3) — so an id entering a hundred replicas is hashed once,
  not a hundred times; ``SimTree._toggle`` is ``MerkleTree._toggle`` over those
  values, its loop over the five levels unrolled;
* ``SimTree.hashes`` computes the salted hash of an empty node ``(0, 0)`` once
  per call instead of once per empty node, and remembers the hashes of the
  current salt in the ``TreeCache``: both ends of a session hash the same nodes
  with one salt, and where their trees agree (most nodes) the second end finds
  the first's bytes (``node_hash`` is a function of salt, xor, count and width only);
* ``SparseMerkleTree`` keeps its levels in dicts that read 0 for absent nodes, so
  an almost empty tree costs almost nothing: every tree of a simulated replica is
  one (a shard holds a part of the records, so most leaves of its trees are
  empty). Every other method is ``MerkleTree``'s own, running unchanged over that
  storage.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from store.keys import RECORD_ID_LEN
from sync.merkle import DEPTH, MerkleTree, check_hash, node_hash

assert DEPTH == 4  # SimTree._toggle unrolls the levels


class IdValues(dict[bytes, tuple[int, int, int]]):
    """record id -> (bucket, value, check): what a tree update derives from an id, once."""

    __slots__ = ()

    def __missing__(self, record_id: bytes) -> tuple[int, int, int]:
        if len(record_id) != RECORD_ID_LEN:
            raise ValueError(f"record id must be {RECORD_ID_LEN} bytes, got {len(record_id)}")
        values = (
            (record_id[0] << 8) | record_id[1],
            int.from_bytes(record_id, "big"),
            check_hash(record_id),
        )
        self[record_id] = values
        return values


class TreeCache:
    """What the trees of one shard share: ids' derived values, and the current salt's
    node hashes (dropped when the salt changes: a new pass, a new session)."""

    __slots__ = ("hashes", "ids", "salt")

    def __init__(self) -> None:
        self.ids = IdValues()
        self.salt = b""
        self.hashes: dict[tuple[int, int, int], bytes] = {}  # (xor, count, width) -> hash

    def node_hashes(self, salt: bytes) -> dict[tuple[int, int, int], bytes]:
        if salt != self.salt:
            self.salt, self.hashes = salt, {}
        return self.hashes


class SimTree(MerkleTree):
    __slots__ = ("_cache",)

    def __init__(self, cache: TreeCache | None = None) -> None:
        super().__init__()
        self._cache = cache if cache is not None else TreeCache()

    def _toggle(self, record_id: bytes, delta: int) -> None:
        bucket, value, check = self._cache.ids[record_id]
        xor, count = self._xor, self._count
        leaves = count[4]
        if delta < 0 and leaves[bucket] == 0:
            raise ValueError("remove from an empty bucket: the tree and the store disagree")
        xor[4][bucket] ^= value
        leaves[bucket] += delta
        i = bucket >> 4
        xor[3][i] ^= value
        count[3][i] += delta
        i >>= 4
        xor[2][i] ^= value
        count[2][i] += delta
        i >>= 4
        xor[1][i] ^= value
        count[1][i] += delta
        xor[0][0] ^= value
        count[0][0] += delta
        self._check[bucket] ^= check
        self._check_root ^= check

    def hashes(self, depth: int, indexes: Iterable[int], salt: bytes, width: int) -> bytes:
        xors, counts = self._xor[depth], self._count[depth]
        known = self._cache.node_hashes(salt)
        empty = known.get((0, 0, width))
        if empty is None:
            empty = known[(0, 0, width)] = node_hash(salt, 0, 0, width)
        out = []
        for i in indexes:
            count = counts[i]
            if not count:
                out.append(empty)
                continue
            key = (xors[i], count, width)
            digest = known.get(key)
            if digest is None:
                digest = known[key] = node_hash(salt, key[0], count, width)
            out.append(digest)
        return b"".join(out)


class _Zeros(dict[int, int]):
    """A dict that reads 0 for a missing key, without storing it."""

    __slots__ = ()

    def __missing__(self, key: int) -> int:
        return 0


class SparseMerkleTree(SimTree):
    __slots__ = ()

    def __init__(self, cache: TreeCache | None = None) -> None:
        # no MerkleTree.__init__: it would allocate the full lists
        self._xor = cast(Any, [_Zeros() for _ in range(DEPTH + 1)])
        self._count = cast(Any, [_Zeros() for _ in range(DEPTH + 1)])
        self._check = cast(Any, _Zeros())
        self._check_root = 0
        self._cache = cache if cache is not None else TreeCache()

    def _toggle(self, record_id: bytes, delta: int) -> None:
        # SimTree._toggle with get(i, 0): a missing node read through __missing__ is a
        # Python call, and in an almost empty tree most nodes are missing
        bucket, value, check = self._cache.ids[record_id]
        xor: list[_Zeros] = cast(Any, self._xor)
        count: list[_Zeros] = cast(Any, self._count)
        leaves = count[4]
        if delta < 0 and not leaves.get(bucket, 0):
            raise ValueError("remove from an empty bucket: the tree and the store disagree")
        i = bucket
        for depth in (4, 3, 2, 1):
            xors, counts = xor[depth], count[depth]
            xors[i] = xors.get(i, 0) ^ value
            counts[i] = counts.get(i, 0) + delta
            i >>= 4
        xor[0][0] ^= value
        count[0][0] += delta
        checks: _Zeros = cast(Any, self._check)
        checks[bucket] = checks.get(bucket, 0) ^ check
        self._check_root ^= check
