"""The replay's view of who holds which shard (scoped traces, ``sim.scopes``).

What a network of scoped nodes knows of itself: each node's scope (from the trace's
``scope`` events), the holders of each shard (what discovery would find), and the gossip
topic of each shard (the nodes subscribed to it). Peer choice: in round ``k`` a node syncs
the ``k``-th shard of its scope in turn (offset by a hash of the node) with a hashed holder
of it; the session reconciles the whole intersection of both scopes. A node holding nothing
scoped syncs with a uniform peer (the global domains).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import numpy as np

from sim.rand import h64
from sync.scope import Scope, shard_of


class ScopeBook:
    def __init__(self, nodes: int, num_shards: int, seed: int) -> None:
        self.nodes = nodes
        self.num_shards = num_shards
        self.seed = seed
        self.scopes: list[Scope] = [Scope(frozenset(), num_shards)] * nodes
        self._shards: list[list[int]] = [[] for _ in range(nodes)]  # each node's, sorted
        self._holders: dict[int, list[int]] = {}  # shard -> nodes holding it, sorted
        self._topics: dict[int, np.ndarray] = {}  # shard -> subscribed mask
        self._chat_shard: dict[bytes, int] = {}

    def shard(self, chat: bytes) -> int:
        found = self._chat_shard.get(chat)
        if found is None:
            found = self._chat_shard[chat] = shard_of(chat, self.num_shards)
        return found

    def set(self, node: int, shards: frozenset[int]) -> Scope:
        """``node`` holds ``shards`` from now on; returns its new scope."""
        old = set(self._shards[node])
        for s in old - shards:
            self._holders[s].remove(node)
            self._topic(s)[node] = False
        for s in shards - old:
            bisect.insort(self._holders.setdefault(s, []), node)
            self._topic(s)[node] = True
        self._shards[node] = sorted(shards)
        scope = self.scopes[node] = Scope(shards, self.num_shards)
        return scope

    def _topic(self, shard: int) -> np.ndarray:
        mask = self._topics.get(shard)
        if mask is None:
            mask = self._topics[shard] = np.zeros(self.nodes, dtype=bool)
        return mask

    def subscribed(self, chat: bytes) -> np.ndarray:
        """The nodes on a chat's gossip topic."""
        return self._topic(self.shard(chat))

    def peer_of(self, fallback: Callable[[int, int], int]) -> Callable[[int, int], int]:
        def peer(round_no: int, node: int) -> int:
            shards = self._shards[node]
            if not shards:
                return fallback(round_no, node)
            turn = (round_no + h64(self.seed, "scope-turn", node)) % len(shards)
            holders = self._holders[shards[turn]]
            if len(holders) < 2:
                return fallback(round_no, node)
            i = h64(self.seed, "scope-peer", round_no, node) % (len(holders) - 1)
            mine = bisect.bisect_left(holders, node)  # skip ourselves
            return holders[i + (i >= mine)]

        return peer
