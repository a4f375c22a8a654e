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
* ``IndexedTree``, every tree of a simulated replica, keeps only the levels a
  session reads whole (0 to ``KEPT_DEPTH``) and derives a node below them when it
  is read: from the shard's bucket index (``sync.buckets.Buckets``, every id the
  shard's replicas ever listed) and the ids the replica holds. A shard holds a
  part of the records, so its trees are sparse: stored, the two lowest levels
  held about one node per record each, and with the leaves' checks they were
  69 % of a task's memory (SIM.md, "Memory"); a session reads a handful of them.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from typing import Any, cast

from store.keys import NUM_BUCKETS, RECORD_ID_LEN
from sync.buckets import Buckets
from sync.merkle import DEPTH, FANOUT_BITS, MerkleTree, check_hash, node_hash
from sync.protocol import TOP_DEPTH

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
        return self._hashed(((xors[i], counts[i]) for i in indexes), salt, width)

    def _hashed(self, nodes: Iterable[tuple[int, int]], salt: bytes, width: int) -> bytes:
        """The salted hashes of ``nodes`` ((xor, count) each), the current salt's remembered."""
        known = self._cache.node_hashes(salt)
        empty = known.get((0, 0, width))
        if empty is None:
            empty = known[(0, 0, width)] = node_hash(salt, 0, 0, width)
        out = []
        for xor, count in nodes:
            if not count:
                out.append(empty)
                continue
            key = (xor, count, width)
            digest = known.get(key)
            if digest is None:
                digest = known[key] = node_hash(salt, xor, count, width)
            out.append(digest)
        return b"".join(out)


# A session's first NODES frame carries every node at TOP_DEPTH: the levels down to it are
# read whole, so they are kept; the rest is read a few nodes at a time and derived.
KEPT_DEPTH = TOP_DEPTH
assert KEPT_DEPTH == 2  # IndexedTree._toggle unrolls the kept levels


class IndexedTree(SimTree):
    """A replica's tree with levels 0 to ``KEPT_DEPTH`` kept and the rest derived when read:
    a node below is the XOR and count of the ids under it that the replica holds, found
    through the shard's bucket index (``known``: ids of the domain any replica listed).

    The replica calls ``hold`` with its dict of the domain's held records once; it must add
    an id to that dict (and list it in ``known``) before inserting it here, and remove it
    before removing it here — as ``MemoryReplica._index`` does. Reads between are the
    replica's business: a session reads trees after its writes."""

    __slots__ = ("_held", "_known")

    def __init__(self, cache: TreeCache | None = None, known: Buckets | None = None) -> None:
        # no MerkleTree.__init__: only the kept levels, in lists (273 slots: a session reads
        # them whole, and a list reads faster than a dict of what is filled)
        self._xor = [[0] * (1 << (FANOUT_BITS * k)) for k in range(KEPT_DEPTH + 1)]
        self._count = [[0] * (1 << (FANOUT_BITS * k)) for k in range(KEPT_DEPTH + 1)]
        self._check = cast(Any, None)  # the leaves' checks are derived too (``cell``)
        self._check_root = 0
        self._cache = cache if cache is not None else TreeCache()
        self._known = known if known is not None else Buckets()
        self._held: Container[bytes] = frozenset()

    def hold(self, held: Container[bytes]) -> None:
        self._held = held

    def _toggle(self, record_id: bytes, delta: int) -> None:
        bucket, value, check = self._cache.ids[record_id]
        xor, count = self._xor, self._count
        i = bucket >> (FANOUT_BITS * (DEPTH - KEPT_DEPTH))
        if delta < 0 and not count[2][i]:
            raise ValueError("remove from an empty node: the tree and the store disagree")
        xor[2][i] ^= value
        count[2][i] += delta
        i >>= FANOUT_BITS
        xor[1][i] ^= value
        count[1][i] += delta
        xor[0][0] ^= value
        count[0][0] += delta
        self._check_root ^= check

    def _held_values(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """(bucket, value, check) of each held id in buckets ``[start, end)``."""
        held, values = self._held, self._cache.ids
        return [
            values[record_id]
            for ids in self._known.in_range(start, end)
            for record_id in ids
            if record_id in held
        ]

    def _cell(self, start: int, end: int) -> tuple[int, int, int]:
        """(count, xor, check) of the held ids in buckets ``[start, end)``."""
        count = xor = check = 0
        for _, value, id_check in self._held_values(start, end):
            count += 1
            xor ^= value
            check ^= id_check
        return count, xor, check

    def node(self, depth: int, index: int) -> tuple[int, int]:
        if depth <= KEPT_DEPTH:
            return super().node(depth, index)
        shift = FANOUT_BITS * (DEPTH - depth)
        count, xor, _ = self._cell(index << shift, (index + 1) << shift)
        return xor, count

    def hashes(self, depth: int, indexes: Iterable[int], salt: bytes, width: int) -> bytes:
        if depth <= KEPT_DEPTH:
            return super().hashes(depth, indexes, salt, width)
        return self._hashed((self.node(depth, i) for i in indexes), salt, width)

    def leaf_counts(self, buckets: Iterable[int]) -> list[int]:
        holds, known = self._held.__contains__, self._known
        return [sum(map(holds, known.of(b))) for b in buckets]

    def cell(self, bucket: int) -> tuple[int, int, int]:
        return self._cell(bucket, bucket + 1)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MerkleTree):
            return NotImplemented
        return self.materialized() == other

    __hash__ = None  # type: ignore[assignment]

    def copy(self) -> MerkleTree:
        return self.materialized()

    def materialized(self) -> MerkleTree:
        """The same tree with every level stored (``MerkleTree.from_ids`` of the held ids)."""
        held = self._held
        return MerkleTree.from_ids(
            i for ids in self._known.in_range(0, NUM_BUCKETS) for i in ids if i in held
        )
