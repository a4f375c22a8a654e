"""The replay's view of who holds which shard (scoped traces, ``sim.scopes``).

What a network of scoped nodes knows of itself: each node's scope (from the trace's
``scope`` events: chat shards and user shards), the holders of each shard and user shard
(what discovery would find), and the gossip topic of each (the nodes subscribed to it).
Peer choice: in round ``k`` a node syncs the ``k``-th of its shards and user shards in turn
(offset by a hash of the node) with a hashed holder of it; the session reconciles the whole
intersection of both scopes. A node holding nothing scoped syncs with a uniform peer (the
global domain).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import numpy as np

from sim.rand import h64
from sync.scope import Scope, shard_of, user_shard_of

Topic = tuple[str, int]  # ("chat", shard) or ("user", user shard)


class ScopeBook:
    def __init__(self, nodes: int, num_shards: int, seed: int) -> None:
        self.nodes = nodes
        self.num_shards = num_shards
        self.seed = seed
        self.scopes: list[Scope] = [Scope(frozenset(), num_shards)] * nodes
        self._shards: list[list[Topic]] = [[] for _ in range(nodes)]  # each node's, sorted
        self._holders: dict[Topic, list[int]] = {}  # shard -> nodes holding it, sorted
        self._topics: dict[Topic, np.ndarray] = {}  # shard -> subscribed mask
        self._chat_shard: dict[bytes, int] = {}
        self._user_shard: dict[bytes, int] = {}

    def shard(self, chat: bytes) -> int:
        found = self._chat_shard.get(chat)
        if found is None:
            found = self._chat_shard[chat] = shard_of(chat, self.num_shards)
        return found

    def set(self, node: int, shards: frozenset[int], users: frozenset[int]) -> Scope:
        """``node`` holds ``shards`` and user shards ``users`` from now on; its new scope."""
        old = set(self._shards[node])
        new = {("chat", s) for s in shards} | {("user", u) for u in users}
        for t in old - new:
            self._holders[t].remove(node)
            self._topic(t)[node] = False
        for t in new - old:
            bisect.insort(self._holders.setdefault(t, []), node)
            self._topic(t)[node] = True
        self._shards[node] = sorted(new)
        scope = self.scopes[node] = Scope(shards, self.num_shards, users)
        return scope

    def _topic(self, topic: Topic) -> np.ndarray:
        mask = self._topics.get(topic)
        if mask is None:
            mask = self._topics[topic] = np.zeros(self.nodes, dtype=bool)
        return mask

    def subscribed(self, chat: bytes) -> np.ndarray:
        """The nodes on a chat's gossip topic."""
        return self._topic(("chat", self.shard(chat)))

    def user_shard(self, user: bytes) -> int:
        found = self._user_shard.get(user)
        if found is None:
            found = self._user_shard[user] = user_shard_of(user, self.num_shards)
        return found

    def subscribed_user(self, user: bytes) -> np.ndarray:
        """The nodes on a user's user-shard topic (the user's identity and index entries)."""
        return self._topic(("user", self.user_shard(user)))

    def subscribed_op(self, chat: bytes, user: bytes) -> np.ndarray:
        """The nodes on either topic of a member op: its chat's shard, its user's shard."""
        return self.subscribed(chat) | self.subscribed_user(user)

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
