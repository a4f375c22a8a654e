"""Differential test (issue 6, item 7): the Spark replay and the node's own code, in process,
end a small trace with the same roots.

Each trace runs twice: ``sim.runner`` on Spark (``store`` + ``sync`` with the simulator's
replica, gossip and retention models) and ``inprocess.py`` here (``node/``'s writer, gossip
validator, ``SyncService`` and GC on RocksDB, under trio's autojump clock), both walking the
same ``sim.schedule``. Every honest live
node of the in-process run must hold, per domain, the root the Spark replay's nodes hold and
the oracle computed. One Spark session for the module, as in ``test_spark_run``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from sim.generate import user_key
from sim.runner import RunOutcome, run_simulation
from store import trace as tr
from store.hlc import LOGICAL_BITS, Hlc
from store.ops import make_identity

from inprocess import InProcessResult, root_text, run_inprocess
from sim_support import SPARK_WARNINGS, small_trace

pytestmark = [pytest.mark.slow, *SPARK_WARNINGS]
DOMAINS = ("messages", "members", "identity", "deletes", "index")  # Domain order
# Every fault kind (partitions both ways, drop, dup, delay, crash, skew, far future, GC).
TRACES: dict[str, dict[str, Any]] = {
    "5 nodes, seed 2": {"seed": 2},
    "5 nodes, seed 5": {"seed": 5},
    "3 nodes, seed 3": {"seed": 3, "nodes": 3, "users": 12, "ops": 200},
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("differential")
    paths = {}
    for i, (name, args) in enumerate(TRACES.items()):
        overrides = {k: v for k, v in args.items() if k != "seed"}
        paths[name] = small_trace(args["seed"], folder / f"trace-{i}.parquet", **overrides)
    return paths


@pytest.fixture(scope="module")
def spark_runs(spark: SparkSession, traces: dict[str, Path]) -> dict[str, RunOutcome]:
    return {name: run_simulation(spark, path, shards=2) for name, path in traces.items()}


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """RocksDB directories, on tmpfs where there is one: each GC cycle compacts, and
    compactions fsync — seconds per run on a busy disk, nothing on tmpfs."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir=shm, prefix="chatsync-differential-") as path:
        yield Path(path)


def spark_node_roots(outcome: RunOutcome) -> dict[int, dict[str, str]]:
    """Per node, the Spark replay's whole-domain roots: its shards' roots by XOR and sum."""
    roots: dict[int, list[list[int]]] = {}
    for shard in outcome.shard_results:
        for row in shard["nodes"]:
            node = roots.setdefault(row["node"], [[0, 0] for _ in DOMAINS])
            for d, (xor, count) in enumerate(row["roots"]):
                node[d][0] ^= xor
                node[d][1] += count
    return {
        node: {name: root_text(*r) for name, r in zip(DOMAINS, per_domain, strict=True)}
        for node, per_domain in roots.items()
    }


@pytest.mark.parametrize("name", list(TRACES))
def test_the_node_in_process_ends_with_the_spark_replays_roots(
    name: str, traces: dict[str, Path], spark_runs: dict[str, RunOutcome], workdir: Path
) -> None:
    outcome = spark_runs[name]
    r = outcome.result
    assert r["ok"] and r["converged"], r["check"]
    node = run_inprocess(traces[name], workdir)
    assert node.converged, {d: node.distinct_roots(d) for d in DOMAINS}

    # The same nodes are checked: honest (never far ahead) and live at the end.
    spark_checked = set(range(r["nodes"]["total"])) - set(r["nodes"]["poisoned"])
    spark_checked -= set(r["nodes"]["down_at_end"])
    assert {n.node for n in node.checked} == spark_checked
    assert r["nodes"]["poisoned"]  # a far-future clock ran

    # Per node and domain: the in-process root = the Spark replay's = the oracle's.
    spark_roots = spark_node_roots(outcome)
    for n in node.checked:
        assert n.roots == spark_roots[n.node], n.node
        for domain in DOMAINS:
            assert n.roots[domain] == r["domains"][domain]["oracle_root"], (n.node, domain)
        assert n.visible == r["oracle"]["visible_root"], n.node  # what its readers are shown
        assert n.views == r["oracle"]["views_digest"], n.node  # edits, deletes, reactions...
        assert n.clock_ahead_ms <= outcome.header.max_offset_ms
    _assert_non_trivial(node, r)


def _assert_non_trivial(node: InProcessResult, spark_result: dict[str, Any]) -> None:
    """The roots cover real state, and the faults really hit the in-process nodes."""
    for domain in DOMAINS:
        assert spark_result["domains"][domain]["oracle_count"] > 0, domain
    assert spark_result["domains"]["messages"]["oracle_count"] >= 25
    s = node.stats
    assert s["ops_applied"] >= 190
    assert s["gossip_dropped"] > 0 and s["gossip_duplicated"] > 0
    assert s["gossip_rejected"] > 0  # far-future ops, refused by the gossip validator
    assert s["sessions_unreachable"] > 0  # partitions and crashes
    assert s["sessions_failed"] > 0  # connections cut mid-session
    assert s["sync_records_applied"] > 0  # anti-entropy repaired what gossip missed
    assert s["gc_messages_expired"] > 0
    assert s["crashes"] >= 1


def _without_one_kept_message(path: Path, out: Path) -> Path:
    """A copy of the trace without its newest valid message (the final GC keeps it)."""
    table = pq.read_table(path)
    header = tr.read_header(path)
    physical = pc.shift_right(table.column("hlc"), LOGICAL_BITS)
    valid_msg = pc.and_(
        pc.equal(table.column("kind"), tr.MSG),
        pc.less_equal(pc.subtract(physical, table.column("t_ms")), header.max_offset_ms),
    )
    newest = max(i for i, ok in enumerate(valid_msg.to_pylist()) if ok)
    keep = pa.array([i != newest for i in range(table.num_rows)])
    pq.write_table(table.filter(keep), out)  # the schema keeps the header metadata
    return out


def test_a_planted_difference_shows_in_the_roots(
    traces: dict[str, Path], spark_runs: dict[str, RunOutcome], tmp_path: Path, workdir: Path
) -> None:
    """The comparison is sharp: one message fewer in the in-process run changes its root."""
    name = "3 nodes, seed 3"
    want = spark_runs[name].result["domains"]
    planted = _without_one_kept_message(traces[name], tmp_path / "planted.parquet")
    node = run_inprocess(planted, workdir)
    assert node.converged
    (messages,) = node.distinct_roots("messages")
    assert messages != want["messages"]["oracle_root"]
    assert int(messages.split(":")[1]) == want["messages"]["oracle_count"] - 1
    for domain in ("members", "identity"):
        assert node.distinct_roots(domain) == {want[domain]["oracle_root"]}


def _with_far_future_identity(path: Path, out: Path) -> Path:
    """A copy of the trace in which the far-future node also puts an identity, a second after
    its clock jumped: an invalid op (the generator makes none), so the oracle is unchanged."""
    table = pq.read_table(path)
    rows = table.to_pylist()
    jump = next(r for r in rows if r["kind"] == tr.FAR_FUTURE)
    t = jump["t_ms"] + 1_000
    op = make_identity(
        user_key(tr.read_header(path).seed, 0), b"\x01" * 32, Hlc(t + jump["offset_ms"])
    )
    row: dict[str, Any] = dict.fromkeys(tr.COLUMNS)
    row.update(tr.op_columns(op), t_ms=t, seq=len(rows), node=jump["node"])
    rows = sorted([*rows, row], key=lambda r: (r["t_ms"], r["seq"]))
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), out)
    return out


def test_a_far_future_identity_does_not_spread_by_sync(
    traces: dict[str, Path], spark_runs: dict[str, RunOutcome], tmp_path: Path, workdir: Path
) -> None:
    """Gossip validators refuse it; sessions with the far-future node must not bring it in."""
    name = "3 nodes, seed 3"
    want = spark_runs[name].result["domains"]["identity"]["oracle_root"]
    planted = _with_far_future_identity(traces[name], tmp_path / "far-future.parquet")
    node = run_inprocess(planted, workdir)
    assert node.stats["gossip_rejected"] > 0
    assert node.distinct_roots("identity") == {want}
