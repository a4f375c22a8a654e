"""``chatsync sim scale``: what peering by discovery costs one node as the network grows, and
how fast a healed partition converges. Plain Python, no Spark.

Per N, one run of the overlay (``sim.overlay``: the node's own ``PeerBook``, ``surplus``,
``SyncRotation`` and exchange frames), one round per sync interval:

1. *Warm-up*: the N nodes join at once, knowing only bootstrap nodes 0..2; ``fresh``
   new records a round, each made on a hashed live node.
2. *Steady*: the same; the per-node figures are measured over these rounds — sessions
   opened and answered, records received, bytes (sessions and exchanges), connections.
3. *Partition*: a hashed half of the other nodes is cut from the rest and the bootstrap
   nodes stop, for good (as issue 32's demonstration stops the bootstrap node of three).
   New records stop. Connections across the cut fail; each side refills its own.
4. *Heal*: the cut goes. Every live node then holds its own side's records and none of
   the other side's (one record per node, made at the cut: as gossip within each side
   would have spread them). The figure is the rounds until every live node holds every
   record (O(log N) expected; printed beside log2 N), or ``None`` within ``max_heal_rounds``.

A node's records are a set (a Python int as a bitset), and a session leaves both ends
with the union of what they held at the round's start (rounds are synchronous: a record
moves at most one hop a round). Bytes: up to ``sample`` sessions a round (hashed choice)
run for real — ``sync.loopback.run_session`` between two ``MemoryReplica``s holding
exactly the two ends' records as signed messages — and a round's session bytes are the
sampled mean times its sessions; each sampled session must move exactly the records the
set model moves (``model_mismatches`` counts those that did not). Exchange bytes are the
real frames' length.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sim.bugs import book_for
from sim.network import Network
from sim.overlay import Overlay, OverlayParams
from sim.rand import h64
from store.hlc import VIRTUAL_EPOCH_MS, Hlc
from store.records import MsgV1
from store.signing import key_from_seed
from sync.loopback import run_session
from sync.protocol import KINDS, SyncConfig
from sync.replica import MemoryReplica

PAYLOAD = 100  # bytes per record's payload
# A correct overlay converges after the heal within C * log2(N) + K rounds (the check): the
# quiescence the Spark replay gives a trace after its heal (SIM.md, "Heal").
BOUND_C, BOUND_K = 1.0, 6


@dataclass(frozen=True)
class ScaleParams:
    nodes: int
    seed: int = 1
    interval_ms: int = 10_000  # a node's sync interval (node.config: sync_interval_s)
    warmup_rounds: int = 12
    steady_rounds: int = 8
    partition_rounds: int = 12
    max_heal_rounds: int = 60
    fresh: int = 8  # new records a round, network-wide, before the partition
    sample: int = 12  # real sessions a round (before the heal) ...
    heal_sample: int = 3  # ... and after it (replicas of up to N records)
    plant: str | None = None  # a sim.bugs.PeeringBug
    turnover: bool = True  # sim.overlay: one more dial per exchange between the waters


@dataclass
class ScaleResult:
    nodes: int
    log2_n: float
    plant: str | None
    steady: dict[str, float]
    heal: dict[str, Any]
    sampled_sessions: int
    model_mismatches: int
    wall_s: float
    cpu_s: float
    rounds: list[dict[str, Any]] = field(default_factory=list)

    @property
    def bound(self) -> float:
        return BOUND_C * self.log2_n + BOUND_K

    @property
    def converged_in_bound(self) -> bool:
        rounds = self.heal["rounds_to_converge"]
        return rounds is not None and rounds <= self.bound


class _Records:
    """Signed messages, one per record index, made when first needed (signing is slow)."""

    def __init__(self, seed: int) -> None:
        self.key = key_from_seed(h64(seed, "scale-key").to_bytes(8, "big") * 4)
        self.chat = h64(seed, "scale-chat").to_bytes(8, "big") * 4
        self.made: list[MsgV1] = []

    def get(self, index: int) -> MsgV1:
        while len(self.made) <= index:
            i = len(self.made)
            payload = i.to_bytes(4, "big") * (PAYLOAD // 4)
            self.made.append(MsgV1.create(self.key, self.chat, Hlc(VIRTUAL_EPOCH_MS + i), payload))
        return self.made[index]

    def replica(self, bits: int) -> MemoryReplica:
        replica = MemoryReplica(admit_all=True)  # the sync engine alone: no chat rules
        replica.apply_ops([self.get(i) for i in _indexes(bits)])
        return replica


def _indexes(bits: int) -> list[int]:
    out = []
    while bits:
        low = bits & -bits
        out.append(low.bit_length() - 1)
        bits ^= low
    return out


class ScaleRun:
    def __init__(self, params: ScaleParams) -> None:
        self.p = p = params
        n = p.nodes
        self.overlay = Overlay(
            n,
            p.seed,
            OverlayParams(interval_ms=p.interval_ms, turnover=p.turnover),
            book_for(p.plant),
        )
        self.net = Network(n, p.seed)
        self.alive = [True] * n
        self.bits = [0] * n
        self.next_record = 0
        self.records = _Records(p.seed)
        self.side = [
            i >= len(self.overlay.bootstrap) and h64(p.seed, "side", i) % 2 == 1 for i in range(n)
        ]
        self.rows: list[dict[str, Any]] = []
        self.sampled = 0
        self.mismatches = 0
        self.config = SyncConfig(max_offset_ms=120_000)

    # --- the phases ---

    def run(self, on_round: Callable[[str, int], None] | None = None) -> ScaleResult:
        p = self.p
        wall0, cpu0 = time.perf_counter(), time.process_time()
        note = on_round or (lambda phase, number: None)
        for _ in range(p.warmup_rounds + p.steady_rounds):
            self._fresh(p.fresh)
            phase = "warm-up" if len(self.rows) < p.warmup_rounds else "steady"
            note(phase, len(self.rows))
            self._round(phase, p.sample)
        self._cut()
        for _ in range(p.partition_rounds):
            note("partition", len(self.rows))
            self._round("partition", p.sample)
        target = self._heal()
        converged_after: int | None = None
        for k in range(1, p.max_heal_rounds + 1):
            note("heal", len(self.rows))
            self._round("heal", p.heal_sample)
            if all(self.bits[i] == target for i in self._live()):
                converged_after = k
                break
        return ScaleResult(
            nodes=p.nodes,
            log2_n=math.log2(p.nodes),
            plant=p.plant,
            steady=self._summary("steady"),
            heal={
                "rounds_to_converge": converged_after,
                "records": target.bit_count(),
                **{f"heal_{k}": v for k, v in self._summary("heal").items()},
            },
            sampled_sessions=self.sampled,
            model_mismatches=self.mismatches,
            wall_s=time.perf_counter() - wall0,
            cpu_s=time.process_time() - cpu0,
            rounds=self.rows,
        )

    def _live(self) -> list[int]:
        return [i for i in range(self.p.nodes) if self.alive[i]]

    def _fresh(self, count: int) -> None:
        live = self._live()
        for _ in range(count):
            r = self.next_record
            self.bits[live[h64(self.p.seed, "fresh", r) % len(live)]] |= 1 << r
            self.next_record += 1

    def _cut(self) -> None:
        self.net.partition([i for i in range(self.p.nodes) if self.side[i]], oneway=False)
        for b in self.overlay.bootstrap:
            self.alive[b] = False

    def _heal(self) -> int:
        """The cut goes; each side holds its own side's fresh records. Returns the target:
        every record some live node holds."""
        self.net.heal()
        live = self._live()
        made: dict[bool, int] = {True: 0, False: 0}
        for i in live:
            made[self.side[i]] |= 1 << self.next_record
            self.next_record += 1
        for i in live:
            self.bits[i] |= made[self.side[i]]
        target = 0
        for i in live:
            target |= self.bits[i]
        return target

    # --- one round ---

    def _round(self, phase: str, sample: int) -> None:
        number = len(self.rows)
        now_ms = VIRTUAL_EPOCH_MS + (number + 1) * self.p.interval_ms
        pairs = self.overlay.round(now_ms, self.alive, self.net.can_talk)
        old = self.bits
        new = list(old)
        for a, b in pairs:
            union = old[a] | old[b]
            new[a] |= union
            new[b] |= union
        received = sum(new[i].bit_count() - old[i].bit_count() for i in range(self.p.nodes))
        session_bytes = self._sampled_bytes(pairs, old, sample, number, now_ms)
        self.bits = new
        live = self._live()
        s = self.overlay.stats
        degrees = [len(self.overlay.conns[i]) for i in live]
        self.rows.append(
            {
                "round": number,
                "phase": phase,
                "live": len(live),
                "sessions": len(pairs),
                "records_received": received,
                "session_bytes": session_bytes * len(pairs),
                "exchange_bytes": s.exchange_bytes,
                "exchanges": s.exchanges,
                "dials": s.dials,
                "dials_failed": s.dials_failed,
                "connects": s.connects,
                "closed_surplus": s.closed_surplus,
                "connections_mean": sum(degrees) / max(len(live), 1),
                "connections_max": max(degrees, default=0),
                "peak_degree": s.peak_degree,
                "crossing": self.overlay.crossing(self.side),
            }
        )

    def _sampled_bytes(
        self,
        pairs: Sequence[tuple[int, int]],
        bits: Sequence[int],
        sample: int,
        number: int,
        now_ms: int,
    ) -> float:
        """The mean bytes of up to ``sample`` real sessions among ``pairs`` (0 if none)."""
        if not pairs or sample <= 0:
            return 0.0
        rnd = random.Random(h64(self.p.seed, "sample", number))
        chosen = rnd.sample(list(pairs), min(sample, len(pairs)))
        total = 0
        for a, b in chosen:
            result = run_session(
                self.records.replica(bits[a]),
                self.records.replica(bits[b]),
                now_ms=now_ms,
                config=self.config,
            )
            total += sum(result.bytes_sent[kind] for kind in KINDS)
            moved = (bits[a] ^ bits[b]).bit_count()
            self.mismatches += not result.converged or result.records_applied != moved
        self.sampled += len(chosen)
        return total / len(chosen)

    def _summary(self, phase: str) -> dict[str, float]:
        """Per live node per round, over the rounds of ``phase``."""
        rows = [r for r in self.rows if r["phase"] == phase]
        if not rows:
            return {}
        node_rounds = sum(r["live"] for r in rows)

        def per_node(name: str) -> float:
            return sum(r[name] for r in rows) / node_rounds

        sessions = 2 * per_node("sessions")  # opened and answered
        records = per_node("records_received")
        return {
            "sessions_per_node": sessions,
            "records_per_node": records,
            "node_ops_per_node": sessions + records,
            # bytes a node sends (= receives, on average): every byte has one sender
            "session_bytes_per_node": per_node("session_bytes"),
            "exchange_bytes_per_node": per_node("exchange_bytes"),
            "bytes_per_node": per_node("session_bytes") + per_node("exchange_bytes"),
            "dials_per_node": per_node("dials"),
            "connections_mean": sum(r["connections_mean"] for r in rows) / len(rows),
            "connections_max": max(r["connections_max"] for r in rows),
            "peak_degree": max(r["peak_degree"] for r in rows),
        }


def run_scale(
    params: ScaleParams, on_round: Callable[[str, int], None] | None = None
) -> ScaleResult:
    return ScaleRun(params).run(on_round)


def result_dict(result: ScaleResult) -> dict[str, Any]:
    out = asdict(result)
    out["bound"] = result.bound
    out["converged_in_bound"] = result.converged_in_bound
    return out
