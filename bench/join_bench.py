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
from sync.scope import DEFAULT_SHARDS, shard_of

PAGE = 50
POST_BATCH = 500
DANA_KEY = key_from_seed(b"\x5d" * 32)
DANA = user_id_from_key(public_key(DANA_KEY))
LAST_ERROR: dict[str, str] = {}  # per node, why its last page was refused (in a timeout's text)


@dataclass(frozen=True)
class JoinParams:
    messages: int = 10_000
    other: int = 10_000
    timeout_s: float = 300.0
    out: Path = Path("bench-results/join.json")
    data: Path | None = None


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


def _newest_page(client: ChatsyncClient) -> frozenset[bytes] | None:
    """The ids of the chat's newest page (a set: messages of equal stamps are ordered by
    each node's local sequence, which differs between nodes)."""
    try:
        return frozenset(m.id for m in client.history(GROUP, limit=PAGE).messages)
    except ChatsyncClientError as exc:
        LAST_ERROR[client.base_url] = str(exc)
        return None  # not a member here yet (the add has not arrived), or not held


def run_join_bench(params: JoinParams) -> dict[str, Any]:
    console = bench_console(110)
    load_before = loadavg()
    base = params.data or Path(tempfile.mkdtemp(prefix="chatsync-join-"))
    if params.data is not None:
        shutil.rmtree(base, ignore_errors=True)
    authors = Authors(2)
    other, other_add = _other_chat(authors)
    config = {"author_ops_per_s": 1e6, "author_ops_burst": 1e6, "scope_check_interval_s": 0.2}
    try:
        with Cluster(2, base, sync_interval_s=2.0, node_config=config) as cluster:
            cluster.node_overrides[1] = {"scope_auto": True, "replication_factor": 0}
            cluster.start()
            home = base58.b58decode(cluster.nodes[1].peer_id)
            _post(cluster, [*authors.joins, other_add])
            _post(cluster, authors.messages(params.messages, "history"))
            _post(cluster, [
                MsgV1.create(authors.keys[1], other, authors.stamp(1), f"o{i}".encode())
                for i in range(params.other)
            ])  # fmt: skip
            # Dana puts her identity at her home node, which indexes her and so serves her
            cluster.post_ops(1, [make_identity(DANA_KEY, b"\x0d" * 32, Hlc(wall_ms()), [home])])
            _wait(lambda: cluster.roots(1)["identity"] == cluster.roots(0)["identity"], 120)
            held_before = cluster.roots(1)["messages"][1]
            add = MembershipOp.create(
                authors.keys[0], GROUP, DANA, MembershipAction.ADD, authors.stamp(0),
                proof=authors.joins[0].proof,  # type: ignore[union-attr]
            )  # fmt: skip
            with (
                ChatsyncClient(cluster.nodes[0].url, key=DANA_KEY) as full,
                ChatsyncClient(cluster.nodes[1].url, key=DANA_KEY) as auto,
            ):
                t0 = time.monotonic()
                cluster.post_ops(0, [add])
                expected = _wait(lambda: _newest_page(full), params.timeout_s)
                first_page_s = _wait_s(lambda: _newest_page(auto) == expected, t0, params.timeout_s)
                history_s = _wait_s(
                    lambda: cluster.roots(1)["messages"][1] >= params.messages, t0, params.timeout_s
                )
            time.sleep(2.0)
            held_after = cluster.roots(1)["messages"][1]
    finally:
        if params.data is None:
            shutil.rmtree(base, ignore_errors=True)
    report = {
        "messages": params.messages,
        "other_chat_messages": params.other,
        "first_page_s": round(first_page_s, 2),
        "whole_history_s": round(history_s, 2),
        "held_before_join": held_before,
        "held_after_join": held_after,
        "machine": machine_info(load_before),
    }
    console.print(
        f"join: a {params.messages:,}-message chat, its newest {PAGE} served "
        f"{first_page_s:.2f} s after the add, whole history {history_s:.2f} s; "
        f"held {held_before} before, {held_after:,} after (other chat: {params.other:,} "
        f"messages, none held); load {load_before} -> {loadavg()}"
    )
    save_report(console, report, params.out)
    return report


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
