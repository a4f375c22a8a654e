"""Partial replication in the simulator (issue 33): scopes from the generator, the replay's
sessions and gossip per scope, the per-chat check and its two planted bugs.

The oracle runs once on Spark (``local[2]``); the replays run in this process, shard by
shard, through ``sim.engine`` (the same code a Spark task runs) and ``sim.runner.combine``.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import blake3
import pytest
from pyspark.sql import SparkSession

from sim.bugs import Bug
from sim.engine import ShardTask, run_shard
from sim.handover import Handovers
from sim.hunt import SCOPED_SMALL, small_trace
from sim.oracle import Oracle, compute_oracle
from sim.runner import combine
from sim.scopes import (
    GRACE_MS,
    LEARN_MS,
    ChatEvent,
    ScopeParams,
    node_id,
    plan_scopes,
    rendezvous,
    split_group,
)
from store import trace as tr
from sync.scope import holders

from sim_support import SPARK_WARNINGS

SHARDS = 2


def spark_test(test: Any) -> Any:
    """Slow, as every Spark test (the oracle runs on ``local[2]``)."""
    for mark in (pytest.mark.slow, *SPARK_WARNINGS):
        test = mark(test)
    return test


# The scaled run in small: 30 nodes, 60 chats over 512 shards, every fault kind; each node
# holds a few percent of the chats.
SCALED_SMALL: dict[str, Any] = {
    **SCOPED_SMALL,
    "nodes": 30,
    "users": 120,
    "chats": 60,
    "ops": 600,
    "scope_shards": 512,
    "replication": 3,
}


def test_pins_are_the_r_nearest_nodes_by_rendezvous_hashing() -> None:
    for shard in (0, 7, 4095):
        key = b"chatsync/holders/v1\x00" + (4096).to_bytes(2, "big") + shard.to_bytes(2, "big")
        ranked = sorted(range(50), key=lambda n: blake3.blake3(key + n.to_bytes(4, "big")).digest())
        assert rendezvous(shard, 50, 3, 4096) == sorted(ranked[:3])
    assert rendezvous(1, 2, 3, 64) == [0, 1]  # fewer nodes than R: all of them


def test_a_scope_grows_after_an_add_and_shrinks_after_the_grace_period() -> None:
    nodes, user = 10, 13  # user 13's home node is 3
    events = [
        ChatEvent(1_000, 0, tr.MEMBER_ADD, chat=0, shard=5, target=user),
        ChatEvent(2_000, 0, tr.MEMBER_ADD, chat=1, shard=5, target=user),  # same shard
        ChatEvent(10_000, 0, tr.MEMBER_REMOVE, chat=0, shard=5, target=user),
        ChatEvent(20_000, 0, tr.MEMBER_LEAVE, chat=1, shard=5, target=user),
        ChatEvent(25_000, 6, tr.MSG, chat=2, shard=9),  # node 6 makes a message: holds for good
    ]
    out = plan_scopes(events, {5, 9}, nodes, ScopeParams(64, 1))
    pins = {n: set(group) for _, n, group in out[:nodes]}  # each node's first event
    assert sorted(pins) == list(range(nodes)) and {t for t, _, _ in out[:nodes]} == {1_000}
    assert sum(len(p) for p in pins.values()) == 2  # shards 5 and 9, R = 1 each
    node3 = [(t, set(g) - pins[3]) for t, n, g in out[nodes:] if n == 3]
    # learned 2 s after the add; kept while chat 1 still has the user; dropped a grace later
    assert node3 == [(1_000 + LEARN_MS, {5}), (20_000 + GRACE_MS, set())]
    node6 = [(t, set(g) - pins[6]) for t, n, g in out[nodes:] if n == 6]
    assert node6 == ([] if 9 in pins[6] else [(25_000, {9})])
    # node 0 wrote the member ops: it holds their chat's shard from the first, for good
    node0 = [(t, set(g) - pins[0]) for t, n, g in out[nodes:] if n == 0]
    assert node0 == ([] if 5 in pins[0] else [(1_000, {5})])


@pytest.fixture(scope="module")
def scaled(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    path = small_trace(1, tmp_path_factory.mktemp("scoped") / "t.parquet", **SCALED_SMALL)
    header = tr.read_header(path)
    yield path, header, compute_oracle(spark, str(path), header)


def _replay(path: Path, header: tr.TraceHeader, oracle: Oracle, plant: str | None) -> Any:
    results = [
        run_shard(ShardTask(s, SHARDS, str(path), plant, oracle.for_shard(s, SHARDS)))
        for s in range(SHARDS)
    ]
    return combine(header, oracle, results, shards=SHARDS, plant=plant), results


@spark_test
def test_a_scoped_trace_converges_on_every_chat_and_nothing_outside_a_scope(scaled: Any) -> None:
    path, header, oracle = scaled
    result, _ = _replay(path, header, oracle, None)
    assert result["ok"], (result["check"], result["failing_nodes"][:3])
    check, scopes = result["check"], result["scopes"]
    assert check["out_of_scope_held"] == check["under_replicated"] == 0
    assert check["chats_diverged"] == 0
    assert scopes["chats"] == SCALED_SMALL["chats"]
    assert scopes["holders_min"] >= SCALED_SMALL["replication"]
    # writers' user shards were handed over, every one on the checked nodes (sim/handover.py)
    assert result["stats"]["index_handovers"] > 0
    assert result["stats"]["index_unhanded_at_end"] == 0
    # partial: a node holds a few of the shards in use, and some scopes grew and shrank
    final = oracle.final_scopes
    used = {s for g in final.values() for s in g}
    assert sum(len(g) for g in final.values()) / len(final) < len(used) / 4
    trace = tr.read_trace(path, ["kind", "node", "group"])
    sizes: dict[int, list[int]] = {}
    for kind, node, group in zip(
        *(trace.table.column(c).to_pylist() for c in ("kind", "node", "group")), strict=True
    ):
        if kind == tr.SCOPE:
            sizes.setdefault(node, []).append(len(group))
    steps = [b - a for s in sizes.values() for a, b in pairwise(s)]
    assert any(d > 0 for d in steps) and any(d < 0 for d in steps)


@spark_test
@pytest.mark.parametrize(
    ("bug", "seen"),
    [
        (Bug.SCOPE_FORGETS_CHAT, ("lost", "chats_diverged")),
        (Bug.SESSION_BEYOND_INTERSECTION, ("out_of_scope_held", "extra")),
    ],
)
def test_each_scope_bug_is_caught(scaled: Any, bug: Bug, seen: tuple[str, ...]) -> None:
    path, header, oracle = scaled
    result, _ = _replay(path, header, oracle, bug.value)
    assert not result["ok"]
    assert all(result["check"][c] > 0 for c in seen), result["check"]


@pytest.mark.parametrize(
    ("nodes", "r", "shards"),
    [(5, 3, 64), (40, 3, 4096), (7, 1, 256), (2, 3, 16), (9, 3, 3), (5, 3, 3)],
)
def test_the_restated_holders_rule_is_the_nodes(nodes: int, r: int, shards: int) -> None:
    """``sim.scopes.rendezvous`` restates ``sync.scope.holders`` (the oracle stays apart from
    the code it checks): both pick the same nodes for every shard."""
    ids = [node_id(n) for n in range(nodes)]
    for shard in range(shards):
        ours = {node_id(n) for n in rendezvous(shard, nodes, r, shards)}
        assert ours == set(holders(shard, ids, r, shards)), shard


def test_a_node_holds_its_served_users_user_shards_and_not_in_the_trace_those_it_writes_for() -> (
    None
):
    """``S + u`` in a scope event's group is user shard ``u``: a home node holds its users'
    from the start. The user shard a member op or an identity names is held by its writer
    until a session hands it over (the replay's: ``sim.handover``), so not in the trace."""
    nodes, s = 4, 64
    user_shards = [10, 11, 12, 13, 14]  # user u's user shard; user u's home node is u % 4
    events = [
        ChatEvent(1_000, 2, tr.MEMBER_ADD, chat=0, shard=5, target=4),
        ChatEvent(2_000, 3, tr.IDENTITY, chat=-1, shard=-1, target=1),
    ]
    out = plan_scopes(events, {5}, nodes, ScopeParams(s, 0), user_shards)
    first = {n: split_group(g, s) for _, n, g in out[:nodes]}
    assert first[0][1] == {10, 14} and first[1][1] == {11} and first[3][1] == {13}
    later = sorted((t, n, split_group(g, s)) for t, n, g in out[nodes:])
    assert later == [
        # node 2 wrote the add of user 4: the chat's shard, for good (not user 4's shard)
        (1_000, 2, (frozenset({5}), frozenset({12}))),
        # user 4's home node learns the add (its user shard it held from the start)
        (1_000 + LEARN_MS, 0, (frozenset({5}), frozenset({10, 14}))),
    ]


def test_a_writes_user_shard_is_kept_over_a_cut_until_a_session_hands_it_over() -> None:
    """The lost index entries of the scaled runs (SIM.md, "Findings and limits"): node 0
    writes for user shard 7, which nodes 1 and 2 keep; a cut longer than the grace, and no
    session: it stays. A session with node 3, which does not keep it, hands nothing over;
    one with node 1 does, and the grace after it ends the hold."""
    book = Handovers(4, 64, GRACE_MS)
    book.kept = [frozenset(), frozenset({7}), frozenset({7}), frozenset()]
    alive = [True] * 4
    assert book.wrote_for(0, 7, 1_000)
    assert not book.wrote_for(1, 7, 1_000)  # its own: kept for good, nothing to hand over
    assert book.step(1_000 + 10 * GRACE_MS, alive) == [] and book.held(0) == {7}
    book.reconciled(0, 3, frozenset({7}), 2_000_000)
    assert book.unhanded(range(4)) == 1
    book.reconciled(1, 0, frozenset({7}), 2_000_000)
    assert book.unhanded(range(4)) == 0 and book.handed_over == 1
    assert book.step(2_000_000 + GRACE_MS - 1, alive) == []
    assert book.step(2_000_000 + GRACE_MS, alive) == [0] and book.held(0) == frozenset()


def test_a_restarted_writer_hands_over_again() -> None:
    book = Handovers(2, 64, GRACE_MS)
    book.kept = [frozenset(), frozenset({7})]
    book.wrote_for(0, 7, 1_000)
    book.reconciled(0, 1, frozenset({7}), 2_000)
    book.restarted(0, 3_000)  # it does not know what it handed over
    assert book.settle(3_000, [True, True]) == [] and book.held(0) == {7}
    book.reconciled(0, 1, frozenset({7}), 4_000)
    assert book.settle(4_000, [True, True]) == [0]
