"""``chatsync bench`` subcommands, and ``chatsync demo`` (the store demo; mounted at the root)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypeVar

import typer

from bench.demo import store_demo
from bench.store_bench import StoreBenchParams, run_store_bench
from bench.store_layouts import LayoutParams, run_store_layouts
from bench.sync_bench import SyncBenchParams, run_sync_bench
from store.records import DEFAULT_MAX_PAYLOAD

bench_app = typer.Typer(
    help="Benchmarks: side-by-side figures saved as JSON.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

DEFAULT_STORE_OUT = Path("bench-results/store.json")
# the benchmarks that start node processes keep their data here if asked
NodesData = Annotated[
    Path | None,
    typer.Option(help="Directory for the nodes' data (wiped first, kept); default: temporary."),
]
N = TypeVar("N", int, float)
PAGE_MIN = 50  # bench join: a chat of at least one full page


def parse_numbers(text: str, what: str, minimum: N, kind: type[N]) -> tuple[N, ...]:
    """Option ``what``'s comma-separated numbers: ``"10000,100_000"`` -> (10000, 100000)."""
    noun = "integer" if kind is int else "number"
    try:
        values = tuple(
            kind(part.strip().replace("_", "")) for part in text.split(",") if part.strip()
        )
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated {noun}s, got {text!r}") from None
    if not values or min(values) < minimum:
        raise ValueError(f"{what}: need at least one {noun}, each >= {minimum:g}, got {text!r}")
    return values


@bench_app.command("store")
def store(
    messages: Annotated[int, typer.Option(min=1, help="Signed messages to write.")] = 200_000,
    chats: Annotated[int, typer.Option(min=1, help="Chats to spread them over.")] = 100,
    batch: Annotated[
        int, typer.Option(min=1, help="Messages per put_messages / WriteBatch / transaction.")
    ] = 1000,
    payload: Annotated[
        int, typer.Option(min=0, max=DEFAULT_MAX_PAYLOAD, help="Payload bytes per message.")
    ] = 200,
    single: Annotated[
        int, typer.Option(min=1, help="Messages for the one-at-a-time runs (at most --messages).")
    ] = 20_000,
    out: Annotated[Path, typer.Option(help="JSON file to write.")] = DEFAULT_STORE_OUT,
    data: Annotated[
        Path | None,
        typer.Option(help="Directory for the databases (kept); default: a temporary one."),
    ] = None,
) -> None:
    """ChatDb vs raw rocksdict vs SQLite (RFC-0005): writes, range pages and chat lists."""
    params = StoreBenchParams(
        messages=messages,
        chats=chats,
        batch=batch,
        payload=payload,
        single=single,
        out=out,
        data=data,
    )
    run_store_bench(params)


@bench_app.command("store-layouts")
def store_layouts(
    messages: Annotated[int, typer.Option(min=1, help="Signed messages to write.")] = 200_000,
    chats: Annotated[int, typer.Option(min=1, help="Chats to spread them over.")] = 100,
    out: Annotated[Path, typer.Option(help="JSON file to write.")] = Path(
        "bench-results/store_layouts.json"
    ),
) -> None:
    """The folded page against the other goals: what a content copy or a CF apart would cost."""
    run_store_layouts(LayoutParams(messages=messages, chats=chats, out=out))


@bench_app.command("sync")
def sync(
    sizes: Annotated[
        str, typer.Option(help="Records in the union (n), comma-separated.")
    ] = "10000,100000,1000000",
    diffs: Annotated[
        str, typer.Option(help="Differences (d), comma-separated.")
    ] = "0,1,10,1000,10000",
    hash_width: Annotated[int, typer.Option(min=2, max=16, help="Bytes per salted node hash.")] = 4,
    seed: Annotated[int, typer.Option(help="Seed of the shared ids, records and splits.")] = 1,
    out: Annotated[Path, typer.Option(help="JSON file to write.")] = Path(
        "bench-results/sync.json"
    ),
    negentropy: Annotated[
        bool, typer.Option(help="Also run negentropy's reference code on each case (node).")
    ] = True,
    cpu_pairs: Annotated[
        int,
        typer.Option(
            min=1, help="Alternating sketch/cells sessions judging a goal case's CPU (median)."
        ),
    ] = 7,
) -> None:
    """Merkle anti-entropy per session: bytes and round trips against d x 32 B, naive lists, anchors."""
    try:
        params = SyncBenchParams(
            sizes=parse_numbers(sizes, "--sizes", 1, int),
            diffs=parse_numbers(diffs, "--diffs", 0, int),
            hash_width=hash_width,
            seed=seed,
            out=out,
            negentropy=negentropy,
            cpu_pairs=cpu_pairs,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if run_sync_bench(params)["failures"]:
        raise typer.Exit(1)


@bench_app.command("gossip")
def gossip(
    nodes: Annotated[int, typer.Option(min=2, max=20, help="Node processes on loopback.")] = 5,
    rate: Annotated[int, typer.Option(min=1, help="Offered ops/s, all nodes together.")] = 2000,
    seconds: Annotated[float, typer.Option(min=0.5, help="How long the load is offered.")] = 20.0,
    catchup: Annotated[
        int, typer.Option(min=0, help="Messages a stopped node misses, then catches up (0: skip).")
    ] = 1_000_000,
    unbatched: Annotated[
        bool,
        typer.Option(help="Also run the load with one op per gossip message (for the ratio)."),
    ] = True,
    floor: Annotated[
        bool,
        typer.Option(help="Also measure bare py-libp2p peers and ed25519 at this load."),
    ] = True,
    capacity: Annotated[
        bool,
        typer.Option(help="Also step the rate up on the batched cluster until p99 >= 1 s."),
    ] = True,
    capacity_start: Annotated[
        int, typer.Option(min=1, help="Capacity: the first rate (ops/s).")
    ] = 1000,
    capacity_step: Annotated[int, typer.Option(min=1, help="Capacity: added per step.")] = 500,
    capacity_seconds: Annotated[
        float, typer.Option(min=0.5, help="Capacity: load per step (s).")
    ] = 6.0,
    sync_interval: Annotated[
        float, typer.Option(min=0.5, help="Anti-entropy interval per peer (s).")
    ] = 10.0,
    catchup_timeout: Annotated[
        float,
        typer.Option(min=1.0, help="Catch-up: limit for the bulk ingest and for the catch-up (s)."),
    ] = 300.0,
    out: Annotated[Path, typer.Option(help="JSON file to write.")] = Path(
        "bench-results/gossip.json"
    ),
    data: NodesData = None,
) -> None:
    """N node processes: ops/s and latency to all nodes, capacity, catch-up; issue 18's goals."""
    from bench.gossip_bench import GossipBenchParams, run_gossip_bench
    from bench.gossip_capacity import CapacityParams

    params = GossipBenchParams(
        nodes=nodes,
        rate=rate,
        seconds=seconds,
        catchup=catchup,
        unbatched=unbatched,
        floor=floor,
        capacity=CapacityParams(start=capacity_start, step=capacity_step, seconds=capacity_seconds)
        if capacity
        else None,
        sync_interval_s=sync_interval,
        catchup_timeout_s=catchup_timeout,
        out=out,
        data=data,
    )
    report = run_gossip_bench(params)
    if not report["all_delivered"]:
        raise typer.Exit(1)


@bench_app.command("scale")
def scale(
    nodes: Annotated[
        str, typer.Option(help="Node counts, comma-separated (each 2..20), smallest first.")
    ] = "4,8,12,16,20",
    rate: Annotated[int, typer.Option(min=1, help="Offered ops/s, all nodes together.")] = 300,
    seconds: Annotated[float, typer.Option(min=0.5, help="How long the load is offered.")] = 20.0,
    idle: Annotated[
        float, typer.Option(min=1.0, help="Seconds of idle CPU measured before each load.")
    ] = 10.0,
    sync_interval: Annotated[
        float, typer.Option(min=0.5, help="Anti-entropy interval (s).")
    ] = 10.0,
    bootstrap_nodes: Annotated[
        int,
        typer.Option(
            min=0, help="Later nodes know only the first this many (0: every node before them)."
        ),
    ] = 1,
    out: Annotated[Path, typer.Option(help="JSON file to write (and a .png beside it).")] = Path(
        "bench-results/scale.json"
    ),
    data: NodesData = None,
) -> None:
    """The same load on growing clusters: per-node CPU, idle CPU, bytes, latency (issue 32)."""
    from bench.scale_bench import ScaleParams, run_scale_bench

    try:
        counts = tuple(int(n) for n in nodes.split(","))
    except ValueError:
        raise typer.BadParameter(f"--nodes {nodes!r}: comma-separated integers") from None
    if not counts or any(not 2 <= n <= 20 for n in counts) or list(counts) != sorted(counts):
        raise typer.BadParameter(f"--nodes {nodes!r}: each 2..20, smallest first")
    params = ScaleParams(
        nodes=counts, rate=rate, seconds=seconds, idle_s=idle, sync_interval_s=sync_interval,
        bootstrap_nodes=bootstrap_nodes or None, out=out, data=data,
    )  # fmt: skip
    report = run_scale_bench(params)
    if not all(row["all_delivered"] for row in report["rows"]):
        raise typer.Exit(1)


@bench_app.command("retention")
def retention(
    messages: Annotated[int, typer.Option(min=1, help="Messages to write, then GC.")] = 1_000_000,
    chats: Annotated[int, typer.Option(min=1, help="Chats to spread them over.")] = 1_000,
    aged: Annotated[
        float, typer.Option(min=0.01, max=0.99, help="Fraction older than the cutoff.")
    ] = 0.9,
    skews: Annotated[str, typer.Option(help="Waste grid: B's clock skew (s), comma-separated.")] = (
        "0,1,10,60,120"
    ),
    lags: Annotated[str, typer.Option(help="Waste grid: B's GC lag (s), comma-separated.")] = (
        "0,30,300"
    ),
    losses: Annotated[
        str, typer.Option(help="Waste grid: gossip loss fractions, comma-separated.")
    ] = "0,0.01",
    rate: Annotated[float, typer.Option(min=0.1, max=1000, help="Waste: stream msgs/s.")] = 20.0,
    window: Annotated[float, typer.Option(min=1, help="Waste: retention window W (s).")] = 60.0,
    period: Annotated[
        float, typer.Option(min=1, help="Waste: GC and sync period (s), above every lag.")
    ] = 360.0,
    sessions: Annotated[int, typer.Option(min=1, help="Waste: sync moments per case.")] = 6,
    out: Annotated[Path, typer.Option(help="JSON file to write.")] = Path(
        "bench-results/retention.json"
    ),
    data: Annotated[
        Path | None,
        typer.Option(help="Directory for the databases (removed after); default: temporary."),
    ] = None,
) -> None:
    """Retention GC of aged messages on ChatDb (time, disk), and sync waste under skew and GC lag."""
    from bench.retention_bench import (
        RetentionBenchParams,
        WasteParams,
        run_retention_bench,
    )

    try:
        params = RetentionBenchParams(
            messages=messages,
            chats=chats,
            aged_fraction=aged,
            waste=WasteParams(
                rate=rate,
                window_s=window,
                period_s=period,
                sessions=sessions,
                skews_s=parse_numbers(skews, "--skews", -1e9, float),
                lags_s=parse_numbers(lags, "--lags", 0.0, float),
                losses=parse_numbers(losses, "--losses", 0.0, float),
            ),
            out=out,
            data=data,
        )
        params.check()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if run_retention_bench(params)["failures"]:
        raise typer.Exit(1)


@bench_app.command("push")
def push(
    clients: Annotated[
        int, typer.Option(min=1, help="WebSocket streams held open on node B (probes among them).")
    ] = 1000,
    rates: Annotated[str, typer.Option(help="Offered ops/s, comma-separated: one load each.")] = (
        "100,1000"
    ),
    seconds: Annotated[float, typer.Option(min=0.5, help="How long each rate is offered.")] = 10.0,
    probes: Annotated[
        int, typer.Option(min=1, help="Clients that parse their frames and time every op.")
    ] = 20,
    pollers: Annotated[
        int, typer.Option(min=0, help="Devices polling the history during the lowest rate.")
    ] = 20,
    drain_timeout: Annotated[
        float, typer.Option(min=1, help="After a load: how long to wait for every op (s).")
    ] = 180.0,
    out: Annotated[Path, typer.Option(help="JSON file to write (the plot: same name, .png).")] = (
        Path("bench-results/push.json")
    ),
    data: NodesData = None,
) -> None:
    """2 node processes: push latency to C streams at each rate, RSS per connection, vs polling."""
    from bench.push_bench import PushBenchParams, run_push_bench

    try:
        params = PushBenchParams(
            clients=clients,
            rates=parse_numbers(rates, "--rates", 1, int),
            seconds=seconds,
            probes=probes,
            pollers=pollers,
            drain_timeout_s=drain_timeout,
            out=out,
            data=data,
        )
        params.check()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if not run_push_bench(params)["all_delivered"]:
        raise typer.Exit(1)


@bench_app.command("hostile")
def hostile(
    cycles: Annotated[int, typer.Option(min=1, help="Connect/disconnect cycles.")] = 1000,
    nosync_peers: Annotated[
        int, typer.Option(min=1, help="Peers without the sync protocol, connected at once.")
    ] = 100,
    nosync_window: Annotated[
        float, typer.Option(min=1, help="Seconds over which their log lines are counted.")
    ] = 60.0,
    flood_connections: Annotated[
        int, typer.Option(min=1, help="Connections held at once by the connection flood.")
    ] = 300,
    replay_rate: Annotated[
        int, typer.Option(min=1, help="Copies per second of a held op in the replay flood.")
    ] = 200,
    out: Annotated[Path, typer.Option(help="JSON file to write.")] = Path(
        "bench-results/hostile.json"
    ),
    data: NodesData = None,
) -> None:
    """A js-libp2p peer attacks fresh nodes: what honest peers still get (needs Node.js + npm)."""
    from bench.hostile_bench import HostileBenchParams, run_hostile_bench

    params = HostileBenchParams(
        cycles=cycles,
        nosync_peers=nosync_peers,
        nosync_window_s=nosync_window,
        flood_connections=flood_connections,
        replay_rate=replay_rate,
        out=out,
        data=data,
    )
    run_hostile_bench(params)


@bench_app.command("join")
def join(
    messages: Annotated[
        int, typer.Option(min=PAGE_MIN, help="The joined chat's history.")
    ] = 10_000,
    other: Annotated[
        int, typer.Option(min=0, help="Messages of a chat in another shard (never fetched).")
    ] = 10_000,
    out: Annotated[Path, typer.Option(help="JSON file to write.")] = Path(
        "bench-results/join.json"
    ),
    data: NodesData = None,
    dial: Annotated[
        bool,
        typer.Option(
            "--dial/--connected",
            help="The auto node starts unconnected to the holder and must dial it (3 nodes).",
        ),
    ] = False,
) -> None:
    """A --scope auto node's first page after its user joins a chat (issue 33, SYNC.md)."""
    from bench.join_bench import JoinParams, run_join_bench

    run_join_bench(JoinParams(messages=messages, other=other, out=out, data=data, dial=dial))


@bench_app.command("scope")
def scope(
    nodes: Annotated[int, typer.Option(min=3, max=20, help="Node processes per run.")] = 9,
    shards: Annotated[int, typer.Option(min=1, help="The network's shards.")] = 3,
    replication: Annotated[int, typer.Option(min=1, help="R: holders per shard.")] = 3,
    chats: Annotated[int, typer.Option(min=1, help="Chats the messages go to.")] = 30,
    messages: Annotated[int, typer.Option(min=1, help="Messages posted in each run.")] = 9_000,
    out: Annotated[Path, typer.Option(help="JSON file to write.")] = Path(
        "bench-results/scope.json"
    ),
    data: NodesData = None,
) -> None:
    """Partial replication (--scope auto, R rule) against full, the same load: per node
    disk, CPU per op and bytes, side by side (issue 33)."""
    from bench.scope_bench import ScopeBenchParams, run_scope_bench

    params = ScopeBenchParams(
        nodes=nodes, shards=shards, replication=replication, chats=chats, messages=messages,
        out=out, data=data,
    )  # fmt: skip
    run_scope_bench(params)


@bench_app.command("e2ee")
def e2ee(
    sizes: Annotated[str, typer.Option(help="Payload bytes per message, comma-separated.")] = (
        "100,1024,16384"
    ),
    iterations: Annotated[
        int, typer.Option(min=1, help="Calls of each per-message op per round.")
    ] = 2000,
    groups: Annotated[
        str, typer.Option(help="Members before a removal, comma-separated (each >= 2).")
    ] = "2,10,100,1000,5000",
    page: Annotated[
        int, typer.Option(min=1, max=200, help="Messages in the history page read from a node.")
    ] = 50,
    history_payload: Annotated[
        int, typer.Option(min=1, max=DEFAULT_MAX_PAYLOAD // 2, help="Bytes of each of them.")
    ] = 200,
    rounds: Annotated[
        int, typer.Option(min=1, help="Medians over this many rounds (page fetches: 20x as many).")
    ] = 5,
    out: Annotated[Path, typer.Option(help="JSON file to write (the plot: same name, .png).")] = (
        Path("bench-results/e2ee.json")
    ),
    data: NodesData = None,
) -> None:
    """Group encryption (issue 34): per message vs ed25519, per removal by group size, a page read."""
    from bench.e2ee_bench import E2eeBenchParams, run_e2ee_bench

    try:
        params = E2eeBenchParams(
            sizes=parse_numbers(sizes, "--sizes", 0, int),
            iterations=iterations,
            groups=parse_numbers(groups, "--groups", 2, int),
            page=page,
            history_payload=history_payload,
            rounds=rounds,
            out=out,
            data=data,
        )
        params.check()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    run_e2ee_bench(params)


def demo(
    data: str = typer.Option("./demo-data", help="RocksDB directory (wiped first)."),
    messages: int = typer.Option(10_000, min=1, help="Messages to write."),
    chats: int = typer.Option(20, min=1, help="Chats to spread them over."),
) -> None:
    """Store demo: write signed messages, members and identities, then page and list them."""
    store_demo(data, messages=messages, chats=chats)
