"""The simulator on real PySpark (local[2], one session for the module): convergence, the oracle,
determinism across executor counts, and the planted bugs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import blake3
import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from sim.bugs import SCOPE_BUGS, Bug
from sim.cli import sim_app
from sim.hunt import SCOPED_SMALL, hunt
from sim.oracle import compute_oracle
from sim.report import write_report
from sim.runner import RunOutcome, run_simulation
from store.ops import MembershipAction, MembershipOp
from store.trace import read_header

from sim_support import SPARK_WARNINGS, brute_force_expected, brute_force_keys, small_trace

pytestmark = [pytest.mark.slow, *SPARK_WARNINGS]
CHATSYNC = str(Path(sys.executable).parent / "chatsync")


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_trace(2, tmp_path_factory.mktemp("spark") / "faulty.parquet")


@pytest.fixture(scope="module")
def outcome(spark: SparkSession, faulty: Path) -> RunOutcome:
    return run_simulation(spark, faulty, shards=2)


def test_a_small_faulty_trace_converges_and_is_reported(
    outcome: RunOutcome, tmp_path: Path
) -> None:
    r = outcome.result
    assert r["ok"] and r["converged"], r["check"]
    for name, domain in r["domains"].items():
        assert domain["distinct_roots"] == 1 and domain["equals_oracle"], name
        assert domain["oracle_count"] > 0, name
    assert r["nodes"]["poisoned"] and r["oracle"]["invalid_ops"] > 0  # a far-future clock ran
    rows, heal = r["rounds"]["rows"], outcome.header.heal_ms
    assert max(row[1] for row in rows if row[0] < heal) > 0  # the faults made replicas diverge
    assert r["quiet_at_ms"] is not None and r["quiet_at_ms"] >= heal
    assert r["stats"]["sync_records_applied"] > 0 and r["stats"]["gossip_dropped"] > 0
    # group keys: sealed messages and KEYS in the trace, both counters in the check and 0
    assert r["oracle"]["group_messages"] > 0 and r["oracle"]["keys_messages"] > 0
    assert r["check"]["undecryptable_for_member"] == r["check"]["readable_by_removed"] == 0
    assert outcome.timing["node_ops_per_s"] > 0

    paths = write_report(outcome, tmp_path / "report")
    assert json.loads(paths["json"].read_text())["result"] == json.loads(json.dumps(r))
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths["png"].stat().st_size > 20_000
    assert paths["summary"].read_text().startswith("OK: 5 nodes")


@pytest.mark.parametrize("seed", [2, 3])
def test_the_oracle_agrees_with_a_brute_force_fold(
    spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    path = small_trace(seed, tmp_path / "t.parquet")
    want = brute_force_expected(path)
    oracle = compute_oracle(spark, str(path), read_header(path))
    got = oracle.for_shard(0, 1)
    assert got.messages == want.messages and got.messages
    assert got.visible == want.visible and got.visible < got.messages  # some hidden
    assert got.member_ops == want.member_ops and got.member_ops
    assert got.members == want.members and any(not a for _, a in got.members.values())
    assert got.identities == want.identities and got.identities
    # message kinds: the deletes, what they erase, every chat's view
    assert got.deletes == want.deletes and got.deletes
    assert got.erased == want.erased and got.erased
    assert got.views == want.views and len(set(got.views.values())) == len(got.views)
    # group keys: the Spark job's count, the same fold over the trace decoded in Python
    keys = oracle.keys
    assert keys == brute_force_keys(path) and keys.group_messages and keys.keys_messages


def test_one_and_two_executors_give_the_same_result(
    outcome: RunOutcome, faulty: Path, tmp_path: Path
) -> None:
    out = tmp_path / "one"
    cmd = [CHATSYNC, "sim", "run", str(faulty), "--master", "local[1]", "--shards", "2"]
    done = subprocess.run(
        [*cmd, "--out", str(out), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["timing"]["default_parallelism"] == 1
    assert report["result"] == json.loads(json.dumps(outcome.result))


def test_every_planted_bug_is_caught_within_200_seeds(spark: SparkSession, tmp_path: Path) -> None:
    clean: dict[tuple[int, bool], bool] = {}
    for bug in Bug:
        found = hunt(spark, bug, max_seeds=200, workdir=tmp_path)
        assert found.caught_at is not None, bug
        assert found.caught_at <= 200
        # ... and the same seed without the bug passes: no false alarm.
        seed, scoped = found.caught_at, bug in SCOPE_BUGS
        if (seed, scoped) not in clean:
            made = SCOPED_SMALL if scoped else {}
            trace = small_trace(seed, tmp_path / f"clean-{seed}-{scoped}.parquet", **made)
            clean[seed, scoped] = run_simulation(spark, trace, shards=2).ok
        assert clean[seed, scoped], (bug, seed)


def test_a_failed_check_exits_1_with_the_seed_and_the_replay(
    spark: SparkSession, tmp_path: Path
) -> None:
    trace = small_trace(4, tmp_path / "t.parquet")
    cmd = ["run", str(trace), "--shards", "2", "--out", str(tmp_path / "r"), "--no-progress"]
    result = CliRunner().invoke(sim_app, [*cmd, "--plant", "no-max-offset"])
    assert result.exit_code == 1, result.output
    assert "FAILED" in result.stdout and "extra" in result.stdout
    assert "seed 4" in result.stderr
    assert "chatsync sim generate" in result.stderr and "--seed 4" in result.stderr
    assert f"chatsync sim run {trace}" in result.stderr and "--plant no-max-offset" in result.stderr
    assert (tmp_path / "r" / "report.json").exists()
    assert not spark.sparkContext._jsc.sc().isStopped()  # the CLI left our session running


def test_a_recorded_cluster_replays_to_the_cluster_s_own_roots(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``--trace-out`` on a real 2-node cluster (one node restarted: its recording carries
    over), ``chatsync sim merge``, then the replay: it converges, and its oracle's roots are
    the roots the real nodes reached. The authors are added to the group first; the last one
    is removed at the end (what it posted before stays stored and shown)."""
    from cluster.local import Cluster
    from cluster.scenario import GROUP, GROUP_PROOF, Authors

    authors = Authors(3)

    def member_op(user: int, action: MembershipAction) -> MembershipOp:
        key, stamp = authors.keys[0], authors.stamp(0)
        return MembershipOp.create(key, GROUP, authors.ids[user], action, stamp, proof=GROUP_PROOF)

    traces = tmp_path / "traces"
    with Cluster(2, tmp_path / "cluster", trace_dir=traces) as cluster:
        cluster.start()
        cluster.post_ops(0, [member_op(i, MembershipAction.ADD) for i in range(3)])
        cluster.post_ops(0, authors.messages(20, "on 0"))
        # Node 1 must hold the adds before its authors post there: a post no op admits yet
        # waits in memory, and the restart below would lose it (SIM.md, findings).
        for _ in range(300):
            if cluster.status(1)["domains"]["members"]["count"] == 3:
                break
            time.sleep(0.2)
        cluster.post_ops(1, authors.messages(15, "on 1", start=100))
        cluster.stop(1)
        cluster.restart(1)
        cluster.post_ops(1, authors.messages(10, "after restart", start=200))
        cluster.post_ops(1, [member_op(2, MembershipAction.REMOVE)])
        want, ops = 45, 4
        for _ in range(300):
            statuses = [cluster.status(i) for i in range(2)]
            if all(
                s["domains"]["messages"]["count"] == want
                and s["domains"]["members"]["count"] == ops
                for s in statuses
            ):
                break
            time.sleep(0.2)
        node_roots = {d: statuses[0]["domains"][d]["root"] for d in statuses[0]["domains"]}
        assert node_roots == {d: statuses[1]["domains"][d]["root"] for d in node_roots}
    merged = tmp_path / "recorded.parquet"
    result = CliRunner().invoke(
        sim_app, ["merge", str(traces / "node0.parquet"), str(traces / "node1.parquet"),
                  "-o", str(merged)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    header = read_header(merged)
    assert header.source == "recorded" and header.nodes == 2 and header.ops == want + ops
    replay = run_simulation(spark, merged, shards=2).result
    assert replay["ok"] and replay["converged"], replay["check"]
    for name, domain in replay["domains"].items():
        xor_hex, count = domain["oracle_root"].split(":")
        digest = blake3.blake3(bytes.fromhex(xor_hex) + int(count).to_bytes(8, "big")).hexdigest()
        assert digest == node_roots[name], name
    assert replay["domains"]["messages"]["oracle_count"] == want
    assert replay["oracle"]["messages_visible"] == want
