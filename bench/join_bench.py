"""``chatsync bench join``: how soon a ``--scope auto`` node serves a chat's first page after
one of its users is added to it (issue 33, SYNC.md "Joining").

Two node processes on loopback: node 0 holds everything (``--full``) and gets a group's
history (``--messages``, 10,000 by default) plus as many messages of other chats in other
shards (``--other``); node 1 runs ``--scope auto`` and serves Dana, who names it as her home
node and is in no chat. Then Dana is added to the group (the op posted to node 0) and the
clock starts: node 1 learns the op (gossip or sync), widens its scope to the group's shard,
starts sessions at once and catches up. Printed: seconds until node 1 serves Dana the
group's newest page (50 messages, equal to node 0's), until it holds the whole history, and
what it holds of the other chats (0: nothing outside its scope). The machine's load is
printed beside them: a figure of a shared machine.

``--dial``: the auto node is not connected to the holder at the start and must dial it
(``node/join_dials.py``). Three processes: node 0 the full holder, node 1 a middle node
holding one other shard (and Dana's user shard: her identity is put there too, so it carries
her add to node 2), node 2 the auto node, bootstrapped from node 1 only and kept to one
connection (``peers_low = peers_high = 1``: it dials nobody on its own); it hears of node 0
by peer exchange. Erin, a member of the group in Dana's user shard whose identity names node
0 as her home, is how node 2 learns where the group is held. The clock starts at the add, as
before: the figures include the dial.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import base58

from bench.console import bench_console, save_report
from bench.machine import loadavg, machine_info
from client.http import ChatsyncClient, ChatsyncClientError
from cluster.local import Cluster
from cluster.scenario import GROUP, Authors, wall_ms
from store import Hlc, MsgV1
from store.authz import new_group
from store.ops import MembershipAction, MembershipOp, Op, make_identity
from store.signing import key_from_seed, public_key, user_id_from_key
from sync.scope import DEFAULT_SHARDS, shard_of, user_shard_of

PAGE = 50
POST_BATCH = 500
DANA_KEY = key_from_seed(b"\x5d" * 32)
DANA = user_id_from_key(public_key(DANA_KEY))


def _in_danas_user_shard() -> bytes:
    """Erin's key seed: a user in Dana's user shard (``--dial``: Dana's home node indexes Erin
    too, and so learns from Erin's identity where the group is held)."""
    for n in range(100_000):
        seed = n.to_bytes(32, "big")
        user = user_id_from_key(public_key(key_from_seed(seed)))
        if user != DANA and user_shard_of(user, DEFAULT_SHARDS) == user_shard_of(DANA, DEFAULT_SHARDS):  # fmt: skip
            return seed
    raise RuntimeError("no key in Dana's user shard")


ERIN_KEY = key_from_seed(_in_danas_user_shard())
ERIN = user_id_from_key(public_key(ERIN_KEY))
LAST_ERROR: dict[str, str] = {}  # per node, why its last page was refused (in a timeout's text)


@dataclass(frozen=True)
class JoinParams:
    messages: int = 10_000
    other: int = 10_000
    timeout_s: float = 300.0
    out: Path = Path("bench-results/join.json")
    data: Path | None = None
    dial: bool = False  # the auto node is not connected to the holder: it must dial it


def _other_chat(authors: Authors) -> tuple[bytes, Op]:
    for n in range(1_000):
        proof = new_group(authors.keys[1], f"join-other-{n:05d}".encode())  # a 16-byte nonce
        if shard_of(proof.chat_id(), DEFAULT_SHARDS) != shard_of(GROUP, DEFAULT_SHARDS):
            add = MembershipOp.create(
                authors.keys[1], proof.chat_id(), authors.ids[1], MembershipAction.ADD,
                authors.stamp(1), proof=proof,
            )  # fmt: skip
            return proof.chat_id(), add
    raise RuntimeError("no chat in another shard")


def _post(cluster: Cluster, ops: list[Op]) -> None:
    for i in range(0, len(ops), POST_BATCH):
        cluster.post_ops(0, ops[i : i + POST_BATCH])


def _newest_page(client: ChatsyncClient) -> tuple[tuple[int, int], ...] | None:
    """The stamps of the chat's newest page, in order: the same on two nodes that hold the
    same history. (Not the ids: messages of equal stamps are ordered by each node's local
    sequence, which differs between nodes, so a page's last place may hold a different one
    of two equal-stamped messages — with 10,000 messages posted in batches that happened.)"""
    try:
        page = client.history(GROUP, limit=PAGE).messages
    except ChatsyncClientError as exc:
        LAST_ERROR[client.base_url] = str(exc)
        return None  # not a member here yet (the add has not arrived), or not held
    LAST_ERROR[client.base_url] = f"a page of {len(page)}"
    return tuple((m.msg.hlc.physical_ms, m.msg.hlc.logical) for m in page)


def run_join_bench(params: JoinParams) -> dict[str, Any]:
    console = bench_console(110)
    load_before = loadavg()
    base = params.data or Path(tempfile.mkdtemp(prefix="chatsync-join-"))
    if params.data is not None:
        shutil.rmtree(base, ignore_errors=True)
    authors = Authors(2)
    other, other_add = _other_chat(authors)
    config = {"author_ops_per_s": 1e6, "author_ops_burst": 1e6, "scope_check_interval_s": 0.2}
    joiner = 2 if params.dial else 1
    try:
        with Cluster(joiner + 1, base, sync_interval_s=2.0, node_config=config) as cluster:
            cluster.node_overrides[joiner] = {"scope_auto": True, "replication_factor": 0}
            if params.dial:
                _without_a_connection_to_the_holder(cluster, other)
            cluster.start()
            home = base58.b58decode(cluster.nodes[joiner].peer_id)
            erin = _erin(authors) if params.dial else []
            _post(cluster, [*authors.joins, other_add, *erin])
            if params.dial:  # Erin names node 0 her home node
                holder = base58.b58decode(cluster.nodes[0].peer_id)
                _post(cluster, [make_identity(ERIN_KEY, b"\x0e" * 32, Hlc(wall_ms()), [holder])])
            _post(cluster, authors.messages(params.messages, "history"))
            _post(cluster, [
                MsgV1.create(authors.keys[1], other, authors.stamp(1), f"o{i}".encode())
                for i in range(params.other)
            ])  # fmt: skip
            # Dana puts her identity at her home node, which indexes her and so serves her
            dana = make_identity(DANA_KEY, b"\x0d" * 32, Hlc(wall_ms()), [home])
            cluster.post_ops(joiner, [dana])
            if params.dial:  # the middle node indexes her too: it carries her add to node 2
                cluster.post_ops(1, [dana])
            roots = cluster.roots
            _wait(lambda: roots(joiner)["identity"] == roots(0)["identity"], 120)
            if params.dial:
                _wait(lambda: _knows_the_holder(cluster, joiner) and not _connected(cluster, joiner, 0), 60)  # fmt: skip
            held_before = cluster.roots(joiner)["messages"][1]
            add = MembershipOp.create(
                authors.keys[0], GROUP, DANA, MembershipAction.ADD, authors.stamp(0),
                proof=authors.joins[0].proof,  # type: ignore[union-attr]
            )  # fmt: skip
            with (
                ChatsyncClient(cluster.nodes[0].url, key=DANA_KEY) as full,
                ChatsyncClient(cluster.nodes[joiner].url, key=DANA_KEY) as auto,
            ):
                t0 = time.monotonic()
                cluster.post_ops(0, [add])
                expected = _wait(lambda: _newest_page(full), params.timeout_s)
                first_page_s = _wait_s(lambda: _newest_page(auto) == expected, t0, params.timeout_s)
                history_s = _wait_s(
                    lambda: roots(joiner)["messages"][1] >= params.messages, t0, params.timeout_s
                )
            time.sleep(2.0)
            held_after = cluster.roots(joiner)["messages"][1]
            dials = _join_dials(cluster, joiner)
    finally:
        if params.data is None:
            shutil.rmtree(base, ignore_errors=True)
    report = {
        "mode": "dial" if params.dial else "connected",
        "messages": params.messages,
        "other_chat_messages": params.other,
        "first_page_s": round(first_page_s, 2),
        "whole_history_s": round(history_s, 2),
        "held_before_join": held_before,
        "held_after_join": held_after,
        "join_dials": dials,
        "machine": machine_info(load_before),
    }
    mode = "not connected to the holder (dials it)" if params.dial else "holder connected"
    console.print(
        f"join ({mode}; join dials {dials}): a {params.messages:,}-message chat, its newest {PAGE} served "
        f"{first_page_s:.2f} s after the add, whole history {history_s:.2f} s; "
        f"held {held_before} before, {held_after:,} after (other chat: {params.other:,} "
        f"messages, none held); load {load_before} -> {loadavg()}"
    )
    save_report(console, report, params.out)
    return report


def _without_a_connection_to_the_holder(cluster: Cluster, other: bytes) -> None:
    """``--dial``: node 1 (the middle) bootstraps from node 0, node 2 (the auto node) from
    node 1 only, with one connection and no turnover; node 0 keeps one connection of its own
    (and turns over once an hour: it never dials node 2 on its own either)."""
    held = {shard_of(GROUP, DEFAULT_SHARDS), shard_of(other, DEFAULT_SHARDS)}
    middle = next(s for s in range(DEFAULT_SHARDS) if s not in held)
    cluster.bootstrap_of.update({1: [0], 2: [1]})
    cluster.node_overrides[0] = {"peers_low": 1, "peers_high": 3, "peer_exchange_interval_s": 3600.0}  # fmt: skip
    cluster.node_overrides[1] = {"scope_shards": [middle]}
    cluster.node_overrides[2].update(peers_low=1, peers_high=1, peer_exchange_interval_s=1.0)


def _erin(authors: Authors) -> list[Op]:
    """Erin's add to the group: a member in Dana's user shard (``ERIN_KEY``)."""
    proof = authors.joins[0].proof  # type: ignore[union-attr]
    stamp = authors.stamp(0)
    return [MembershipOp.create(authors.keys[0], GROUP, ERIN, MembershipAction.ADD, stamp, proof=proof)]  # fmt: skip


def _knows_the_holder(cluster: Cluster, index: int) -> bool:
    """Whether node ``index``'s peer book holds two peers (of three nodes: the middle one,
    and node 0 told of by peer exchange): ``known_peers`` by table, summed."""
    text = cluster.http.get(f"{cluster.nodes[index].url}/metrics").text
    rows = [line for line in text.splitlines() if line.startswith("chatsync_known_peers{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in rows) >= 2


def _connected(cluster: Cluster, index: int, other: int) -> bool:
    return cluster.nodes[other].peer_id in cluster.status(index)["connected_peers"]


def _join_dials(cluster: Cluster, index: int) -> dict[str, float]:
    """Node ``index``'s ``scope_join_dials_total`` by result."""
    text = cluster.http.get(f"{cluster.nodes[index].url}/metrics").text
    found = {}
    for line in text.splitlines():
        if line.startswith("chatsync_scope_join_dials_total{"):
            labels, value = line.rsplit(" ", 1)
            found[labels.split('"')[1]] = float(value)
    return found


def _wait(check: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.05)
    raise TimeoutError(f"not within {timeout_s} s (last refusals: {LAST_ERROR})")


def _wait_s(check: Any, t0: float, timeout_s: float) -> float:
    _wait(check, timeout_s)
    return time.monotonic() - t0
