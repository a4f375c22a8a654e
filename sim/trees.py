"""``MerkleTree`` as the simulator stores it: the project's tree code, cheaper per replica.

Hundreds of replicas share one process, each shard's message tree covers only
its own bucket range, and the member and identity trees hold few ids. So:

* ``SimTree.hashes`` computes the salted hash of an empty node ``(0, 0)`` once
  per call instead of once per empty node (the bytes are identical);
* ``SparseMerkleTree`` keeps its levels in dicts that read 0 for absent nodes, so
  an almost empty tree costs almost nothing. Every other method is
  ``MerkleTree``'s own, running unchanged over that storage.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from sync.merkle import DEPTH, MerkleTree, node_hash


class SimTree(MerkleTree):
    __slots__ = ()

    def hashes(self, depth: int, indexes: Iterable[int], salt: bytes, width: int) -> bytes:
        xors, counts = self._xor[depth], self._count[depth]
        empty = node_hash(salt, 0, 0, width)
        return b"".join(
            node_hash(salt, xors[i], counts[i], width) if counts[i] else empty for i in indexes
        )


class _Zeros(dict[int, int]):
    """A dict that reads 0 for a missing key, without storing it."""

    __slots__ = ()

    def __missing__(self, key: int) -> int:
        return 0


class SparseMerkleTree(SimTree):
    __slots__ = ()

    def __init__(self) -> None:  # no super().__init__: it would allocate the full lists
        self._xor = cast(Any, [_Zeros() for _ in range(DEPTH + 1)])
        self._count = cast(Any, [_Zeros() for _ in range(DEPTH + 1)])
        self._check = cast(Any, _Zeros())
        self._check_root = 0
