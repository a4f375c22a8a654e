"""``chatsync bench push``: what the event stream costs and how fast it delivers, beside polling.

One run on a ``Cluster`` of 2 real node processes (loopback): a writer process
(``bench.push_writer``) posts signed messages to node A over HTTP; ``clients`` WebSocket
streams (``bench.push_clients``: every one its own device, over ``listeners`` users, all
members of one group) are held open on node B, which gets the messages by gossip. Measured:

memory     node B's RSS (``/proc/<pid>/status`` VmRSS) before the clients connect and with
           all of them connected and idle (their first frame read and acknowledged, then
           ``settle_s``): (after - before) / clients, per connection;
push       for each offered rate (ops/s, round robin over ``writers`` authors, one small POST
           every ``tick_ms``): per op and probe, from the start of the POST that carried it
           to the frame that brought it to the probe (``probes`` of the clients parse their
           frames; the others only acknowledge them); p50, p99, max over all (op, probe)
           pairs, and the ops every probe got (an op a probe never got is "never");
B hop      the part of that after node B stored the op (its arrival log, ``GET
           /debug/latency?arrivals=1``): the push path itself, without gossip;
polling    during the run at the lowest rate, ``pollers`` devices more read the same chat as
           ``GET /chats/{chat}/messages?limit=50`` every ``poll_interval_s`` on node B (phases
           spread over the interval), paging back until they reach an id they saw: per op
           and poller, POST start -> the GET that returned it. Ratios polling / push.

After each load the harness waits (``drain_timeout_s`` at most) until every probe and poller
has every acknowledged op and every client has acknowledged the log past them, so the next
rate starts from idle streams. Node and harness CPU is read from /proc: on a 2-core machine
the two nodes, the writer and the harness share the cores, and that is what the figures are.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import trio
from rich.console import Console
from rich.progress import Progress

from bench.console import bench_console, bench_progress, save_report
from bench.machine import loadavg, machine_busy_s, process_cpu_s, rss_kib
from bench.push_clients import Poller, StreamClient, run_clients
from bench.push_report import build_report, latency_summary, plot_cdfs, print_report
from bench.push_writer import WriterPlan, WriterProcess, WriterResult
from client.http import ChatsyncClient
from cluster.local import Cluster, NodeProcess
from cluster.scenario import GROUP, Authors

CHECK_EVERY_S = 0.25


@dataclass(frozen=True)
class PushBenchParams:
    clients: int = 1000  # streams held open on node B (probes among them)
    rates: tuple[int, ...] = (100, 1000)  # offered ops/s, one load each
    seconds: float = 10.0  # per rate
    probes: int = 20  # clients that parse their frames and time each op
    pollers: int = 20  # during the lowest rate: devices polling the history (0: none)
    poll_interval_s: float = 1.0
    poll_limit: int = 50
    writers: int = 8  # authors the load is spread over
    listeners: int = 8  # users the clients and pollers sign in as (each its own device)
    tick_ms: int = 20  # one POST per tick
    payload: int = 100  # bytes per message
    drain_timeout_s: float = 180.0  # after a load: how long to wait for every op everywhere
    settle_s: float = 3.0  # idle streams, before node B's RSS is read
    sync_interval_s: float = 10.0  # anti-entropy per peer (the node default)
    node_config: dict[str, Any] = field(
        default_factory=lambda: {"author_ops_per_s": 1e6, "author_ops_burst": 1e6}
    )
    out: Path = Path("bench-results/push.json")
    data: Path | None = None  # None: a temporary directory, removed afterwards

    def check(self) -> None:
        if not 1 <= self.probes <= self.clients:
            raise ValueError(f"--probes: 1..{self.clients} (the clients), got {self.probes}")
        if not self.rates or min(self.rates) <= 0:
            raise ValueError("--rates: at least one rate, each > 0")
        if self.writers + self.listeners > 192:
            raise ValueError("at most 192 writers and listeners together (cluster.scenario keys)")

    @property
    def plot_path(self) -> Path:
        return self.out.with_suffix(".png")


@dataclass
class Harness:
    """What the trio side works with: the nodes, the readers, the writer, the progress."""

    params: PushBenchParams
    cluster: Cluster
    authors: Authors
    clients: list[StreamClient]
    poller_tokens: list[str]
    writer: WriterProcess
    progress: Progress
    console: Console

    @property
    def a(self) -> NodeProcess:
        return self.cluster.nodes[0]

    @property
    def b(self) -> NodeProcess:
        return self.cluster.nodes[1]

    @property
    def probes(self) -> list[StreamClient]:
        return [c for c in self.clients if c.probe]


@dataclass
class RawRun:
    """One load as measured, before the latencies are worked out."""

    rate: int
    writer: WriterResult
    probe_arrivals: list[dict[str, float]]
    poller_arrivals: list[dict[str, float]] | None
    poller_requests: int
    poller_errors: int
    load_start: float
    load_end: float
    drained_at: float | None
    caught_up: bool
    cpu: dict[str, float]
    frames: int
    closes: dict[str, int]


# --- set-up --------------------------------------------------------------------------------


def _wait_mesh(cluster: Cluster, timeout_s: float = 30) -> None:
    """Until the two nodes are connected (and a moment for the gossip mesh to form)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(len(cluster.status(i)["connected_peers"]) >= 1 for i in (0, 1)):
            time.sleep(1.5)
            return
        time.sleep(0.2)
    raise TimeoutError(f"the two nodes did not connect within {timeout_s} s")


def _post_joins(cluster: Cluster, authors: Authors, timeout_s: float = 60) -> None:
    """The group's adds, posted to node A, until node B holds them (a message whose sender
    node B has no add for would wait for it)."""
    if not all(cluster.post_ops(0, authors.joins)):
        raise RuntimeError("node A did not take the group's adds as new (a reused data dir?)")
    deadline = time.monotonic() + timeout_s
    while cluster.status(1)["domains"]["members"]["count"] < len(authors.joins):
        if time.monotonic() > deadline:
            raise TimeoutError(f"node B did not get the group's adds within {timeout_s} s")
        time.sleep(0.1)


def _sign_in(
    node: NodeProcess, authors: Authors, who: list[tuple[int, str]], progress: Progress
) -> list[str]:
    """A token on ``node`` for each (author index, device), 8 sign-ins at a time."""
    task = progress.add_task("sign in", total=len(who))

    def one(user_device: tuple[int, str]) -> str:
        user, device = user_device
        with ChatsyncClient(node.url, key=authors.keys[user], device=device) as client:
            token = client.token()
        progress.advance(task)
        return token

    with ThreadPoolExecutor(8) as pool:
        tokens = list(pool.map(one, who))
    progress.remove_task(task)
    return tokens


def _pid(node: NodeProcess) -> int:
    assert node.proc is not None
    return node.proc.pid


# --- the trio side -------------------------------------------------------------------------


async def _measure(h: Harness) -> tuple[dict[str, Any], dict[str, Any], list[RawRun]]:
    """Connect the clients (RSS before and after), then run each rate; the set-up figures,
    the memory figures and the raw runs."""
    params = h.params
    b_pid = _pid(h.b)
    rss_before = rss_kib(b_pid)
    runs: list[RawRun] = []
    async with trio.open_nursery() as nursery:
        connected = trio.Semaphore(0)
        nursery.start_soon(run_clients, h.clients, connected)
        task = h.progress.add_task("connect", total=len(h.clients))
        t = time.monotonic()
        with trio.move_on_after(180):
            for _ in h.clients:
                await connected.acquire()
                h.progress.advance(task)
        connect_s = time.monotonic() - t
        streaming = sum(1 for c in h.clients if c.frames > 0)
        h.progress.remove_task(task)
        await trio.sleep(params.settle_s)
        rss_idle = rss_kib(b_pid)
        h.console.print(
            f"{streaming:,} of {len(h.clients):,} streams open on node B in {connect_s:.1f} s; "
            f"RSS {rss_before / 1024:,.1f} -> {rss_idle / 1024:,.1f} MiB"
        )
        rss_after: list[int] = []
        polled = params.rates.index(min(params.rates)) if params.pollers > 0 else -1
        for i, rate in enumerate(params.rates):
            runs.append(await _run_rate(h, rate, with_pollers=i == polled))
            rss_after.append(rss_kib(b_pid))
        nursery.cancel_scope.cancel()
    setup = {"connect_s": connect_s, "clients_streaming": streaming}
    memory = {
        "clients": len(h.clients),
        "rss_before_kib": rss_before,
        "rss_idle_kib": rss_idle,
        "kib_per_connection": (rss_idle - rss_before) / len(h.clients),
        "rss_after_runs_kib": rss_after,
    }
    return setup, memory, runs


async def _run_rate(h: Harness, rate: int, *, with_pollers: bool) -> RawRun:
    params = h.params
    for probe in h.probes:
        probe.arrivals = {}
        probe.last_new_position = 0
    frames0 = sum(c.frames for c in h.clients)
    closes0 = _closes(h.clients)
    pollers: list[Poller] = []
    async with trio.open_nursery() as nursery:
        if with_pollers:
            pollers = [
                Poller(n, h.b.url, GROUP.hex(), token, params.poll_interval_s, params.poll_limit)
                for n, token in enumerate(h.poller_tokens)
            ]
            for poller in pollers:
                phase = params.poll_interval_s * poller.n / len(pollers)
                nursery.start_soon(poller.run, phase)
            for poller in pollers:
                await poller.polled.wait()  # the baseline: what was there before
        pids = {"node_a": _pid(h.a), "node_b": _pid(h.b)}
        cpu0 = {name: process_cpu_s(pid) for name, pid in pids.items()}
        harness0 = time.process_time()
        machine0 = machine_busy_s()
        plan = WriterPlan(
            url=h.a.url,
            seeds=tuple(bytes(h.authors.keys[i]) for i in range(params.writers)),
            chat_id=GROUP,
            rate=rate,
            seconds=params.seconds,
            tick_ms=params.tick_ms,
            start_at=time.time() + 0.2,
            payload=params.payload,
            tag=f"push-bench {rate}/s",
        )
        total = round(rate * params.seconds)
        task = h.progress.add_task(f"{rate:,} ops/s: load", total=total)
        updating = trio.CancelScope()

        async def show() -> None:
            with updating:
                while True:
                    got = min(len(p.arrivals) for p in h.probes)
                    h.progress.update(task, completed=min(got, total))
                    await trio.sleep(CHECK_EVERY_S)

        nursery.start_soon(show)
        written = await trio.to_thread.run_sync(h.writer.run, plan)
        load_end = time.time()
        cpu_load = {name: process_cpu_s(pid) - cpu0[name] for name, pid in pids.items()}
        harness_load = time.process_time() - harness0
        machine_load = machine_busy_s() - machine0
        h.progress.update(task, description=f"{rate:,} ops/s: drain")
        wanted = [i for i, a in zip(written.ids, written.ack_s, strict=True) if not math.isnan(a)]
        drained_at, caught_up = await _drain(h, wanted, pollers, load_end)
        cpu_all = {name: process_cpu_s(pid) - cpu0[name] for name, pid in pids.items()}
        harness_all = time.process_time() - harness0
        updating.cancel()
        h.progress.remove_task(task)
        nursery.cancel_scope.cancel()
    load_s = max(1e-9, load_end - written.started_at)
    until_s = max(1e-9, (drained_at or time.time()) - written.started_at)
    cpu = {
        "node_a_cores": cpu_load["node_a"] / load_s,
        "node_b_cores": cpu_load["node_b"] / load_s,
        "harness_cores": harness_load / load_s,
        "writer_cores": written.cpu_s / load_s,
        # the whole machine during the load, and what processes other than this run's used
        "machine_cores": machine_load / load_s,
        "other_processes_cores": (
            machine_load - cpu_load["node_a"] - cpu_load["node_b"] - harness_load - written.cpu_s
        )
        / load_s,
        "node_a_cores_until_drained": cpu_all["node_a"] / until_s,
        "node_b_cores_until_drained": cpu_all["node_b"] / until_s,
        "harness_cores_until_drained": harness_all / until_s,
    }
    closes = _closes(h.clients)
    return RawRun(
        rate=rate,
        writer=written,
        probe_arrivals=[p.arrivals for p in h.probes],
        poller_arrivals=[p.arrivals for p in pollers] if with_pollers else None,
        poller_requests=sum(p.requests for p in pollers),
        poller_errors=sum(p.errors for p in pollers),
        load_start=written.started_at,
        load_end=load_end,
        drained_at=drained_at,
        caught_up=caught_up,
        cpu=cpu,
        frames=sum(c.frames for c in h.clients) - frames0,
        closes={k: v - closes0.get(k, 0) for k, v in closes.items() if v > closes0.get(k, 0)},
    )


async def _drain(
    h: Harness, wanted: list[str], pollers: list[Poller], load_end: float
) -> tuple[float | None, bool]:
    """Until every probe and poller has every op of ``wanted`` and every client has
    acknowledged the log past them; (when, or None after the timeout; caught up)."""
    readers = [p.arrivals for p in h.probes] + [p.arrivals for p in pollers]
    pending = list(range(len(readers)))
    deadline = load_end + h.params.drain_timeout_s
    while time.time() < deadline:
        pending = [r for r in pending if not all(i in readers[r] for i in wanted)]
        if not pending:
            target = max(p.last_new_position for p in h.probes)
            if all(c.position >= target for c in h.clients):
                return time.time(), True
        await trio.sleep(CHECK_EVERY_S)
    return None, False


def _closes(clients: list[StreamClient]) -> dict[str, int]:
    out: dict[str, int] = {}
    for client in clients:
        for code, count in client.closes.items():
            out[code] = out.get(code, 0) + count
    return out


# --- the figures ---------------------------------------------------------------------------


def _stored_on(node: NodeProcess) -> dict[int, float]:
    """Packed HLC -> when the node stored the op (wall s): by gossip or anti-entropy, first."""
    body = httpx.get(
        f"{node.url}/debug/latency",
        params={"arrivals": 1},
        headers=node.admin_headers(),
        timeout=60,
    ).json()
    stored: dict[int, float] = {}
    for key, ms in [*body.get("sync_arrivals", []), *body.get("arrivals", [])]:
        stored[key] = min(ms / 1000, stored.get(key, math.inf))
    return stored


def _figures(params: PushBenchParams, raw: RawRun, stored: dict[int, float]) -> dict[str, Any]:
    w = raw.writer
    ok = [n for n in range(len(w.ids)) if not math.isnan(w.ack_s[n])]
    push = [
        (arrivals[w.ids[n]] - w.post_s[n]) * 1000 if w.ids[n] in arrivals else math.inf
        for arrivals in raw.probe_arrivals
        for n in ok
    ]
    b_hop = [
        (arrivals[w.ids[n]] - stored[w.hlcs[n]]) * 1000
        for arrivals in raw.probe_arrivals
        for n in ok
        if w.ids[n] in arrivals and w.hlcs[n] in stored
    ]
    gossip_hop = [(stored[w.hlcs[n]] - w.post_s[n]) * 1000 for n in ok if w.hlcs[n] in stored]
    every_probe = sum(1 for n in ok if all(w.ids[n] in a for a in raw.probe_arrivals))
    load_s = max(1e-9, raw.load_end - raw.load_start)
    polling = None
    if raw.poller_arrivals is not None:
        polled = [
            (arrivals[w.ids[n]] - w.post_s[n]) * 1000 if w.ids[n] in arrivals else math.inf
            for arrivals in raw.poller_arrivals
            for n in ok
        ]
        every_poller = sum(1 for n in ok if all(w.ids[n] in a for a in raw.poller_arrivals))
        polling = {
            "pollers": len(raw.poller_arrivals),
            "latency_ms": latency_summary(polled, cdf=True),
            "b_hop_ms": latency_summary(
                [
                    (arrivals[w.ids[n]] - stored[w.hlcs[n]]) * 1000
                    for arrivals in raw.poller_arrivals
                    for n in ok
                    if w.ids[n] in arrivals and w.hlcs[n] in stored
                ]
            ),
            "delivered": every_poller,
            "expected": len(ok),
            "missing": len(ok) - every_poller,
            "requests": raw.poller_requests,
            "errors": raw.poller_errors,
        }
    return {
        "rate": raw.rate,
        "clients": params.clients,
        "probes": params.probes,
        "offered_ops": len(w.ids),
        "acknowledged_ops": len(ok),
        "load_s": load_s,
        "posted_ops_s": len(ok) / load_s,
        "push": {
            "latency_ms": latency_summary(push, cdf=True),
            # the same over the (op, probe) pairs that came, for a run where some never did
            "latency_ms_of_received": latency_summary([v for v in push if not math.isinf(v)]),
            "delivered": every_probe,
            "expected": len(ok),
            "missing": len(ok) - every_probe,
            "per_probe_min": min(sum(1 for n in ok if w.ids[n] in a) for a in raw.probe_arrivals),
        },
        "b_hop_ms": latency_summary(b_hop),
        "gossip_hop_ms": latency_summary(gossip_hop),
        "not_in_b_arrival_log": sum(1 for n in ok if w.hlcs[n] not in stored),
        "polling": polling,
        "drain_s": None if raw.drained_at is None else raw.drained_at - raw.load_end,
        "all_clients_caught_up": raw.caught_up,
        "frames": raw.frames,
        "closes": raw.closes,
        "cpu": raw.cpu,
        "writer": {
            "posts": w.posts,
            "busy": w.busy,
            "errors": w.errors,
            "late_ticks": w.late_ticks,
            "max_late_s": w.max_late_s,
        },
    }


def _node_b_state(node: NodeProcess) -> dict[str, Any]:
    """Node B's stream counters (``/metrics``) at the end."""
    streams: dict[str, float] = {}
    for line in httpx.get(f"{node.url}/metrics", timeout=30).text.splitlines():
        if line.startswith("chatsync_streams_"):
            name, _, value = line.rpartition(" ")
            streams[name.removeprefix("chatsync_")] = float(value)
    return {"streams": streams}


def log_problems(cluster: Cluster, keep: int = 8) -> dict[str, Any]:
    """Warnings, errors and tracebacks in the nodes' logs: counts and the first few lines."""
    out: dict[str, Any] = {}
    for node in cluster.nodes:
        try:
            lines = node.log_path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        bad = [
            line
            for line in lines
            if any(word in line for word in ("ERROR", "CRITICAL", "Traceback", "WARNING"))
        ]
        out[f"node{node.index}"] = {"lines": len(bad), "first": bad[:keep]}
    return out


# --- entry point ---------------------------------------------------------------------------


def run_push_bench(params: PushBenchParams, console: Console | None = None) -> dict[str, Any]:
    """Run every rate (and polling beside the lowest); print, save (JSON + PNG), return."""
    params.check()
    console = console or bench_console(log_width=200)
    load_before = loadavg()
    base = Path(tempfile.mkdtemp(prefix="chatsync-push-")) if params.data is None else params.data
    if params.data is not None:
        shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True, exist_ok=True)
    authors = Authors(params.writers + params.listeners)
    listener = [params.writers + n % params.listeners for n in range(params.clients)]
    every = params.clients / params.probes
    probe_at = {int(k * every) for k in range(params.probes)}
    notes: list[str] = []
    t0 = time.monotonic()
    try:
        with (
            Cluster(
                2, base, sync_interval_s=params.sync_interval_s, node_config=params.node_config
            ) as cluster,
            bench_progress(console, label_width=24) as progress,
        ):
            cluster.start()
            _wait_mesh(cluster)
            _post_joins(cluster, authors)
            b = cluster.nodes[1]
            who = [(listener[n], f"c{n}") for n in range(params.clients)]
            who += [(params.writers + n % params.listeners, f"p{n}") for n in range(params.pollers)]
            t = time.monotonic()
            tokens = _sign_in(b, authors, who, progress)
            sign_in_s = time.monotonic() - t
            stream_base = f"ws://127.0.0.1:{b.http_port}/users"
            clients = [
                StreamClient(
                    n,
                    f"{stream_base}/{authors.ids[listener[n]].hex()}/stream"
                    f"?access_token={quote(tokens[n])}",
                    probe=n in probe_at,
                )
                for n in range(params.clients)
            ]
            with WriterProcess() as writer:
                harness = Harness(
                    params, cluster, authors, clients, tokens[params.clients :], writer,
                    progress, console,
                )  # fmt: skip
                setup, memory, raws = trio.run(_measure, harness)
            stored = _stored_on(b)
            node_b = _node_b_state(b)
            node_b["log_problems"] = log_problems(cluster)
            runs = [_figures(params, raw, stored) for raw in raws]
    finally:
        if params.data is None:
            shutil.rmtree(base, ignore_errors=True)
    setup["sign_in_s"] = sign_in_s
    setup["elapsed_s"] = time.monotonic() - t0
    for name, problems in node_b["log_problems"].items():
        if problems["lines"]:
            notes.append(
                f"{name} logged {problems['lines']} warning/error lines; first: "
                + " | ".join(problems["first"][:3])
            )
    params_out = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(params).items()}
    params_out["rates"] = list(params.rates)
    report = build_report(params_out, setup, memory, runs, node_b, notes, load_before)
    report["plot"] = str(params.plot_path)
    print_report(console, report)
    save_report(console, report, params.out)
    plot_cdfs(report, params.plot_path)
    console.print(f"saved {params.plot_path}")
    return report
