"""``chatsync bench gossip``: sustained ops/s and propagation latency over N real node processes.

One run, five measurements, side by side, and issue 18's goals judged on them
(``bench.gossip_goals``):

batched    a ``Cluster`` of N ``chatsync node run`` processes (loopback, node defaults); a
           load generator offers ``rate`` ops/s for ``seconds``: every ``tick_ms`` one HTTP
           POST /ops per node carries that node's share of the tick (a late poster merges
           the ticks it owes into one POST, so the offered rate holds while it can).
unbatched  the same load on a fresh cluster whose nodes publish one op per gossip message
           as soon as it comes (``gossip_batch_ops = 1``, ``gossip_min_interval_ms = 0``):
           the ratio batched / unbatched is what batching buys.
capacity   on the batched cluster after its load: the rate steps up (1,000, 1,500, ... ops/s,
           a few seconds each) until p99 >= 1 s or an op is not everywhere in time; the
           highest rate that held, and ops/s per node core there (``bench.gossip_capacity``).
catch-up   on the batched cluster: one node is stopped (SIGTERM), ``catchup`` messages
           (1,000,000 by default) are posted to the others, the node is restarted; timed from
           its spawn until its messages root equals the others' (anti-entropy: a node that was
           down gets no gossip). Then every node's RSS (/proc VmRSS), each holding them all.
floor      ``bench.transport_floor``: N bare py-libp2p peers publish the batched run's
           bytes (same ops per message), accepting everything unread, and ``validate_op`` is
           timed on the same ops: the CPU any node on this stack spends per op, beside the
           node's own (``--no-floor`` skips it).

Every message is signed before the clock starts (``MsgV1.create``, ~50 µs each, not timed)
with a distinct HLC — the tick's scheduled wall time and a counter — so each op can be
followed: the generator notes when it POSTed each op and when the origin acknowledged it;
every node logs when gossip, or anti-entropy, delivered each new op
(``GET /debug/latency?arrivals=1``). Before each load every author is added to every chat
(a group each: ``authors x chats`` signed member ops, posted to one node and awaited on all,
not timed): a node stores a message only once it holds the add of its sender.

Definitions (all on one machine, one wall clock):
  latency (end to end)  per op: from the start of the POST that offered it to its origin
                        until the last node stored it — what Maelstrom's broadcast measures;
  latency (propagation) per op: from the origin's HTTP ack until the last node stored it;
                        a node stores an op when the first of gossip and anti-entropy
                        brings it; an op some node logged no arrival for (its log holds
                        the newest 100,000) counts as infinitely late (a miss) in both;
  delivered ops/s       slope of min over nodes of the message count (``/status``, sampled
                        every 0.25 s) over the load window after a warm-up: ops reaching
                        ALL nodes per second, sustained;
  via gossip / sync     ``gossip_ops_applied`` vs ``sync_records_applied`` (``/metrics``).
Node CPU is read from /proc for each node process: on a 2-core machine the nodes and the
generator share the cores, and that is what the figures are.
"""

from __future__ import annotations

import base64
import math
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import Progress

from bench.console import bench_console, bench_progress, save_report, tracked
from bench.gossip_capacity import CapacityParams, run_capacity
from bench.gossip_report import build_report, print_report
from bench.machine import (
    child_pids,
    loadavg,
    machine_busy_s,
    process_cpu_s,
    rss_kib,
    rss_kib_or_zero,
)
from bench.poster import Poster
from bench.prometheus import metric
from bench.quantiles import quantile
from bench.store_floor import store_us_per_op
from bench.transport_floor import FloorParams, run_transport_floor
from cluster.local import Cluster, NodeProcess
from node.config import NodeConfig
from node.verify import WORKER_MODULE
from store import Hlc, MsgV1
from store.authz import new_group
from store.ops import MembershipAction, MembershipOp, Op
from store.signing import key_from_seed, public_key, user_id_from_key

MAX_OPS_PER_POST = 1000  # the API takes at most 1,024 ops per request
STATUS_EVERY_S = 0.25
STORE_FLOOR_OPS = 40_000  # ops stored to measure what storing one costs (bench.store_floor)


@dataclass(frozen=True)
class GossipBenchParams:
    nodes: int = 5
    rate: int = 2000  # offered ops/s, all nodes together
    seconds: float = 20.0
    catchup: int = 1_000_000  # messages the stopped node misses (0: skip the catch-up)
    unbatched: bool = True  # also run the load with one op per gossip message
    floor: bool = True  # also measure bare py-libp2p and ed25519 at this load (transport_floor)
    # step the rate on the batched cluster until p99 >= 1 s (gossip_capacity; None: skip)
    capacity: CapacityParams | None = field(default_factory=CapacityParams)
    tick_ms: int = 50  # one POST per node per tick
    payload: int = 200
    chats: int = 100
    authors: int = 16
    sync_interval_s: float = 10.0  # anti-entropy per peer (the node default)
    warmup_s: float = 2.0  # excluded from the delivered-rate slope
    drain_timeout_s: float = 90.0  # after the load: how long to wait for every op everywhere
    catchup_timeout_s: float = 300.0
    out: Path = Path("bench-results/gossip.json")
    data: Path | None = None  # None: a temporary directory, removed afterwards
    # later nodes bootstrap from the first this many (the rest they find by peer exchange);
    # None: each from every node before it
    bootstrap_nodes: int | None = None
    idle_s: float = 0.0  # measure the idle nodes' CPU this long before the load (0: skip)


# --- signed ops ----------------------------------------------------------------------------


class Signer:
    """Authors and group chats with deterministic keys; ops as pre-encoded JSON fragments.

    Every author is a member of every chat: ``joins`` are the adds (signed by each chat's
    creator), stamped when the ``Signer`` is made — before every message it signs. A node
    stores a message only once it holds the add of its sender: the bench posts them first.
    """

    def __init__(self, authors: int, chats: int, payload: int) -> None:
        self.keys = [key_from_seed(bytes([0x60 + i % 64, i // 64]) * 16) for i in range(authors)]
        creators = [self.keys[c % authors] for c in range(chats)]
        groups = [
            new_group(creator, bytes([0xB0, c % 256, c // 256]) + bytes(13))
            for c, creator in enumerate(creators)
        ]
        self.chats = [group.chat_id() for group in groups]
        self.payload = payload
        joined = Hlc(int(time.time() * 1000))
        users = [user_id_from_key(public_key(k)) for k in self.keys]
        self.joins: list[Op] = [
            MembershipOp.create(creator, group.chat_id(), user, MembershipAction.ADD, joined,
                                proof=group)
            for creator, group in zip(creators, groups, strict=True)
            for user in users
        ]  # fmt: skip

    def sign(self, n: int, hlc: Hlc) -> MsgV1:
        filler = b"%010d" % n
        body = (filler * (self.payload // len(filler) + 1))[: self.payload]
        return MsgV1.create(
            self.keys[n % len(self.keys)], self.chats[n % len(self.chats)], hlc, body
        )


def json_fragment(msg: MsgV1) -> str:
    data = base64.urlsafe_b64encode(msg.encoded).decode()
    return '{"kind":1,"data":"' + data + '"}'


@dataclass
class Plan:
    """Who posts what when: per op its origin node, tick, HLC key and JSON fragment."""

    t0_ms: int  # wall ms of tick 0
    tick_ms: int
    ticks: int
    origin: list[int]
    tick: list[int]
    key: list[int]  # packed HLC: the op's identity in the nodes' arrival logs
    fragment: list[str]
    by_node: list[list[list[int]]]  # node -> tick -> op indexes
    post_ms: list[float] = field(default_factory=list)  # when its POST started (wall ms)
    ack_ms: list[float] = field(default_factory=list)  # when the origin acknowledged it

    @property
    def size(self) -> int:
        return len(self.origin)


def make_plan(signer: Signer, params: GossipBenchParams, lead_s: float = 1.0) -> Plan:
    """Sign ``rate x seconds`` ops stamped with their tick's scheduled wall time."""
    tick_s = params.tick_ms / 1000
    ticks = max(1, math.ceil(params.seconds / tick_s))
    total = round(params.rate * ticks * tick_s)
    per_op_s = _signing_cost(signer)
    t0_ms = int((time.time() + lead_s + total * per_op_s * 1.5) * 1000)
    plan = Plan(t0_ms, params.tick_ms, ticks, [], [], [], [], [[] for _ in range(params.nodes)])
    for node_ticks in plan.by_node:
        node_ticks.extend([] for _ in range(ticks))
    n = 0
    for k in range(ticks):
        due = round(params.rate * (k + 1) * tick_s)
        for logical in range(due - n):
            msg = signer.sign(n, Hlc(t0_ms + k * params.tick_ms, logical))
            origin = n % params.nodes
            plan.origin.append(origin)
            plan.tick.append(k)
            plan.key.append(msg.hlc.pack())
            plan.fragment.append(json_fragment(msg))
            plan.by_node[origin][k].append(n)
            n += 1
    plan.post_ms = [math.nan] * n
    plan.ack_ms = [math.nan] * n
    return plan


def _signing_cost(signer: Signer) -> float:
    t = time.perf_counter()
    for i in range(200):
        signer.sign(i, Hlc(1, i))
    return (time.perf_counter() - t) / 200


# --- talking to the nodes ------------------------------------------------------------------


def post_plan(plan: Plan, node: int, url: str, stats: dict[str, Any]) -> None:
    """Post node ``node``'s share tick by tick; a late poster merges what it owes."""
    poster = Poster(url)
    pending: list[int] = []
    lateness: list[float] = []
    try:
        k = 0
        while k < plan.ticks or pending:
            if k < plan.ticks:
                due_s = (plan.t0_ms + k * plan.tick_ms) / 1000
                wait = due_s - time.time()
                if wait > 0:
                    time.sleep(wait)
                else:
                    lateness.append(-wait)
                # everything due by now, up to one POST's worth
                while k < plan.ticks and (plan.t0_ms + k * plan.tick_ms) / 1000 <= time.time():
                    pending.extend(plan.by_node[node][k])
                    k += 1
            batch, pending = pending[:MAX_OPS_PER_POST], pending[MAX_OPS_PER_POST:]
            if not batch:
                continue
            started = time.time() * 1000
            ok = poster.post([plan.fragment[i] for i in batch])
            acked = time.time() * 1000
            for i in batch:
                plan.post_ms[i] = started
                plan.ack_ms[i] = acked if ok else math.nan
            stats["posts"] += 1
    finally:
        stats["busy"] += poster.busy
        stats["errors"] += poster.errors
        stats["late_ticks"] += sum(1 for s in lateness if s > plan.tick_ms / 1000)
        stats["max_late_s"] = max([stats["max_late_s"], *lateness])
        poster.close()


class Monitor:
    """Samples every node's message count (and CPU time) every 0.25 s in a thread."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.urls = [n.url for n in cluster.nodes]
        self.samples: list[tuple[float, list[int]]] = []  # (wall s, count per node)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with httpx.Client(timeout=10) as http:
            while not self._stop.is_set():
                counts = [message_count(http, url) for url in self.urls]
                self.samples.append((time.time(), counts))
                self._stop.wait(STATUS_EVERY_S)

    def all_count_at(self, t: float) -> int:
        """Ops on every node at wall time ``t`` (the last sample at or before it)."""
        best = 0
        for ts, counts in self.samples:
            if ts > t:
                break
            best = min(counts)
        return best


def message_count(http: httpx.Client, url: str) -> int:
    try:
        count: int = http.get(f"{url}/status").json()["domains"]["messages"]["count"]
        return count
    except (httpx.HTTPError, ValueError, KeyError):
        return -1


def counters(http: httpx.Client, url: str) -> dict[str, float]:
    """The node's Prometheus counters summed over labels: ``{name: value}``."""
    out: dict[str, float] = {}
    for line in http.get(f"{url}/metrics").text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        base = name.split("{", 1)[0]
        out[base] = out.get(base, 0.0) + float(value)
    return out


def memory_parts_mb(http: httpx.Client, url: str) -> dict[str, float]:
    """The node's ``memory_bytes`` gauge: ``{part: MB}`` (RSS, C heap, RocksDB's parts)."""
    samples = metric(http.get(f"{url}/metrics").text, "memory_bytes")
    return {
        labels.removeprefix('part="').removesuffix('"'): round(value / 1e6, 1)
        for labels, value in samples.items()
    }


# --- one load run --------------------------------------------------------------------------


def run_load(
    console: Console, params: GossipBenchParams, base: Path, *, batched: bool, signer: Signer
) -> tuple[dict[str, Any], Cluster]:
    """Start a cluster, offer the load, wait for every op everywhere, measure.

    Returns the figures and the still running cluster (the caller closes it; the catch-up
    runs on the batched one).
    """
    label = "batched" if batched else "unbatched (1 op per gossip message)"
    # unbatched: one op per message, as fast as ops come (no batching, no message spacing)
    unbatched = {"gossip_batch_ops": 1, "gossip_min_interval_ms": 0}
    node_config: dict[str, Any] = {} if batched else unbatched
    cluster = Cluster(
        params.nodes,
        base / ("batched" if batched else "unbatched"),
        sync_interval_s=params.sync_interval_s,
        node_config=node_config,
        bootstrap_nodes=params.bootstrap_nodes,
    )
    try:
        t = time.monotonic()
        cluster.start()
        _wait_mesh(cluster)
        console.print(f"[bold]{label}[/]: {params.nodes} nodes up in {time.monotonic() - t:.1f} s")
        _post_joins(cluster, signer)
        idle = _idle_cpu(cluster, params.idle_s) if params.idle_s > 0 else None
        t = time.monotonic()
        plan = make_plan(signer, params)
        console.print(
            f"  signed {plan.size:,} messages in {time.monotonic() - t:.1f} s (not timed)"
        )
        loopback0 = loopback_bytes()
        result = _offer(console, cluster, plan, params)
        result["loopback_bytes"] = loopback_bytes() - loopback0
        result["idle_cores_per_node"] = idle
        result["connections"] = [len(cluster.status(i)["connected_peers"]) for i in cluster.live()]
        result["label"] = label
        result["node_config"] = node_config
    except BaseException:
        _close(cluster, label)
        raise
    return result, cluster


def _post_joins(cluster: Cluster, signer: Signer, timeout_s: float = 60) -> None:
    """Post every chat's adds to node 0 and wait until every node holds them (not timed):
    a message that reached a node before the add of its sender would wait for it.

    And until gossip + sync have counted every remote copy of them: a sync session counts
    its records when it ends, and one that carried adds must not end inside the load's
    window, where ``via_sync`` counts messages."""
    joins = signer.joins
    with httpx.Client(timeout=10) as http:
        before = [counters(http, n.url) for n in cluster.nodes]
        for s in range(0, len(joins), MAX_OPS_PER_POST):
            cluster.post_ops(0, joins[s : s + MAX_OPS_PER_POST])
        remote = len(joins) * (len(cluster.nodes) - 1)
        deadline = time.monotonic() + timeout_s
        while True:
            held = all(
                cluster.status(i)["domains"]["members"]["count"] >= len(joins)
                for i in cluster.live()
            )
            after = [counters(http, n.url) for n in cluster.nodes]
            applied = sum(
                a.get(name, 0) - b.get(name, 0)
                for a, b in zip(after, before, strict=True)
                for name in (
                    "chatsync_gossip_ops_applied_total",
                    "chatsync_sync_records_applied_total",
                )
            )
            if held and applied >= remote:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the {len(joins)} member ops did not reach every node in {timeout_s} s "
                    f"({applied} of {remote} remote copies counted)"
                )
            time.sleep(0.2)


def _idle_cpu(cluster: Cluster, seconds: float) -> float:
    """The nodes' CPU (cores per node) over ``seconds`` without load."""
    pids = [n.proc.pid for n in cluster.nodes if n.proc is not None]
    cpu0, t0 = [process_cpu_s(p) for p in pids], time.monotonic()
    time.sleep(seconds)
    used = sum(process_cpu_s(p) - c for p, c in zip(pids, cpu0, strict=True))
    return used / (time.monotonic() - t0) / len(pids)


def loopback_bytes() -> int:
    """Bytes sent over the loopback interface so far (/proc/net/dev): every node's traffic,
    libp2p and HTTP, on a machine where nothing else talks over it."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, fields = line.partition(":")
            if name.strip() == "lo":
                return int(fields.split()[8])  # transmitted bytes
    return 0


def _wait_mesh(cluster: Cluster, timeout_s: float = 30) -> None:
    """Until every node has its connections (every other node, or the node's low water of
    6 in a larger cluster: ``NodeConfig.peers_low``) — or timeout."""
    deadline = time.monotonic() + timeout_s
    want = min(len(cluster.nodes) - 1, NodeConfig.peers_low)
    while time.monotonic() < deadline:
        if all(len(cluster.status(i)["connected_peers"]) >= want for i in cluster.live()):
            time.sleep(1.5)  # subscriptions and mesh GRAFTs follow the connections
            return
        time.sleep(0.2)


def _offer(
    console: Console, cluster: Cluster, plan: Plan, params: GossipBenchParams
) -> dict[str, Any]:
    nodes = len(cluster.nodes)
    with httpx.Client(timeout=30) as http:
        before = [counters(http, n.url) for n in cluster.nodes]
    baseline = [cluster.status(i)["domains"]["messages"]["count"] for i in range(nodes)]
    pids = [n.proc.pid for n in cluster.nodes if n.proc is not None]
    monitor = Monitor(cluster)
    monitor.start()
    stats: dict[str, Any] = {"posts": 0, "busy": 0, "errors": 0, "late_ticks": 0, "max_late_s": 0.0}
    cpu0 = [process_cpu_s(p) for p in pids]
    gen_cpu0 = time.process_time()
    machine0 = machine_busy_s()
    threads = [
        threading.Thread(target=post_plan, args=(plan, i, cluster.nodes[i].url, stats))
        for i in range(nodes)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    load_end = time.time()
    cpu_load = [process_cpu_s(p) for p in pids]
    gen_cpu = time.process_time() - gen_cpu0
    machine_load = machine_busy_s() - machine0
    accepted = sum(1 for a in plan.ack_ms if not math.isnan(a))
    expected = min(baseline) + accepted
    console.print(
        f"  offered {plan.size:,} ops in {load_end - plan.t0_ms / 1000:.1f} s "
        f"({accepted:,} acknowledged); waiting for them on every node"
    )
    drained_at: float | None = None
    while time.time() - load_end < params.drain_timeout_s:
        if monitor.samples and min(monitor.samples[-1][1]) >= expected:
            drained_at = monitor.samples[-1][0]
            break
        time.sleep(0.1)
    monitor.stop()
    cpu_end = [process_cpu_s(p) for p in pids]
    with httpx.Client(timeout=60) as http:
        after = _settled(http, cluster, before, accepted * (nodes - 1) if drained_at else None)
        debug = [
            http.get(
                f"{n.url}/debug/latency", params={"arrivals": 1}, headers=n.admin_headers()
            ).json()
            for n in cluster.nodes
        ]
    converged = drained_at is not None and cluster.converged()
    load_start = plan.t0_ms / 1000
    load_s = load_end - load_start
    window = (load_start + min(params.warmup_s, load_s / 2), load_end)
    latency, on_all = _latencies(plan, debug, nodes)
    delivered = sum(1 for t in on_all if window[0] <= t < window[1])
    by_counts = monitor.all_count_at(window[1]) - monitor.all_count_at(window[0])
    gossip_applied = sum(
        a.get("chatsync_gossip_ops_applied_total", 0)
        - b.get("chatsync_gossip_ops_applied_total", 0)
        for a, b in zip(after, before, strict=True)
    )
    sync_applied = sum(
        a.get("chatsync_sync_records_applied_total", 0)
        - b.get("chatsync_sync_records_applied_total", 0)
        for a, b in zip(after, before, strict=True)
    )

    def delta(name: str) -> float:
        return sum(a.get(name, 0) - b.get(name, 0) for a, b in zip(after, before, strict=True))

    published_msgs = delta("chatsync_gossip_messages_published_total")
    published_ops = delta("chatsync_gossip_ops_published_total")
    node_cpu_load = sum(e - s for e, s in zip(cpu_load, cpu0, strict=True))
    node_cpu_all = sum(e - s for e, s in zip(cpu_end, cpu0, strict=True))
    busy_until = drained_at if drained_at is not None else time.time()
    return {
        "offered_ops": plan.size,
        "offered_ops_s": plan.size / (plan.ticks * plan.tick_ms / 1000),
        "acknowledged_ops": accepted,
        "posted_ops_s": accepted / load_s if load_s > 0 else 0.0,
        "load_s": load_s,
        "generator": {**stats, "cpu_s": gen_cpu},
        "delivered_ops_s": delivered / (window[1] - window[0]),
        "delivered_ops_s_by_counts": by_counts / (window[1] - window[0]),
        "delivered_window_s": list(window),
        "all_on_every_node": drained_at is not None,
        "drain_s": (drained_at - load_end) if drained_at is not None else None,
        "first_post_to_all_s": (drained_at - load_start) if drained_at is not None else None,
        "converged": converged,
        "counts": [c for c in monitor.samples[-1][1]] if monitor.samples else [],
        "expected_count": expected,
        "latency_ms": latency,
        "node_latency_ms": [d.get("quantiles", {}) for d in debug],
        "remote_deliveries": accepted * (nodes - 1),
        "via_gossip": gossip_applied,
        "via_sync": sync_applied,
        "gossip_messages_published": published_msgs,
        "ops_per_gossip_message": published_ops / published_msgs if published_msgs else 0.0,
        "gossip_rejected": delta("chatsync_gossip_rejected_total"),
        "api_busy": stats["busy"],
        "node_cpu": {
            "load_s": node_cpu_load,
            "load_cores": node_cpu_load / load_s if load_s > 0 else 0.0,
            "until_drained_s": node_cpu_all,
            "cores_until_drained": node_cpu_all / (busy_until - load_start),
            "us_per_op_per_node": node_cpu_all / max(1, accepted) / nodes * 1e6,
            # the whole machine during the load: what the nodes, the generator and everything
            # else on it (other jobs) used, in cores
            "machine_cores_busy_during_load": machine_load / load_s if load_s > 0 else 0.0,
            "generator_cores_during_load": gen_cpu / load_s if load_s > 0 else 0.0,
            "other_processes_cores_during_load": (machine_load - node_cpu_load - gen_cpu) / load_s
            if load_s > 0
            else 0.0,
        },
        "curve": _curve(monitor, load_start, expected - accepted),
    }


def _settled(
    http: httpx.Client, cluster: Cluster, before: list[dict[str, float]], remote: int | None
) -> list[dict[str, float]]:
    """Every node's counters, once gossip + sync account for all ``remote`` deliveries (a sync
    session counts its records when it ends) — or after 10 s."""
    deadline = time.monotonic() + 10
    while True:
        after = [counters(http, n.url) for n in cluster.nodes]
        applied = sum(
            a.get(name, 0) - b.get(name, 0)
            for a, b in zip(after, before, strict=True)
            for name in ("chatsync_gossip_ops_applied_total", "chatsync_sync_records_applied_total")
        )
        if remote is None or applied >= remote or time.monotonic() > deadline:
            return after
        time.sleep(0.25)


def _latencies(
    plan: Plan, debug: list[dict[str, Any]], nodes: int
) -> tuple[dict[str, Any], list[float]]:
    """Per op: when the last node stored it (by gossip or by anti-entropy, whichever came
    first there), against POST start and ack.

    Also returns, per acknowledged op, the wall time (s) it was on every node (inf: some node
    has no arrival logged for it).
    """
    by_gossip: list[dict[int, int]] = [dict(d.get("arrivals", [])) for d in debug]
    arrivals: list[dict[int, int]] = [dict(d.get("sync_arrivals", [])) for d in debug]
    for node_arrivals, gossiped in zip(arrivals, by_gossip, strict=True):
        for key, gossip_ms in gossiped.items():
            node_arrivals[key] = min(gossip_ms, node_arrivals.get(key, gossip_ms))
    end_to_end: list[float] = []
    propagation: list[float] = []
    on_all: list[float] = []
    missing = not_by_gossip = 0
    for i in range(plan.size):
        if math.isnan(plan.ack_ms[i]):
            continue
        remote = [node for node in range(nodes) if node != plan.origin[i]]
        not_by_gossip += any(plan.key[i] not in by_gossip[node] for node in remote)
        last: float = plan.ack_ms[i]
        for node in remote:
            at = arrivals[node].get(plan.key[i])
            if at is None:
                last = -1
                break
            last = max(last, at)
        if last < 0:
            missing += 1
            end_to_end.append(math.inf)
            propagation.append(math.inf)
            on_all.append(math.inf)
            continue
        on_all.append(last / 1000)
        end_to_end.append(last - plan.post_ms[i])
        propagation.append(last - plan.ack_ms[i])
    ingest = [plan.ack_ms[i] - plan.post_ms[i] for i in range(plan.size) if plan.ack_ms[i] > 0]
    return {
        "end_to_end": _quantiles(end_to_end),
        "propagation": _quantiles(propagation),
        "origin_ack": _quantiles(ingest),
        "not_by_gossip": not_by_gossip,
        "no_arrival_logged": missing,
        "definition": (
            "end_to_end: POST start at the origin -> last node stored it (by gossip or "
            "anti-entropy); propagation: origin ack -> the same; an op some node logged no "
            "arrival for is inf"
        ),
    }, on_all


def _quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"count": 0, "p50": None, "p99": None, "max": None}
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "p50": quantile(ordered, 0.5),
        "p99": quantile(ordered, 0.99),
        "max": quantile(ordered, 1.0),
    }


def _curve(monitor: Monitor, start: float, base: int) -> list[list[float]]:
    """(seconds since the first tick, ops on every node) — about 4 points per second."""
    return [[round(t - start, 3), min(c) - base] for t, c in monitor.samples]


# --- catch-up ------------------------------------------------------------------------------


def run_catchup(
    console: Console, cluster: Cluster, params: GossipBenchParams, signer: Signer
) -> dict[str, Any]:
    victim = len(cluster.nodes) - 1
    live = [i for i in range(len(cluster.nodes)) if i != victim]
    stop_note = None
    try:
        cluster.stop(victim)
    except subprocess.TimeoutExpired:
        stop_note = "SIGTERM did not stop the node within 30 s: killed"
    console.print(
        f"[bold]catch-up[/]: node {victim} stopped; {params.catchup:,} messages for the others"
    )
    base_ms = int(time.time() * 1000)
    # the waits grow with the messages: the others' bulk ingest 1 s per 1,000 more, the
    # catch-up 1 s per 2,000 more (its goal is < 60 s for 1M: a slower one is measured, not
    # cut off)
    ingest_timeout_s = params.catchup_timeout_s + params.catchup / 1000
    catchup_timeout_s = params.catchup_timeout_s + params.catchup / 2000
    with bench_progress(console, label_width=34) as progress:
        fragments = [
            json_fragment(signer.sign(10_000_000 + n, Hlc(base_ms + n // 1000, n % 1000)))
            for n in tracked(progress, "sign (not timed)", range(params.catchup))
        ]
        console.print(f"  signed in {time.time() - base_ms / 1000:.1f} s (not timed)")
        held = cluster.status(live[0])["domains"]["messages"]["count"]
        expected = held + params.catchup
        t = time.monotonic()
        _post_shares(cluster, live, fragments, progress)
        posted_s = time.monotonic() - t
        del fragments
        stored = progress.add_task(f"stored on all {len(live)} nodes", total=params.catchup)
        _wait_counts(
            cluster,
            live,
            expected,
            ingest_timeout_s,
            lambda count: progress.update(stored, completed=count - held),
        )
        progress.remove_task(stored)
    ingest_s = time.monotonic() - t
    console.print(
        f"  posted to {len(live)} nodes in {posted_s:.1f} s, on all {len(live)} in "
        f"{ingest_s:.1f} s ({params.catchup / ingest_s:,.0f} ops/s); restarting node {victim}"
    )
    target = cluster.status(live[0])["domains"]["messages"]["root"]
    t0 = time.monotonic()
    cluster.restart(victim, timeout_s=params.catchup_timeout_s)
    ready_s = time.monotonic() - t0
    done_s: float | None = None
    with (
        httpx.Client(timeout=10) as http,
        bench_progress(console, label_width=34) as progress,
    ):
        caught = progress.add_task(f"node {victim}: caught up", total=params.catchup)
        peak_kib = 0  # the restarted node's, its signature workers included
        while time.monotonic() - t0 < catchup_timeout_s:
            restarted = cluster.nodes[victim].proc
            peak_kib = max(peak_kib, rss_kib_or_zero(restarted.pid) if restarted else 0)
            try:
                status = http.get(f"{cluster.nodes[victim].url}/status").json()
            except (httpx.HTTPError, ValueError):
                time.sleep(0.1)
                continue
            messages = status["domains"]["messages"]
            progress.update(caught, completed=messages["count"] - (expected - params.catchup))
            if messages["root"] == target:
                done_s = time.monotonic() - t0
                break
            time.sleep(0.1)
        progress.remove_task(caught)
        metrics = _settled_counters(http, cluster.nodes[victim].url, params.catchup)
        status = http.get(f"{cluster.nodes[victim].url}/status").json()
    workers_s = _wait_workers_gone(cluster.nodes[victim])
    # every node now holds the missed messages (and the loads'): its memory at rest, from /proc
    node_counts = [cluster.status(i)["domains"]["messages"]["count"] for i in cluster.live()]
    rss_mb = [
        round(rss_kib(node.proc.pid) * 1024 / 1e6, 1)
        for node in cluster.nodes
        if node.proc is not None and node.alive
    ]
    memory_mb = [memory_parts_mb(cluster.http, cluster.nodes[i].url) for i in cluster.live()]
    sessions = [
        {k: v for k, v in outcome.items() if k != "peer"}
        for outcome in status["last_sync"].values()
    ]
    result = {
        "missed": params.catchup,
        "node": victim,
        "ingest_s": ingest_s,
        "ingest_ops_s": params.catchup / ingest_s,
        "ready_s": ready_s,
        "catchup_s": done_s,
        "after_ready_s": done_s - ready_s if done_s is not None else None,
        "caught_up": done_s is not None,
        "sync_records_applied": metrics.get("chatsync_sync_records_applied_total", 0),
        "gossip_ops_applied": metrics.get("chatsync_gossip_ops_applied_total", 0),
        "count": status["domains"]["messages"]["count"],
        "expected_count": expected,
        "last_sessions": sessions,
        "stop": stop_note or "SIGTERM",
        "node_counts": node_counts,
        # VmRSS of every node and its children after the catch-up, once the restarted node's
        # signature workers have exited (MB, 10^6 B), the restarted node last
        "rss_mb": rss_mb,
        # the restarted node's, workers included, sampled during the catch-up
        "catchup_peak_rss_mb": round(peak_kib * 1024 / 1e6, 1),
        "workers_exit_s": workers_s,  # after the catch-up: how long they took to go
        # what each node's /metrics says its memory holds (MB), same order
        "memory_mb": memory_mb,
    }
    verdict = f"{done_s:.1f} s" if done_s is not None else "not within the timeout"
    console.print(f"  node {victim} caught up with {params.catchup:,} messages: {verdict}")
    return result


def _wait_workers_gone(node: NodeProcess, timeout_s: float = 60.0) -> float | None:
    """Seconds until the node's signature workers exit (they do when idle: node/verify.py);
    None if they still run after ``timeout_s``."""
    t = time.monotonic()
    while time.monotonic() - t < timeout_s:
        assert node.proc is not None
        if not any(_is_worker(pid) for pid in child_pids(node.proc.pid)):
            return time.monotonic() - t
        time.sleep(0.2)
    return None


def _is_worker(pid: int) -> bool:
    try:
        return WORKER_MODULE.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _settled_counters(http: httpx.Client, url: str, missed: int) -> dict[str, float]:
    """The node's counters once its sync sessions have ended (they count records at the end)."""
    deadline = time.monotonic() + 15
    while True:
        metrics = counters(http, url)
        applied = metrics.get("chatsync_sync_records_applied_total", 0) + metrics.get(
            "chatsync_gossip_ops_applied_total", 0
        )
        if applied >= missed or time.monotonic() > deadline:
            return metrics
        time.sleep(0.2)


def _post_shares(
    cluster: Cluster, live: list[int], fragments: list[str], progress: Progress
) -> None:
    """Post ``fragments`` to the ``live`` nodes, a share each, one thread per node."""
    task = progress.add_task(f"post to {len(live)} nodes", total=len(fragments))

    def post_share(node: int, share: list[str]) -> None:
        poster = Poster(cluster.nodes[node].url)
        try:
            for s in range(0, len(share), MAX_OPS_PER_POST):
                chunk = share[s : s + MAX_OPS_PER_POST]
                poster.post(chunk)
                progress.advance(task, len(chunk))
        finally:
            poster.close()

    threads = [
        threading.Thread(target=post_share, args=(node, fragments[j :: len(live)]))
        for j, node in enumerate(live)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    progress.remove_task(task)


def _wait_counts(
    cluster: Cluster,
    nodes: list[int],
    expected: int,
    timeout_s: float,
    on_count: Callable[[int], object] | None = None,
) -> None:
    """Until each of ``nodes`` holds ``expected`` messages (``on_count``: the least, each poll).

    A busy node may drop a poll (a dropped connection, a timeout): polled again; a node that
    exited ends the wait with its exit code."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=30) as http:
        while time.monotonic() < deadline:
            counts = [message_count(http, cluster.nodes[i].url) for i in nodes]
            dead = [i for i in nodes if not cluster.nodes[i].alive]
            if dead:
                codes = [p.poll() for i in dead if (p := cluster.nodes[i].proc) is not None]
                raise RuntimeError(f"nodes {dead} exited (codes {codes}) while storing ops")
            if min(counts) >= 0 and on_count is not None:
                on_count(min(counts))
            if min(counts) >= expected:
                return
            time.sleep(0.2)
    raise TimeoutError(f"nodes {nodes} did not all reach {expected} messages in {timeout_s} s")


# --- entry point ---------------------------------------------------------------------------


def run_gossip_bench(params: GossipBenchParams, console: Console | None = None) -> dict[str, Any]:
    """Run the batched load (+ catch-up) and the unbatched load; print, save, return the JSON."""
    console = console or bench_console(log_width=160)
    load_before = loadavg()
    signer = Signer(params.authors, params.chats, params.payload)
    base = Path(tempfile.mkdtemp(prefix="chatsync-gossip-")) if params.data is None else params.data
    if params.data is not None:
        shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True, exist_ok=True)
    runs: dict[str, Any] = {}
    catchup: dict[str, Any] | None = None
    floor: dict[str, Any] | None = None
    capacity: dict[str, Any] | None = None
    notes: list[str] = []
    try:
        runs["batched"], cluster = run_load(console, params, base, batched=True, signer=signer)
        assert cluster is not None
        try:
            if params.capacity is not None:
                capacity = run_capacity(
                    console,
                    params.capacity,
                    lambda rate: _capacity_step(console, cluster, params, signer, rate),
                )
            if params.catchup > 0:
                catchup = run_catchup(console, cluster, params, signer)
        finally:
            notes += _close(cluster, "batched")
        if params.unbatched:
            runs["unbatched"], cluster = run_load(
                console, params, base, batched=False, signer=signer
            )
            notes += _close(cluster, "unbatched")
        if params.floor:
            floor = _run_floor(console, params, runs["batched"], signer)
    finally:
        if params.data is None:
            shutil.rmtree(base, ignore_errors=True)
    params_out = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(params).items()}
    report = build_report(params_out, runs, catchup, load_before, notes, floor, capacity)
    print_report(console, report)
    save_report(console, report, params.out)
    return report


def _capacity_step(
    console: Console, cluster: Cluster, params: GossipBenchParams, signer: Signer, rate: int
) -> dict[str, Any]:
    """One capacity step on the running cluster: ``rate`` ops/s for the step's seconds.

    A step whose ops are not everywhere within its drain timeout is waited for up to the
    bench's drain timeout more, so the next step (or the catch-up) starts on a quiet cluster
    and no acknowledged op goes unchecked."""
    assert params.capacity is not None
    step = replace(
        params,
        rate=rate,
        seconds=params.capacity.seconds,
        drain_timeout_s=params.capacity.drain_timeout_s,
    )
    run = _offer(console, cluster, make_plan(signer, step), step)
    run["on_every_node_in_the_end"] = run["all_on_every_node"]
    if not run["all_on_every_node"]:
        try:
            _wait_counts(cluster, cluster.live(), run["expected_count"], params.drain_timeout_s)
            run["on_every_node_in_the_end"] = cluster.converged()
        except TimeoutError:
            run["on_every_node_in_the_end"] = False
    return run


def _run_floor(
    console: Console, params: GossipBenchParams, batched: dict[str, Any], signer: Signer
) -> dict[str, Any]:
    """Bare py-libp2p peers moving the batched run's bytes, and the ed25519 checks it made;
    beside it, what storing those ops costs (``bench.store_floor``)."""
    per_message = max(1, round(batched["ops_per_gossip_message"]))
    console.print(
        f"floor: {params.nodes} bare py-libp2p peers, {params.rate:,} ops/s in messages of "
        f"{per_message} ops, {params.seconds:g} s"
    )
    floor = run_transport_floor(
        FloorParams(
            peers=params.nodes,
            rate=params.rate,
            seconds=params.seconds,
            ops_per_message=per_message,
            payload=params.payload,
        )
    )
    count = max(per_message, min(STORE_FLOOR_OPS, round(params.rate * params.seconds)))
    base_ms = int(time.time() * 1000)
    ops: list[Op] = [signer.sign(n, Hlc(base_ms + n // 1000, n % 1000)) for n in range(count)]
    console.print(f"beyond the floor: decoding and storing {count:,} ops, {per_message} at a time")
    floor["store_us_per_op"] = store_us_per_op(signer.joins, ops, per_message)
    floor["store_ops"] = count
    return floor


def _close(cluster: Cluster | None, label: str) -> list[str]:
    """Stop the cluster; a node that ignores SIGTERM is killed and noted, not fatal here."""
    if cluster is None:
        return []
    try:
        cluster.close()
    except RuntimeError as exc:
        return [f"{label}: {exc}"]
    return []
