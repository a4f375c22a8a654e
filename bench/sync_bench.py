"""``chatsync bench sync``: what one anti-entropy session costs, against the floor and the anchors.

Workload per case (n records in the union, d differences, one placement):
  shared   n - d message ids both replicas hold. They never travel in a correct
           run, so they are random 32-byte ids (``random.Random(seed)``; real ids
           are BLAKE3 hashes, so the distribution is the same), not signed
           messages. The base tree and bucket index of a size are built once;
           each case takes the first n - d of its ids.
  differ   d real signed ``MsgV1``, split at random between the two replicas
           (each holds about d/2 the other lacks). ``scattered``: their HLCs are
           uniform over a 30-day range; ``newest``: they are the newest d. One
           pool of each is signed up front and every case uses a prefix of it.
           The tree is keyed by id hash, so the placement should not matter —
           the two rows show whether it does.
Each case runs ``sync.loopback.run_session`` once, then again (it must find the
replicas equal: one round trip, at most 512 bytes). ``BenchReplica`` counts any
request for a shared id: the protocol asking for something both sides hold.

Floor: d x 32 bytes. Naive: one side sends all its ids, the other answers with
the d ids that differ (32 B each). Reconciliation bytes are both directions,
record bodies excluded; nothing here asserts a time.
"""

from __future__ import annotations

import bisect
import gc
import math
import random
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from time import perf_counter, process_time
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench import negentropy_peer
from bench.console import (
    bench_console,
    bench_progress,
    byte_size,
    check_mark,
    red_unless,
    save_report,
)
from bench.machine import loadavg, machine_info
from bench.sync_compare import GOAL_N, goals, goals_table, side_by_side, side_by_side_table
from store.hlc import VIRTUAL_EPOCH_MS, Hlc
from store.keys import NUM_BUCKETS, RECORD_ID_LEN
from store.records import MsgV1, blake3_id
from store.signing import key_from_seed
from sync.frames import Domain
from sync.loopback import LoopbackResult, run_session
from sync.merkle import DEPTH, FANOUT, MerkleTree
from sync.protocol import KINDS, TOP_DEPTH, SyncConfig
from sync.replica import Record
from sync.scope import EVERYTHING, Scope, ScopeNotServed
from sync.shards import ids_run_by_run

SPAN_MS = 30 * 24 * 3600 * 1000  # the shared records' notional time range
PAYLOAD = 200  # bytes per differing message
AUTHORS = 8
CHATS = 16
PLACEMENTS = ("scattered", "newest")

# Targets (the issue) and anchors (/work/shared/notes/sync-anchors.md), at n=10^6, d=10^3.
FLOOR_TARGET = 10.0  # reconciliation bytes <= 10x d*32
EQUAL_MAX_BYTES = 512  # d = 0: at most 512 bytes ...
EQUAL_MAX_ROUND_TRIPS = 1  # ... in one round trip
FETCH_MAX_ROUND_TRIPS = 4  # round trips before the first record travels
ANCHORS: tuple[tuple[str, str, str, str], ...] = (
    ("floor (d x 32 B)", "Minsky, Trachtenberg, Zippel 2003", "1x", "–"),
    ("rateless IBLT", "coded symbols, peel until decoded (SIGCOMM 2024)", "~2x", "~1"),
    ("8 B node hashes + 8 B prefixes, one side", "modelled for fan-out 16, 65,536 buckets", "~9x", "–"),
    ("negentropy", "(timestamp, id) ranges, 16 B fingerprints, 16-way", "~44x (~1.41 MB)", "3"),
    ("32 B node hashes + full id lists", "modelled for fan-out 16, 65,536 buckets", "~45x (40–50x)", "–"),
)  # fmt: skip


@dataclass(frozen=True)
class SyncBenchParams:
    sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    diffs: tuple[int, ...] = (0, 1, 10, 1_000, 10_000)
    hash_width: int = 4
    seed: int = 1
    out: Path = Path("bench-results/sync.json")
    compare_widths: tuple[int, ...] = (3, 5)  # beside hash_width, at the anchor case
    anchor_n: int = 1_000_000
    anchor_d: int = 1_000
    rebuild_ids: int = 1_000_000  # MerkleTree.from_ids vs incremental inserts
    negentropy: bool = True  # run negentropy's reference code on each case too (needs node)
    # alternating sketch/cells sessions whose median CPU ratio judges a goal case (d <= 10^4):
    # one session's ratio swings by ~10 % with a shared machine
    cpu_pairs: int = 7


# --- the replicas ----------------------------------------------------------------------------


@dataclass
class Base:
    """One size's shared ids, built once: random ids, their tree and a bucket index."""

    ids: list[bytes]
    tree: MerkleTree
    index: list[list[bytes]]  # bucket -> sorted ids
    build_s: dict[str, float]
    by_bucket: Any = None  # (n, 32) uint8: the ids in bucket order, for range reads
    positions: Any = None  # each of those ids' place in ``ids`` (a case holds a prefix)
    starts: Any = None  # bucket -> its first row in ``by_bucket`` (65,537 entries)


def make_base_ids(n: int, seed: int) -> list[bytes]:
    """n uniformly random 32-byte ids (the same for every size: a size's ids prefix the next's)."""
    blob = random.Random(seed).randbytes(RECORD_ID_LEN * n)
    return [blob[i : i + RECORD_ID_LEN] for i in range(0, len(blob), RECORD_ID_LEN)]


def build_base(n: int, seed: int, step: Callable[[str], None] = lambda s: None) -> Base:
    timings = {}
    start = perf_counter()
    ids = make_base_ids(n, seed)
    timings["ids_s"] = perf_counter() - start
    step("tree")
    start = perf_counter()
    tree = MerkleTree.from_ids(ids)
    timings["tree_s"] = perf_counter() - start
    step("bucket index")
    start = perf_counter()
    index = build_index(ids)
    rows = np.frombuffer(b"".join(ids), dtype=np.uint8).reshape(-1, RECORD_ID_LEN)
    buckets = (rows[:, 0].astype(np.int64) << 8) | rows[:, 1]
    positions = np.argsort(buckets, kind="stable")
    starts = np.searchsorted(buckets[positions], np.arange(NUM_BUCKETS + 1))
    timings["index_s"] = perf_counter() - start
    step("done")
    return Base(ids, tree, index, timings, rows[positions], positions, starts)


def build_index(ids: Iterable[bytes]) -> list[list[bytes]]:
    index: list[list[bytes]] = [[] for _ in range(1 << 16)]
    for record_id in ids:
        index[(record_id[0] << 8) | record_id[1]].append(record_id)
    for bucket in index:
        bucket.sort()
    return index


class SharedIds:
    """A read-only view of the ids both replicas of a case hold: a base minus its last ids."""

    def __init__(self, base: Base, held: int) -> None:
        self.base = base
        self.count = held
        self.dropped = frozenset(base.ids[held:])
        # the held ids in bucket order, contiguous, and where each bucket starts: an in-memory
        # id index such as a replica keeps beside its tree, built before the session as the
        # tree is (a range read is then one slice)
        kept = base.positions < held
        self.rows = base.by_bucket[kept] if self.dropped else base.by_bucket
        self.starts = np.concatenate([[0], np.cumsum(kept)])[base.starts]

    def bucket(self, bucket: int) -> list[bytes]:
        ids = self.base.index[bucket]
        return [i for i in ids if i not in self.dropped] if self.dropped else ids

    def range_blob(self, start: int, end: int) -> memoryview:
        """The held ids of buckets ``start <= b < end``, concatenated (one slice, as a store's
        range scan would read them)."""
        return memoryview(self.rows[self.starts[start] : self.starts[end]].reshape(-1))

    def __contains__(self, record_id: bytes) -> bool:
        ids = self.base.index[(record_id[0] << 8) | record_id[1]]
        at = bisect.bisect_left(ids, record_id)
        return at < len(ids) and ids[at] == record_id and record_id not in self.dropped

    def tree(self) -> MerkleTree:
        tree = self.base.tree.copy()
        for record_id in self.base.ids[self.count :]:
            tree.remove(record_id)
        return tree


class BenchReplica:
    """A ``sync.replica.Replica``: shared ids (no records behind them) plus its own real messages.

    ``base_requests`` counts asks for a shared id — records the peer already has;
    ``unknown_requests`` counts asks for ids this replica never held. Both must stay 0.
    Retention is not modelled: ``cutoff_ms`` must be None.
    """

    def __init__(self, shared: SharedIds, tree: MerkleTree) -> None:
        self.shared = shared
        # members, identity and deletes: the same OTHER_DOMAIN_IDS ids on both sides, so
        # equal and never descended, but not empty: HELLO announces four non-empty roots
        self.trees = {Domain.MESSAGES: tree, **{d: t.copy() for d, t in _other_trees().items()}}
        self.extras: dict[bytes, MsgV1] = {}
        self.extra_index: dict[int, list[bytes]] = {}
        self._extra_sorted: list[bytes] | None = []  # None: to sort again
        self.base_requests = 0
        self.unknown_requests = 0

    def add(self, msg: MsgV1) -> bool:
        record_id = msg.msg_id
        if record_id in self.extras or record_id in self.shared:
            return False
        self.extras[record_id] = msg
        self._extra_sorted = None
        bisect.insort(
            self.extra_index.setdefault((record_id[0] << 8) | record_id[1], []), record_id
        )
        self.trees[Domain.MESSAGES].insert(record_id)
        return True

    # --- Replica ---

    scope = EVERYTHING

    def tree(self, domain: Domain) -> MerkleTree:
        return self.trees[domain]

    def scope_tree(self, domain: Domain, scope: Scope) -> MerkleTree:
        _full(scope)
        return self.trees[domain]

    def bucket_ids(
        self, domain: Domain, bucket: int, cutoff_ms: int | None, scope: Scope = EVERYTHING
    ) -> list[bytes]:
        _full(scope)
        _no_cutoff(cutoff_ms)
        if domain is not Domain.MESSAGES:
            return []
        extra = self.extra_index.get(bucket)
        shared = self.shared.bucket(bucket)
        return sorted(shared + extra) if extra else list(shared)

    def ids_in_range(
        self,
        domain: Domain,
        start: int,
        end: int,
        cutoff_ms: int | None,
        scope: Scope = EVERYTHING,
    ) -> bytes:
        _full(scope)
        _no_cutoff(cutoff_ms)
        if domain is not Domain.MESSAGES:
            return b""
        if self._extra_sorted is None:
            self._extra_sorted = sorted(self.extras)  # sorted ids are sorted by bucket
        extras = self._extra_sorted
        lo = bisect.bisect_left(extras, start.to_bytes(2, "big"))
        hi = (
            len(extras)
            if end >= NUM_BUCKETS
            else bisect.bisect_left(extras, end.to_bytes(2, "big"))
        )
        return b"".join([self.shared.range_blob(start, end), *extras[lo:hi]])

    def ids_in_runs(
        self,
        domain: Domain,
        runs: Sequence[tuple[int, int]],
        cutoff_ms: int | None,
        scope: Scope = EVERYTHING,
    ) -> bytes:
        return ids_run_by_run(self.ids_in_range, domain, runs, cutoff_ms, scope)

    def get_records(
        self,
        domain: Domain,
        ids: list[bytes],
        cutoff_ms: int | None,
        settled_ms: int | None = None,
        scope: Scope = EVERYTHING,
    ) -> list[bytes | None]:
        _full(scope)
        _no_cutoff(cutoff_ms)
        _no_cutoff(settled_ms)
        out: list[bytes | None] = []
        for record_id in ids:
            msg = self.extras.get(record_id) if domain is Domain.MESSAGES else None
            if msg is not None:
                out.append(msg.encoded)
                continue
            if domain is Domain.MESSAGES and record_id in self.shared:
                self.base_requests += 1
            else:
                self.unknown_requests += 1
            out.append(None)
        return out

    def apply(self, domain: Domain, records: list[Record]) -> int:
        if domain is not Domain.MESSAGES:
            raise AssertionError(f"records arrived for {domain.name}, whose trees are equal")
        return sum(self.add(r) for r in records if isinstance(r, MsgV1))


OTHER_DOMAIN_IDS = 1_000  # ids each replica holds in each of the other three domains
_OTHER_TREES: dict[Domain, MerkleTree] = {}


def _other_trees() -> dict[Domain, MerkleTree]:
    """The trees of members, identity, deletes and the member index (a full node indexes
    every member op: the members' ids) every bench replica starts from."""
    if not _OTHER_TREES:
        rng = random.Random("bench-sync:other-domains")
        for domain in (Domain.MEMBERS, Domain.IDENTITY, Domain.DELETES):
            ids = [rng.randbytes(RECORD_ID_LEN) for _ in range(OTHER_DOMAIN_IDS)]
            _OTHER_TREES[domain] = MerkleTree.from_ids(ids)
        _OTHER_TREES[Domain.INDEX] = _OTHER_TREES[Domain.MEMBERS].copy()
    return _OTHER_TREES


def _full(scope: Scope) -> None:
    if not scope.is_full:
        raise ScopeNotServed("the benchmark's replicas hold every chat only")


def _no_cutoff(cutoff_ms: int | None) -> None:
    if cutoff_ms is not None:
        raise ValueError("BenchReplica models no retention: cutoff_ms must be None")


# --- the differing records -------------------------------------------------------------------


def make_pools(
    count: int, seed: int, advance: Callable[[int], None] = lambda n: None
) -> dict[str, list[MsgV1]]:
    """``count`` signed messages per placement: scattered over the range, or newest after it."""
    rng = random.Random(f"{seed}:pool")
    keys = [key_from_seed(blake3_id(b"bench-sync-user", bytes([i]))) for i in range(AUTHORS)]
    chats = [blake3_id(b"bench-sync-chat", bytes([i])) for i in range(CHATS)]
    pools: dict[str, list[MsgV1]] = {p: [] for p in PLACEMENTS}
    for placement in PLACEMENTS:
        for i in range(count):
            ms = VIRTUAL_EPOCH_MS + (
                rng.randrange(SPAN_MS) if placement == "scattered" else SPAN_MS + i
            )
            msg = MsgV1.create(rng.choice(keys), rng.choice(chats), Hlc(ms), rng.randbytes(PAYLOAD))
            _ = msg.msg_id  # hash now, not inside a timed session
            pools[placement].append(msg)
            if i % 500 == 499 or i == count - 1:
                advance(i % 500 + 1)
    return pools


# --- one case --------------------------------------------------------------------------------


def run_case(
    base: Base,
    pool: Sequence[MsgV1],
    d: int,
    placement: str,
    width: int,
    seed: int,
    protocol: str = "sketch",
) -> dict[str, Any]:
    """Two replicas sharing n - d ids, the d differing records split at random; sync twice.
    ``protocol``: "sketch" (this protocol) or "cells" (the per-leaf cells and id lists it
    replaces: ``SyncConfig(sketch=False)``)."""
    n = len(base.ids)
    if d > n:
        raise ValueError(f"d = {d} differences need n >= d, got n = {n}")
    shared = SharedIds(base, n - d)
    tree = shared.tree()
    a, b = BenchReplica(shared, tree), BenchReplica(shared, tree.copy())
    rng = random.Random(f"{seed}:split:{n}:{d}:{placement}")
    for msg in pool[:d]:
        (a if rng.random() < 0.5 else b).add(msg)
    only_a, only_b = len(a.extras), len(b.extras)
    differing = differing_nodes(a.tree(Domain.MESSAGES), b.tree(Domain.MESSAGES))
    config = SyncConfig(hash_width=width, sketch=protocol == "sketch")
    salt = f"bench-sync:{seed}".encode()

    gc.collect()  # earlier cases' garbage: a full collection inside the session cost it ~100 ms
    start, cpu = perf_counter(), process_time()
    first = run_session(a, b, config=config, salt_seed=salt)
    wall, cpu = perf_counter() - start, process_time() - cpu
    second = run_session(a, b, config=config, salt_seed=salt + b":again")

    ini, resp = first.initiator.stats, first.responder.stats
    recon = ini.reconciliation_bytes()
    total = _total_bytes(first)
    if resp.reconciliation_bytes() != recon or _total_bytes(first, responder=True) != total:
        raise AssertionError("the two sides count the session's bytes differently")
    shipped = ini.records_sent + resp.records_sent
    applied = ini.records_applied + resp.records_applied
    roots_equal = all(a.tree(dom).root() == b.tree(dom).root() for dom in Domain)
    counts = [r.tree(Domain.MESSAGES).count for r in (a, b)]
    naive = (n - d + only_a) * RECORD_ID_LEN + d * RECORD_ID_LEN
    second_bytes = _total_bytes(second)
    second_rt = second.initiator.stats.round_trips
    case: dict[str, Any] = {
        "n": n,
        "d": d,
        "placement": placement,
        "protocol": protocol,
        "hash_width": width,
        "only_initiator": only_a,
        "only_responder": only_b,
        "floor_bytes": d * RECORD_ID_LEN,
        "reconciliation_bytes": recon,
        "floor_ratio": recon / (d * RECORD_ID_LEN) if d else None,
        "total_bytes": total,
        "bytes_by_kind": {k: ini.bytes_sent[k] + ini.bytes_received[k] for k in KINDS},
        "initiator_sent": dict(ini.bytes_sent),
        "responder_sent": dict(resp.bytes_sent),
        "differing_nodes": differing,
        "collision_chance_per_pass": collision_chance(sum(differing.values()), width),
        "round_trips": ini.round_trips,
        "round_trips_before_fetch": ini.round_trips_before_fetch,
        "passes": ini.passes,
        "frames": first.frames,
        "wall_s": wall,
        "cpu_s": cpu,  # both sides: the loopback runs them in this one process
        "records_shipped": shipped,
        "records_applied": applied,
        "unneeded_shipped": shipped - applied,
        "base_id_requests": a.base_requests + b.base_requests,
        "unknown_id_requests": a.unknown_requests + b.unknown_requests,
        "converged": first.converged,
        "roots_equal": roots_equal,
        "counts": counts,
        "second": {
            "bytes": second_bytes,
            "round_trips": second_rt,
            "frames": second.frames,
            "converged": second.converged,
            "records_shipped": second.initiator.stats.records_sent
            + second.responder.stats.records_sent,
        },
        "naive_bytes": naive,
        "naive_ratio": recon / naive if naive else None,
    }
    case["failures"] = _failures(case)
    return case


PAIRED_MAX_D = 10_000  # above, a session takes seconds and its CPU ratio is steady


def paired_cpu(
    base: Base, pool: Sequence[MsgV1], d: int, width: int, seed: int, pairs: int
) -> dict[str, Any]:
    """Sketch/cells CPU of one scattered case over ``pairs`` alternating pairs of sessions
    in this process: the median ratio and its range, and each protocol's median ms."""
    ratios: list[float] = []
    ms: dict[str, list[float]] = {"sketch": [], "cells": []}
    for k in range(pairs):
        cpu = {}
        for protocol in ("sketch", "cells") if k % 2 == 0 else ("cells", "sketch"):
            cpu[protocol] = run_case(base, pool, d, "scattered", width, seed, protocol)["cpu_s"]
            ms[protocol].append(cpu[protocol] * 1000)
        ratios.append(cpu["sketch"] / cpu["cells"] if cpu["cells"] else 1.0)
    return {
        "pairs": pairs,
        "median": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
        "sketch_ms": statistics.median(ms["sketch"]),
        "cells_ms": statistics.median(ms["cells"]),
    }


def negentropy_case(
    base: Base, pool: Sequence[MsgV1], d: int, placement: str, seed: int
) -> dict[str, Any]:
    """The same two sets as ``run_case`` (the same split), reconciled by negentropy."""
    n = len(base.ids)
    # seconds, as Nostr's created_at (the reference code's varints break above 2^32)
    epoch, span = VIRTUAL_EPOCH_MS // 1000, SPAN_MS // 1000
    shared = [(epoch + int.from_bytes(i[:6], "big") % span, i) for i in base.ids[: n - d]]
    rng = random.Random(f"{seed}:split:{n}:{d}:{placement}")
    only: tuple[list[tuple[int, bytes]], list[tuple[int, bytes]]] = ([], [])
    for msg in pool[:d]:
        only[0 if rng.random() < 0.5 else 1].append((msg.hlc.physical_ms // 1000, msg.msg_id))
    common = negentropy_peer.item_blob(shared)
    result = negentropy_peer.reconcile(
        common + negentropy_peer.item_blob(only[0]), common + negentropy_peer.item_blob(only[1])
    )
    if result["have"] + result["need"] != d:
        raise AssertionError(f"negentropy found {result['have']} + {result['need']} for d = {d}")
    return result


def differing_nodes(a: MerkleTree, b: MerkleTree) -> dict[str, int]:
    """Nodes whose sets differ at each depth the descent compares: each is one hash comparison."""
    return {
        f"depth_{depth}": sum(a.node(depth, i) != b.node(depth, i) for i in range(FANOUT**depth))
        for depth in range(TOP_DEPTH, DEPTH + 1)
    }


def collision_chance(differing: int, width: int) -> float:
    """Chance that some differing node's truncated hash matches anyway (hiding it for one pass)."""
    return -math.expm1(differing * math.log1p(-(2.0 ** (-8 * width))))


def _total_bytes(result: LoopbackResult, *, responder: bool = False) -> int:
    stats = (result.responder if responder else result.initiator).stats
    return sum(stats.bytes_sent.values()) + sum(stats.bytes_received.values())


def _failures(c: dict[str, Any]) -> list[str]:
    """Correctness, not speed: what a correct session must do whatever the timings."""
    out = []
    if c["records_shipped"] != c["d"]:
        out.append(f"shipped {c['records_shipped']} records for d = {c['d']}")
    if c["unneeded_shipped"]:
        out.append(f"{c['unneeded_shipped']} records shipped that changed nothing")
    if c["base_id_requests"]:
        out.append(f"{c['base_id_requests']} requests for ids both sides held")
    if c["unknown_id_requests"]:
        out.append(f"{c['unknown_id_requests']} requests for ids the replica never held")
    if not c["converged"] or not c["roots_equal"]:
        out.append(f"not converged (converged={c['converged']}, roots_equal={c['roots_equal']})")
    if c["counts"] != [c["n"], c["n"]]:
        out.append(f"record counts {c['counts']} != n = {c['n']}")
    s = c["second"]
    if s["bytes"] > EQUAL_MAX_BYTES or s["round_trips"] != 1 or not s["converged"]:
        out.append(f"second session: {s['bytes']} B, {s['round_trips']} round trips")
    if s["records_shipped"]:
        out.append(f"second session shipped {s['records_shipped']} records")
    return out


# --- tree rebuild vs incremental -------------------------------------------------------------


def measure_rebuild(
    ids: list[bytes], rebuilt: MerkleTree | None, rebuild_s: float | None, progress: Progress
) -> dict[str, Any]:
    """``from_ids`` over every id at once, against one ``insert`` per id into an empty tree."""
    if rebuilt is None or rebuild_s is None:
        start = perf_counter()
        rebuilt = MerkleTree.from_ids(ids)
        rebuild_s = perf_counter() - start
    task = progress.add_task(f"incremental insert, {len(ids):,} ids", total=len(ids))
    tree = MerkleTree()
    insert = tree.insert
    elapsed = 0.0
    step = 50_000
    for at in range(0, len(ids), step):
        part = ids[at : at + step]
        start = perf_counter()
        for record_id in part:
            insert(record_id)
        elapsed += perf_counter() - start
        progress.advance(task, len(part))
    return {
        "ids": len(ids),
        "rebuild_s": rebuild_s,
        "rebuild_us_per_id": rebuild_s / len(ids) * 1e6,
        "incremental_s": elapsed,
        "insert_us_per_id": elapsed / len(ids) * 1e6,
        "incremental_equals_rebuilt": tree == rebuilt and tree.root() == rebuilt.root(),
    }


# --- entry point -----------------------------------------------------------------------------


def run_sync_bench(params: SyncBenchParams, console: Console | None = None) -> dict[str, Any]:
    """Run every case, print the tables, save and return the JSON document."""
    console = console or bench_console(log_width=200)
    sizes, diffs = sorted(set(params.sizes)), sorted(set(params.diffs))
    wn = params.anchor_n if params.anchor_n in sizes else max(sizes)
    wd = params.anchor_d if params.anchor_d in diffs else max(d for d in diffs if d <= wn)
    widths = sorted(set(params.compare_widths) - {params.hash_width})
    plan = [(n, d, p) for n in sizes for d in diffs if d <= n for p in PLACEMENTS]
    skipped = [(n, d) for n in sizes for d in diffs if d > n]
    load_before = loadavg()
    cases: list[dict[str, Any]] = []
    baseline: list[dict[str, Any]] = []  # the same cases with the cells protocol
    negentropy: dict[tuple[int, int, str], dict[str, Any]] = {}
    with_negentropy = params.negentropy and negentropy_peer.available()
    width_cases: list[dict[str, Any]] = []
    bases: dict[int, dict[str, float]] = {}
    rebuild: dict[str, Any] | None = None
    started = perf_counter()
    with bench_progress(console, label_width=38) as progress:
        pool_size = max(diffs)
        sign = progress.add_task("signing differing records", total=2 * pool_size)
        pools = make_pools(pool_size, params.seed, lambda k: progress.advance(sign, k))
        run = progress.add_task("sync sessions", total=2 * len(plan) + len(widths))
        for n in sizes:
            build = progress.add_task(f"base n={n:,}: ids", total=3)

            def step(what: str, build: Any = build, n: int = n) -> None:
                progress.update(build, advance=1, description=f"base n={n:,}: {what}")

            base = build_base(n, params.seed, step)
            bases[n] = base.build_s
            gc.collect()
            gc.freeze()  # the base is immortal: keep it out of the timed collections
            try:
                for d in diffs:
                    if d > n:
                        continue
                    for placement in PLACEMENTS:
                        for protocol, into in (("sketch", cases), ("cells", baseline)):
                            progress.update(
                                run, description=f"{protocol} n={n:,} d={d:,} {placement}"
                            )
                            into.append(
                                run_case(
                                    base, pools[placement], d, placement, params.hash_width,
                                    params.seed, protocol,
                                )
                            )  # fmt: skip
                            progress.advance(run)
                        if n == GOAL_N and placement == "scattered" and d <= PAIRED_MAX_D:
                            progress.update(run, description=f"CPU pairs n={n:,} d={d:,}")
                            cases[-1]["cpu_pairs"] = paired_cpu(
                                base, pools[placement], d, params.hash_width, params.seed,
                                params.cpu_pairs,
                            )  # fmt: skip
                        if with_negentropy:
                            progress.update(
                                run, description=f"negentropy n={n:,} d={d:,} {placement}"
                            )
                            negentropy[(n, d, placement)] = negentropy_case(
                                base, pools[placement], d, placement, params.seed
                            )
                if n == wn:
                    for width in widths:
                        progress.update(run, description=f"sync n={n:,} d={wd:,} width {width}")
                        width_cases.append(
                            run_case(base, pools["scattered"], wd, "scattered", width, params.seed)
                        )
                        progress.advance(run)
                if n == params.rebuild_ids:
                    rebuild = measure_rebuild(base.ids, base.tree, base.build_s["tree_s"], progress)
            finally:
                gc.unfreeze()
            del base
            gc.collect()
        if rebuild is None:
            ids = make_base_ids(params.rebuild_ids, params.seed)
            rebuild = measure_rebuild(ids, None, None, progress)
    main_width = next(c for c in cases if (c["n"], c["d"], c["placement"]) == (wn, wd, "scattered"))
    width_cases = sorted([*width_cases, main_width], key=lambda c: c["hash_width"])
    report = _report(
        params, cases, width_cases, rebuild, bases, skipped, load_before, perf_counter() - started
    )
    report["baseline"] = baseline
    report["negentropy"] = [
        {"n": n, "d": d, "placement": p, **r} for (n, d, p), r in negentropy.items()
    ]
    report["side_by_side"] = side_by_side(cases, baseline, negentropy)
    report["goals"] = goals(report["side_by_side"])
    # the cells path's own limits (it does not converge in one session at d = 10^5): shown,
    # not failures of this protocol
    report["baseline_failures"] = [
        {"n": c["n"], "d": c["d"], "placement": c["placement"], "protocol": "cells", "what": f}
        for c in baseline
        for f in c["failures"]
    ]
    _print(console, report)
    save_report(console, report, params.out)
    return report


# --- report ----------------------------------------------------------------------------------


def _targets(params: SyncBenchParams, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    anchor = [c for c in cases if (c["n"], c["d"]) == (params.anchor_n, params.anchor_d)]
    for c in anchor:
        out.append(
            {
                "target": f"<= {FLOOR_TARGET:g}x floor at n={c['n']:,}, d={c['d']:,} "
                f"({c['placement']})",
                "value": f"{c['floor_ratio']:.2f}x ({c['reconciliation_bytes']:,} B)",
                "met": c["floor_ratio"] <= FLOOR_TARGET,
            }
        )
    if not anchor:
        out.append(
            {
                "target": f"<= {FLOOR_TARGET:g}x floor at n={params.anchor_n:,}, "
                f"d={params.anchor_d:,}",
                "value": "not run",
                "met": None,
            }
        )
    equal = [c for c in cases if c["d"] == 0]
    if equal:
        worst_b = max(c["total_bytes"] for c in equal)
        worst_rt = max(c["round_trips"] for c in equal)
        out.append(
            {
                "target": f"d=0: <= {EQUAL_MAX_BYTES} B and {EQUAL_MAX_ROUND_TRIPS} round trip "
                f"(every n)",
                "value": f"max {worst_b} B, max {worst_rt} round trip(s)",
                "met": worst_b <= EQUAL_MAX_BYTES and worst_rt <= EQUAL_MAX_ROUND_TRIPS,
            }
        )
    differ = [c for c in cases if c["d"] > 0]
    if differ:
        worst = max(c["round_trips_before_fetch"] or 0 for c in differ)
        never = [c for c in differ if c["round_trips_before_fetch"] is None]
        out.append(
            {
                "target": f"<= {FETCH_MAX_ROUND_TRIPS} round trips before fetching starts "
                f"(every d > 0)",
                "value": f"max {worst}" + (f", {len(never)} never fetched" if never else ""),
                "met": worst <= FETCH_MAX_ROUND_TRIPS and not never,
            }
        )
    return out


def _report(
    params: SyncBenchParams,
    cases: list[dict[str, Any]],
    width_cases: list[dict[str, Any]],
    rebuild: dict[str, Any],
    bases: dict[int, dict[str, float]],
    skipped: list[tuple[int, int]],
    load_before: list[float] | None,
    elapsed: float,
) -> dict[str, Any]:
    failures = [
        {"n": c["n"], "d": c["d"], "placement": c["placement"], "width": c["hash_width"], "what": f}
        for c in [*cases, *(w for w in width_cases if w["hash_width"] != params.hash_width)]
        for f in c["failures"]
    ]
    if not rebuild["incremental_equals_rebuilt"]:
        failures.append({"what": "incrementally built tree differs from the rebuilt one"})
    return {
        "benchmark": "sync",
        "params": {**asdict(params), "out": str(params.out)},
        "machine": machine_info(load_before),
        "elapsed_s": elapsed,
        "cases": cases,
        "skipped": [{"n": n, "d": d, "why": "d > n"} for n, d in skipped],
        "hash_widths": width_cases,
        "rebuild": rebuild,
        "base_build_s": {str(n): t for n, t in bases.items()},
        "anchors": [
            {"system": s, "mechanism": m, "floor_ratio": r, "round_trips": rt}
            for s, m, r, rt in ANCHORS
        ],
        "targets": _targets(params, cases),
        "failures": failures,
        "notes": __doc__,
    }


# --- printing --------------------------------------------------------------------------------


def _print(console: Console, report: dict[str, Any]) -> None:
    p = report["params"]
    cases = report["cases"]
    console.print(_traffic_table(cases, f"hash width {p['hash_width']}, seed {p['seed']}"))
    console.print(_correctness_table(cases))
    console.print(_width_table(report["hash_widths"], p["hash_width"]))
    _print_anchors(console, report)
    _print_targets(console, report["targets"])
    if report.get("side_by_side"):
        console.print(side_by_side_table(report["side_by_side"]))
        console.print(goals_table(report["goals"]))
    for f in report.get("baseline_failures", []):
        console.print(f"  cells path (the baseline), not a failure of this protocol: {f}")
    _print_rebuild(console, report)
    if report["skipped"]:
        console.print(
            "skipped (d > n): " + ", ".join(f"n={s['n']:,} d={s['d']:,}" for s in report["skipped"])
        )
    if report["failures"]:
        console.print(f"[red bold]{len(report['failures'])} correctness failure(s):[/]")
        for f in report["failures"]:
            console.print(f"  [red]{f}[/]")
    else:
        console.print("[green]correctness: every case shipped exactly d records, nothing twice, "
                      "no shared id requested, roots equal, second session minimal[/]")  # fmt: skip
    m = report["machine"]
    console.print(
        f"{m['cpu_count']} CPUs, Python {m['python']}, load {m['loadavg_before']} -> "
        f"{m['loadavg_after']}, whole run {report['elapsed_s']:.0f} s"
    )


def _traffic_table(cases: list[dict[str, Any]], what: str) -> Table:
    table = Table(
        title=f"chatsync bench sync — one session, {what}; bytes are both directions",
        caption="recon = tree + ids + control (record bodies excluded); floor = d x 32 B; "
        "naive = all ids one way + the d differing ids back",
    )
    for col in (
        "n", "d", "placement", "recon", "x floor", "tree", "ids", "control", "bodies",
        "total", "RT", "RT→fetch", "ms", "naive", "recon/naive",
    ):  # fmt: skip
        table.add_column(col, justify="left" if col == "placement" else "right", no_wrap=True)
    for c in cases:
        k = c["bytes_by_kind"]
        table.add_row(
            _n(c["n"]),
            f"{c['d']:,}",
            c["placement"],
            byte_size(c["reconciliation_bytes"]),
            "—" if c["floor_ratio"] is None else f"{c['floor_ratio']:.2f}x",
            byte_size(k["tree"]),
            byte_size(k["ids"]),
            byte_size(k["control"]),
            byte_size(k["records"]),
            byte_size(c["total_bytes"]),
            str(c["round_trips"]),
            "—" if c["round_trips_before_fetch"] is None else str(c["round_trips_before_fetch"]),
            f"{c['wall_s'] * 1000:,.0f}",
            byte_size(c["naive_bytes"]),
            f"{c['naive_ratio']:.4f}",
        )
    return table


def _correctness_table(cases: list[dict[str, Any]]) -> Table:
    table = Table(title="correctness per case (must hold whatever the timings)")
    for col in (
        "n", "d", "placement", "I has / R has", "passes", "frames", "shipped", "unneeded",
        "shared-id asks", "roots equal", "2nd session", "ok",
    ):  # fmt: skip
        table.add_column(col, justify="left" if col == "placement" else "right", no_wrap=True)
    for c in cases:
        s = c["second"]
        table.add_row(
            _n(c["n"]),
            f"{c['d']:,}",
            c["placement"],
            f"{c['only_initiator']:,} / {c['only_responder']:,}",
            str(c["passes"]),
            str(c["frames"]),
            red_unless(f"{c['records_shipped']:,}", c["records_shipped"] == c["d"]),
            red_unless(str(c["unneeded_shipped"]), c["unneeded_shipped"] == 0),
            red_unless(
                str(c["base_id_requests"] + c["unknown_id_requests"]),
                not c["base_id_requests"] and not c["unknown_id_requests"],
            ),
            red_unless("yes" if c["roots_equal"] else "no", c["roots_equal"]),
            red_unless(
                f"{s['bytes']} B, {s['round_trips']} RT",
                s["bytes"] <= EQUAL_MAX_BYTES and s["round_trips"] == 1,
            ),
            check_mark(not c["failures"]),
        )
    return table


def _width_table(cases: list[dict[str, Any]], chosen: int) -> Table:
    c0 = cases[0]
    table = Table(
        title=f"hash width at n={c0['n']:,}, d={c0['d']:,}, scattered (chosen: {chosen} B)",
        caption="P(collision)/pass = 1 - (1 - 2^-8w)^(differing nodes): a collision hides a "
        "differing subtree for one pass (one more pass), never a divergence",
    )
    for col in (
        "width", "recon", "x floor", "tree", "ids", "control", "RT", "RT→fetch", "passes",
        "ms", "differing nodes", "P(collision)/pass", "ok",
    ):  # fmt: skip
        table.add_column(col, justify="right", no_wrap=True)
    for c in cases:
        k = c["bytes_by_kind"]
        table.add_row(
            f"{c['hash_width']} B" + (" *" if c["hash_width"] == chosen else ""),
            byte_size(c["reconciliation_bytes"]),
            "—" if c["floor_ratio"] is None else f"{c['floor_ratio']:.2f}x",
            byte_size(k["tree"]),
            byte_size(k["ids"]),
            byte_size(k["control"]),
            str(c["round_trips"]),
            "—" if c["round_trips_before_fetch"] is None else str(c["round_trips_before_fetch"]),
            str(c["passes"]),
            f"{c['wall_s'] * 1000:,.0f}",
            f"{sum(c['differing_nodes'].values()):,}",
            f"{c['collision_chance_per_pass']:.1e}",
            check_mark(not c["failures"]),
        )
    return table


def _print_anchors(console: Console, report: dict[str, Any]) -> None:
    p = report["params"]
    n, d = p["anchor_n"], p["anchor_d"]
    table = Table(title=f"anchors at n={n:,}, d={d:,} (sync-anchors.md) beside this run")
    for col in ("system", "mechanism", "x floor", "round trips"):
        table.add_column(col, justify="left" if col in ("system", "mechanism") else "right")
    for system, mechanism, ratio, rt in ANCHORS:
        table.add_row(system, mechanism, ratio, rt)
    ours = [c for c in report["cases"] if (c["n"], c["d"]) == (n, d)]
    for c in ours:
        table.add_row(
            f"[bold]chatsync, {c['placement']}[/]",
            f"measured: {p['hash_width']} B salted depth-2 hashes, an IBLT of salted short ids (sized by the estimate)",
            f"[bold]{c['floor_ratio']:.2f}x ({byte_size(c['reconciliation_bytes'])})[/]",
            f"[bold]{c['round_trips']} ({c['round_trips_before_fetch']} to fetch)[/]",
        )
        table.add_row(
            f"naive id exchange, {c['placement']}",
            "all ids one way, the differing ids back",
            f"{c['naive_bytes'] / c['floor_bytes']:.0f}x ({byte_size(c['naive_bytes'])})",
            "1",
        )
    if not ours:
        table.add_row("chatsync", "not run at this size (see --sizes / --diffs)", "—", "—")
    console.print(table)


def _print_targets(console: Console, targets: list[dict[str, Any]]) -> None:
    table = Table(title="targets (the issue)")
    for col in ("target", "measured", "met"):
        table.add_column(col)
    for t in targets:
        met = "—" if t["met"] is None else ("[green]met[/]" if t["met"] else "[red]missed[/]")
        table.add_row(t["target"], t["value"], met)
    console.print(table)


def _print_rebuild(console: Console, report: dict[str, Any]) -> None:
    r = report["rebuild"]
    same = "[green]✓ equal[/]" if r["incremental_equals_rebuilt"] else "[red]✗ DIFFERENT[/]"
    console.print(
        f"MerkleTree.from_ids({r['ids']:,} ids): {r['rebuild_s']:.2f} s "
        f"({r['rebuild_us_per_id']:.2f} µs/id); incremental insert: "
        f"{r['insert_us_per_id']:.2f} µs/id ({r['incremental_s']:.2f} s in all); "
        f"incremental tree == rebuilt tree: {same}"
    )
    builds = ", ".join(
        f"n={int(n):,}: ids {t['ids_s']:.2f} s, tree {t['tree_s']:.2f} s, "
        f"index {t['index_s']:.2f} s"
        for n, t in report["base_build_s"].items()
    )
    console.print(f"shared base builds (once per n, not timed per case): {builds}")


def _n(n: int) -> str:
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n:,}"


__all__ = [
    "BenchReplica",
    "SyncBenchParams",
    "run_case",
    "run_sync_bench",
]
