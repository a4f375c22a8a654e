"""``chatsync bench scope``: partial replication against full replication, side by side
(issue 33): the same load on 9 node processes, once every node ``--full``, once every node
``--scope auto`` holding only its shards by the replication-factor rule (3 shards, R = 3:
each chat on 3 of the 9 nodes).

Per node, for each run: disk (the data directory's bytes once the load has converged), CPU
seconds of the node and its signature workers spent while the load was posted and spread,
CPU per network op (those seconds over the ops the network accepted), and the bytes its
libp2p connections moved (sent + received, from the kernel's per-socket counters: ``ss
-tin``, sockets on the nodes' p2p ports only, HTTP left out). Printed side by side, with the
partial run's per-node mean and worst node as ratios of the full run's (goal: ≤ 0.4). Both
runs gossip per shard (``gossip_sharded``); a partial node subscribes to its shards' topics.

The chats are spread evenly over the shards (``make_load``). Clients post each chat's messages to a node that holds it (in the partial run, one of its
shard's R holders, round robin; in the full run, any node, round robin). Convergence: every
node holds every message of the shards it holds (full: all). The machine's load is printed
beside the figures: ratios of one run survive a shared machine; absolute times do not.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

import base58
from rich.table import Table

from bench.console import bench_console, save_report
from bench.machine import loadavg, machine_info, process_cpu_s
from cluster.local import Cluster
from cluster.scenario import wall_ms
from store import HlcClock, MsgV1
from store.authz import new_group
from store.ops import MembershipAction, MembershipOp, Op
from store.records import Role
from store.signing import key_from_seed, public_key, user_id_from_key
from sync.scope import holders, replica_shards, shard_of

POST_BATCH = 300


@dataclass(frozen=True)
class ScopeBenchParams:
    nodes: int = 9
    shards: int = 3
    replication: int = 3
    chats: int = 30
    messages: int = 9_000
    timeout_s: float = 600.0
    out: Path = Path("bench-results/scope.json")
    data: Path | None = None


@dataclass
class Load:
    """The chats (each created by its own key, its creator its one member) and messages."""

    setup: list[MembershipOp]
    messages: list[MsgV1]
    chats: list[bytes]


def make_load(params: ScopeBenchParams) -> Load:
    """``chats`` groups spread evenly over the shards (the first names that fill each shard's
    share: 30 chats by name alone put 12, 9 and 9 in 3 shards, so a holder of the first held
    40 % of the load whatever the rule), their messages round robin."""
    clock = HlcClock()
    setup: list[MembershipOp] = []
    chats: list[bytes] = []
    keys = []
    share = [len(range(s, params.chats, params.shards)) for s in range(params.shards)]
    for i in count():
        if len(chats) == params.chats:
            break
        key = key_from_seed(i.to_bytes(2, "big") * 16)
        proof = new_group(key, f"scope-bench-{i:04d}".encode())
        shard = shard_of(proof.chat_id(), params.shards)
        if not share[shard]:
            continue
        share[shard] -= 1
        chats.append(proof.chat_id())
        keys.append(key)
        setup.append(
            MembershipOp.create(
                key, proof.chat_id(), user_id_from_key(public_key(key)), MembershipAction.ADD,
                clock.now(wall_ms()), Role.ADMIN, proof=proof,
            )
        )  # fmt: skip
    messages = [
        MsgV1.create(keys[n % len(chats)], chats[n % len(chats)], clock.now(wall_ms()), b"m" * 100)
        for n in range(params.messages)
    ]
    return Load(setup, messages, chats)


def run_scope_bench(params: ScopeBenchParams) -> dict[str, Any]:
    console = bench_console(120)
    load_before = loadavg()
    load = make_load(params)
    base = params.data or Path(tempfile.mkdtemp(prefix="chatsync-scope-"))
    shutil.rmtree(base, ignore_errors=True)
    try:
        runs = {
            mode: _run(params, load, base / mode, mode, console) for mode in ("full", "partial")
        }
    finally:
        if params.data is None:
            shutil.rmtree(base, ignore_errors=True)
    report = {
        "params": {k: str(v) for k, v in params.__dict__.items()},
        "runs": runs,
        "ratios": _ratios(runs),
        "machine": machine_info(load_before),
    }
    _print(console, report)
    save_report(console, report, params.out)
    return report


def _of_shards(ops: Sequence[MsgV1 | MembershipOp], shards: frozenset[int], n: int) -> int:
    """How many of ``ops`` lie in chats of ``shards``."""
    return sum(1 for op in ops if shard_of(op.chat_id, n) in shards)


def _run(
    params: ScopeBenchParams, load: Load, base: Path, mode: str, console: Any
) -> dict[str, Any]:
    partial = mode == "partial"
    config: dict[str, Any] = {
        "network_shards": params.shards, "gossip_sharded": True,
        "author_ops_per_s": 1e6, "author_ops_burst": 1e6,
        "replication_factor": params.replication, "scope_check_interval_s": 0.5,
        "scope_grace_s": 2.0, "peers_low": params.nodes - 1, "peers_high": params.nodes + 1,
    }  # fmt: skip
    with Cluster(params.nodes, base, sync_interval_s=2.0, node_config=config) as cluster:
        if partial:
            for i in range(params.nodes):
                cluster.node_overrides[i] = {"scope_auto": True}
        cluster.start()
        ids = [base58.b58decode(n.peer_id) for n in cluster.nodes]
        _wait(lambda: _meshed(cluster, params.nodes), params.timeout_s, "full mesh")
        shards_of = [
            replica_shards(node, ids, params.replication, params.shards)
            if partial
            else frozenset(range(params.shards))
            for node in ids
        ]
        if partial:  # each node took the rule's shards and dropped what it took while alone
            _wait(lambda: _scopes_settled(cluster, shards_of), params.timeout_s, "scopes")
        # member ops follow their chat: each posted to a node holding it (another answers
        # 421), and each node holds those of its shards' chats
        for node, batch in _by_holder(load.setup, params, ids, partial).items():
            cluster.post_ops(node, batch)
        want_ops = [_of_shards(load.setup, shards, params.shards) for shards in shards_of]
        _wait(lambda: [cluster.roots(i)["members"][1] for i in range(params.nodes)] == want_ops, params.timeout_s, "member ops")  # fmt: skip
        cpu0 = [process_cpu_s(_pid(n)) for n in cluster.nodes]
        bytes0 = _socket_bytes(cluster)
        t0 = time.monotonic()
        _post(cluster, load, params, ids, partial)
        expected = [_of_shards(load.messages, shards, params.shards) for shards in shards_of]
        _wait(
            lambda: [cluster.roots(i)["messages"][1] for i in range(params.nodes)] == expected,
            params.timeout_s, f"{mode}: every node holding its shards' messages",
        )  # fmt: skip
        spread_s = time.monotonic() - t0
        cpu = [process_cpu_s(_pid(n)) - c for n, c in zip(cluster.nodes, cpu0, strict=True)]
        moved = _socket_bytes(cluster)
        net = [moved.get(i, 0) - bytes0.get(i, 0) for i in range(params.nodes)]
        disk = [_du(n.data) for n in cluster.nodes]
    ops = len(load.messages)
    console.print(f"{mode}: {ops:,} messages spread in {spread_s:.1f} s; load {loadavg()}")
    return {
        "spread_s": round(spread_s, 2),
        "held_messages": expected,
        "shards_held": [len(s) for s in shards_of],
        "disk_bytes": disk,
        "cpu_s": [round(c, 3) for c in cpu],
        "cpu_ms_per_op": [round(1000 * c / ops, 4) for c in cpu],
        "net_bytes": net,
    }


def _post(
    cluster: Cluster, load: Load, params: ScopeBenchParams, ids: list[bytes], partial: bool
) -> None:
    for node, ops in _by_holder(load.messages, params, ids, partial).items():
        for i in range(0, len(ops), POST_BATCH):
            cluster.post_ops(node, ops[i : i + POST_BATCH])


def _by_holder(
    ops: Sequence[MsgV1 | MembershipOp], params: ScopeBenchParams, ids: list[bytes], partial: bool
) -> dict[int, list[Op]]:
    """Each chat's ops, in turn, to the nodes holding it (partial: its shard's holders by the
    R rule; full: every node, from the chat's own)."""
    chats = {chat: n for n, chat in enumerate(dict.fromkeys(op.chat_id for op in ops))}
    by_node: dict[int, list[Op]] = {}
    turn: dict[bytes, int] = {}
    for op in ops:
        k = turn[op.chat_id] = turn.get(op.chat_id, -1) + 1
        if partial:
            shard = shard_of(op.chat_id, params.shards)
            held_by = holders(shard, ids, params.replication, params.shards)
            target = ids.index(held_by[k % len(held_by)])
        else:
            target = (chats[op.chat_id] + k) % params.nodes
        by_node.setdefault(target, []).append(op)
    return by_node


def _meshed(cluster: Cluster, nodes: int) -> bool:
    return all(len(cluster.status(i)["connected_peers"]) >= nodes - 1 for i in range(nodes))


def _scopes_settled(cluster: Cluster, shards_of: list[frozenset[int]]) -> bool:
    for i, shards in enumerate(shards_of):
        metrics = cluster.http.get(f"{cluster.nodes[i].url}/metrics").text
        found = re.search(r"^chatsync_scope_shards (\d+)", metrics, re.M)
        if found is None or int(found.group(1)) != len(shards):
            return False
    return True


def _pid(node: Any) -> int:
    assert node.proc is not None
    pid: int = node.proc.pid
    return pid


SS_LINE = re.compile(r"127\.0\.0\.1:(\d+)\s+127\.0\.0\.1:(\d+).*?pid=(\d+)")


def _socket_bytes(cluster: Cluster) -> dict[int, int]:
    """Per node index: bytes sent + received on its libp2p connections (``ss -tinp``)."""
    out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True).stdout
    index_of = {_pid(n): n.index for n in cluster.nodes}
    p2p_ports = {n.p2p_port for n in cluster.nodes}
    totals: dict[int, int] = {}
    pairs: list[tuple[str, str]] = []  # (socket line, its indented info line)
    for line in out.splitlines():
        if line[:1].isspace() and pairs:
            pairs[-1] = (pairs[-1][0], pairs[-1][1] + line)
        else:
            pairs.append((line, ""))
    for head, info in pairs:
        found = SS_LINE.search(head)
        if found is None:
            continue
        local, peer, pid = (int(x) for x in found.groups())
        if int(pid) not in index_of or not ({local, peer} & p2p_ports):
            continue
        counted = sum(int(m.group(1)) for m in re.finditer(r"bytes_(?:acked|received):(\d+)", info))
        totals[index_of[pid]] = totals.get(index_of[pid], 0) + counted
    return totals


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _wait(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not within {timeout_s} s")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _ratios(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Partial over full, per measure: the per-node mean and the worst node."""
    full, part = runs["full"], runs["partial"]
    out = {}
    for key in ("disk_bytes", "cpu_ms_per_op", "net_bytes"):
        out[key] = {
            "mean": round(_mean(part[key]) / max(_mean(full[key]), 1e-9), 3),
            "worst_node": round(max(part[key]) / max(_mean(full[key]), 1e-9), 3),
        }
    return out


def _print(console: Any, report: dict[str, Any]) -> None:
    runs = report["runs"]
    table = Table(title="per node: full replication | partial (--scope auto, R rule)")
    table.add_column("node", justify="right")
    for what in ("shards", "disk MB", "CPU ms/op", "net MB"):
        table.add_column(f"{what} full", justify="right")
        table.add_column(f"{what} partial", justify="right")
    full, part = runs["full"], runs["partial"]
    for i in range(len(full["disk_bytes"])):
        table.add_row(
            str(i),
            str(full["shards_held"][i]), str(part["shards_held"][i]),
            f"{full['disk_bytes'][i] / 1e6:.1f}", f"{part['disk_bytes'][i] / 1e6:.1f}",
            f"{full['cpu_ms_per_op'][i]:.3f}", f"{part['cpu_ms_per_op'][i]:.3f}",
            f"{full['net_bytes'][i] / 1e6:.1f}", f"{part['net_bytes'][i] / 1e6:.1f}",
        )  # fmt: skip
    console.print(table)
    for key, ratio in report["ratios"].items():
        console.print(
            f"{key}: partial/full per node {ratio['mean']:.2f} (mean), "
            f"{ratio['worst_node']:.2f} (worst node); goal <= 0.4"
        )
    console.print(
        f"load: {report['machine']['loadavg_before']} -> {report['machine']['loadavg_after']}"
    )
