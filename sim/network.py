"""The simulated network: partitions, gossip fates and session cuts, all hashed from (seed, ids).

Gossip is modelled as GossipSub's outcome rather than its mesh: an op published
by its origin reaches every other node by one delivery whose fate — dropped,
delayed by ``delay_ms`` plus up to ``jitter_ms`` (so deliveries reorder),
duplicated — is drawn from (seed, op id, receiver). A partition cuts deliveries
whose direction crosses it at publish time: ``partition`` both ways,
``partition_oneway`` from the group to the rest only. Gossip is best effort;
anti-entropy sessions are the guarantee, and they need both directions open.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.rand import h64

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_FIELD = np.uint64((1 << 21) - 1)
_FIELD_SCALE = float(1 << 21)
MAX_CUT_FRAMES = 8


@dataclass
class NetParams:
    drop: float = 0.0
    dup: float = 0.0
    delay_ms: int = 50
    jitter_ms: int = 100

    def after(self, net_event: dict[str, Any]) -> NetParams:
        """The conditions after a trace's ``net`` event: each field it leaves out (None) stays."""
        return NetParams(
            *(
                getattr(self, name) if net_event[name] is None else net_event[name]
                for name in ("drop", "dup", "delay_ms", "jitter_ms")
            )
        )


def _mix(keys: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser, vectorised (uint64 arithmetic wraps, as it should)."""
    z = keys
    z = (z ^ (z >> np.uint64(30))) * _C1
    z = (z ^ (z >> np.uint64(27))) * _C2
    return z ^ (z >> np.uint64(31))


class Network:
    def __init__(self, nodes: int, seed: int, params: NetParams | None = None) -> None:
        self.nodes = nodes
        self.seed = seed
        self.params = params or NetParams()
        self._cuts: list[tuple[np.ndarray, bool]] = []  # (in_group mask, oneway)
        self._reach: dict[int, np.ndarray] = {}  # origin -> receivers not cut off
        self._ids = np.arange(nodes, dtype=np.uint64) * _GOLDEN
        self._everyone = np.ones(nodes, dtype=bool)

    # --- partitions ---

    def partition(self, group: list[int], oneway: bool) -> None:
        mask = np.zeros(self.nodes, dtype=bool)
        mask[[g for g in group if 0 <= g < self.nodes]] = True
        self._cuts.append((mask, oneway))
        self._reach.clear()

    def heal(self) -> None:
        self._cuts.clear()
        self._reach.clear()

    def blocked(self, src: int, dst: int) -> bool:
        for mask, oneway in self._cuts:
            if mask[src] and not mask[dst]:
                return True
            if not oneway and mask[dst] and not mask[src]:
                return True
        return False

    def can_talk(self, a: int, b: int) -> bool:
        return not self.blocked(a, b) and not self.blocked(b, a)

    def reachable(self, origin: int) -> np.ndarray:
        reach = self._reach.get(origin)
        if reach is None:
            reach = self._everyone.copy()
            for mask, oneway in self._cuts:
                if mask[origin]:
                    reach &= mask
                elif not oneway:
                    reach &= ~mask
            reach[origin] = False
            self._reach[origin] = reach
        return reach

    # --- gossip ---

    def gossip(
        self, op_key: int, origin: int, t_ms: int, subscribed: np.ndarray | None = None
    ) -> tuple[list[int], list[int], int, int]:
        """Deliveries of one op: (receivers, times), then how many were dropped and duplicated.

        A receiver may appear twice (a duplicate); times include delay and jitter.
        ``subscribed``: the nodes on the op's topic (a scoped op's shard), None for all.
        """
        p = self.params
        reach = self.reachable(origin)
        if subscribed is not None:
            reach = reach & subscribed
        z = _mix(self._ids ^ np.uint64(op_key))
        draw_drop = (z & _FIELD).astype(np.float64) / _FIELD_SCALE
        draw_delay = ((z >> np.uint64(21)) & _FIELD).astype(np.float64) / _FIELD_SCALE
        sent = reach & (draw_drop >= p.drop) if p.drop > 0 else reach
        dropped = int(reach.sum() - sent.sum())
        times = t_ms + p.delay_ms + (draw_delay * p.jitter_ms).astype(np.int64)
        receivers = np.flatnonzero(sent)
        out_r = receivers.tolist()
        out_t = times[receivers].tolist()
        dups = 0
        if p.dup > 0:
            draw_dup = ((z >> np.uint64(42)) & _FIELD).astype(np.float64) / _FIELD_SCALE
            twice = np.flatnonzero(sent & (draw_dup < p.dup))
            if twice.size:
                z2 = _mix(z[twice])
                later = (
                    (z2 & _FIELD).astype(np.float64) / _FIELD_SCALE * (p.jitter_ms + 1)
                ).astype(np.int64)
                out_r.extend(twice.tolist())
                out_t.extend((times[twice] + later).tolist())
                dups = int(twice.size)
        return out_r, out_t, dropped, dups

    # --- anti-entropy ---

    def peer(self, round_no: int, node: int) -> int:
        """The peer ``node`` starts a session with in round ``round_no``."""
        if self.nodes < 2:
            return node
        step = 1 + h64(self.seed, "peer", round_no, node) % (self.nodes - 1)
        return (node + step) % self.nodes

    def cut_after(self, round_no: int, node: int, peer: int | None = None) -> int | None:
        """A session lost with probability ``drop``: the connection dies after this many frames.
        ``peer`` names the responder where a node starts several sessions a round."""
        if self.params.drop <= 0:
            return None
        ids = (round_no, node) if peer is None else (round_no, node, peer)
        draw = h64(self.seed, "cut", *ids)
        if (draw >> 11) / float(1 << 53) >= self.params.drop:
            return None
        return 1 + draw % MAX_CUT_FRAMES
