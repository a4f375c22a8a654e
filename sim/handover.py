"""The user shards a simulated node holds for what it wrote, until it handed them over.

Issue 33 (docs/design/member-scopes.md, "A node indexes what it writes"): a node that makes a
member op or an identity naming a user whose user shard it does not hold for good indexes
that user shard, and keeps it until a converged session, started after its last such write,
reconciled the user shard with a node that keeps it; then for ``GRACE_MS``. The node's own
rule, ``sync.serving.ServedScope`` (``wrote_for``, ``handed_over``, ``step``), run here per
node. A node "keeps" a user shard when the trace gives it for good (its served users' or its
R-rule pin: ``sim.scopes``), as a node reads a peer's entitlement (``sync.entitled``).

The end of such a hold depends on when sessions happen, so it cannot be in the trace: the
replay adds these user shards to the trace's scope (``sim.engine``). The run ends healed and
quiescent; ``settle`` then lets every grace end, so each node's final scope is the trace's
last one wherever every hold was handed over — a hold still unhanded stays, and the check
counts its index entries as ``extra``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sim.scopes import node_id
from sync.serving import ServedScope


class Handovers:
    def __init__(self, nodes: int, num_shards: int, grace_ms: int) -> None:
        self.num_shards, self.grace_ms = num_shards, grace_ms
        self.kept: list[frozenset[int]] = [frozenset()] * nodes  # the trace's user shards
        self._served: dict[int, ServedScope] = {}  # nodes that wrote for a user shard
        self.handed_over = 0  # (node, user shard) hand-overs

    def held(self, node: int) -> frozenset[int]:
        """The user shards ``node`` holds for its writes (unhanded, or in their grace)."""
        served = self._served.get(node)
        return frozenset() if served is None else served.held_user_shards()

    def user_shards(self, node: int) -> frozenset[int]:
        """The user shards ``node`` holds: the trace's and those it holds for its writes."""
        return self.kept[node] | self.held(node)

    def wrote_for(self, node: int, user_shard: int, t_ms: int) -> bool:
        """``node`` made an op naming a user of ``user_shard``; True when it holds it newly."""
        if user_shard in self.kept[node]:
            return False
        served = self._served.get(node)
        if served is None:
            served = ServedScope(node_id(node), self.num_shards, grace_ms=self.grace_ms)
            self._served[node] = served
        new = user_shard not in served.held_user_shards()
        served.wrote_for((user_shard,), t_ms)
        return new

    def reconciled(self, a: int, b: int, user_shards: frozenset[int], t_ms: int) -> None:
        """A session of ``a`` and ``b`` started and converged at ``t_ms`` on these user
        shards (the intersection): each hands over those the other keeps."""
        for node, peer in ((a, b), (b, a)):
            served = self._served.get(node)
            if served is not None:
                handed = served.unhanded() & user_shards & self.kept[peer]
                if handed:
                    self.handed_over += len(served.handed_over(handed, t_ms, t_ms))

    def step(self, t_ms: int, alive: Sequence[bool]) -> list[int]:
        """Graces that ended by ``t_ms`` (nodes up only): the nodes whose holds shrank."""
        return [n for n, s in self._served.items() if alive[n] and s.step(t_ms).expired_users]

    def restarted(self, node: int, t_ms: int) -> None:
        """After a restart a node does not know what it handed over: unhanded again."""
        served = self._served.get(node)
        if served is not None:
            served.hold((), served.held_user_shards(), t_ms)

    def settle(self, t_ms: int, alive: Sequence[bool]) -> list[int]:
        """The quiescent end: every grace that started by ``t_ms`` ends."""
        return self.step(t_ms + self.grace_ms, alive)

    def unhanded(self, nodes: Iterable[int]) -> int:
        """(node, user shard) holds not handed over."""
        counted = set(nodes)
        return sum(len(s.unhanded()) for n, s in self._served.items() if n in counted)
