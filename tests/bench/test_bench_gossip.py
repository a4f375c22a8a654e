"""``chatsync bench gossip`` on tiny parameters: the JSON's shape and that every op arrived
everywhere (correctness, not timing: figures from a shared machine are never asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from bench.gossip_bench import GossipBenchParams, run_gossip_bench

RUN_FIELDS = {
    "offered_ops",
    "offered_ops_s",
    "acknowledged_ops",
    "posted_ops_s",
    "delivered_ops_s",
    "all_on_every_node",
    "drain_s",
    "converged",
    "counts",
    "expected_count",
    "latency_ms",
    "node_latency_ms",
    "via_gossip",
    "via_sync",
    "remote_deliveries",
    "gossip_messages_published",
    "ops_per_gossip_message",
    "node_cpu",
    "generator",
}


@pytest.mark.slow
def test_bench_gossip_tiny(tmp_path: Path) -> None:
    out = tmp_path / "results" / "gossip.json"
    params = GossipBenchParams(
        nodes=3,
        rate=150,
        seconds=2.0,
        catchup=300,
        sync_interval_s=2.0,
        drain_timeout_s=60.0,
        catchup_timeout_s=120.0,
        out=out,
        data=tmp_path / "data",
    )
    with (tmp_path / "log.txt").open("w") as log:
        report = run_gossip_bench(params, console=Console(file=log, width=140))

    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(report))
    assert saved["benchmark"] == "gossip"
    assert saved["params"]["nodes"] == 3
    assert set(saved["runs"]) == {"batched", "unbatched"}
    for name, run in saved["runs"].items():
        assert set(run) >= RUN_FIELDS, name
        assert run["offered_ops"] == 300
        assert run["acknowledged_ops"] == run["offered_ops"], name
        assert run["all_on_every_node"] and run["converged"], name
        assert run["counts"] == [run["expected_count"]] * 3, name
        # every remote copy came by gossip or by anti-entropy, none twice
        assert run["via_gossip"] + run["via_sync"] == run["remote_deliveries"], name
        for kind in ("end_to_end", "propagation", "origin_ack"):
            assert {"count", "p50", "p99", "max"} <= set(run["latency_ms"][kind])
        assert run["latency_ms"]["origin_ack"]["count"] == run["acknowledged_ops"]
    assert saved["runs"]["batched"]["ops_per_gossip_message"] >= 1
    assert saved["runs"]["unbatched"]["ops_per_gossip_message"] == 1
    catchup = saved["catchup"]
    assert catchup["caught_up"] and catchup["missed"] == 300
    assert catchup["count"] == catchup["expected_count"]
    # the restarted node's missed records came by anti-entropy, or (the newest ones, still in
    # GossipSub's message cache) by gossip IHAVE/IWANT: together, all of them
    assert catchup["sync_records_applied"] + catchup["gossip_ops_applied"] >= 300
    assert {"delivered_ops_s", "p99_unbatched_over_batched"} <= set(saved["ratios"])
    assert [g["goal"] for g in saved["goals"]][-1].startswith("catch-up of 300")
    assert saved["all_delivered"]
    floor = saved["floor"]  # bare py-libp2p peers moving the batched run's bytes
    assert floor["all_received"] and floor["peers"] == 3
    assert floor["ops_per_message"] == round(saved["runs"]["batched"]["ops_per_gossip_message"])
    assert floor["transport_us_per_op_per_peer"] > 0 and floor["verify_us_per_op"] > 0
    cores = floor["cores_at_rate"]
    assert cores["transport_and_verify"] == pytest.approx(cores["transport"] + cores["verify"])


def test_the_catch_up_goal_is_issue_4s_up_to_100k_then_60_s_per_million() -> None:
    from bench.gossip_report import catchup_goal_s

    assert catchup_goal_s(1_000) == catchup_goal_s(100_000) == 30.0
    assert catchup_goal_s(1_000_000) == 60.0
    assert catchup_goal_s(500_000) == 30.0
