"""``chatsync bench gossip`` on tiny parameters: the JSON's shape and that every op arrived
everywhere (correctness, not timing: figures from a shared machine are never asserted)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from bench.gossip_bench import GossipBenchParams, run_gossip_bench
from bench.gossip_capacity import CapacityParams, run_capacity
from bench.gossip_goals import build_goals

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
GOAL_IDS = [
    "cpu_over_floor",
    "via_gossip",
    "latency_p50",
    "latency_max",
    "latency_p99",
    "delivered_ops_s",
    "capacity",
    "catchup_s",
    "rss_mb",
]
GOAL_FIELDS = {"id", "goal", "target", "limit", "unit", "measured", "met", "note"}
STEP_FIELDS = {"rate", "delivered_ops_s", "p50_ms", "p99_ms", "max_ms", "cores", "holds"}


@pytest.mark.slow
def test_bench_gossip_tiny(tmp_path: Path) -> None:
    out = tmp_path / "results" / "gossip.json"
    params = GossipBenchParams(
        nodes=3,
        rate=150,
        seconds=2.0,
        catchup=300,
        capacity=CapacityParams(start=150, step=150, max_rate=300, seconds=1.5),
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
    # every node's memory after the catch-up, each holding every message
    assert catchup["node_counts"] == [catchup["expected_count"]] * 3
    assert len(catchup["rss_mb"]) == 3 and min(catchup["rss_mb"]) > 0
    # measured at rest: the restarted node's signature workers (if its frames started any) gone
    assert catchup["workers_exit_s"] is not None
    assert catchup["catchup_peak_rss_mb"] > 0
    assert [parts["rss"] > parts["block_cache"] for parts in catchup["memory_mb"]] == [True] * 3
    capacity = saved["capacity"]  # stepped 150, 300 ops/s on the batched cluster
    assert [s["rate"] for s in capacity["steps"]][:1] == [150]
    for step in capacity["steps"]:
        assert set(step) >= STEP_FIELDS
        assert step["acknowledged_ops"] == step["offered_ops"] == round(step["rate"] * 1.5)
    assert capacity["all_delivered"]
    assert capacity["rate"] in (None, *[s["rate"] for s in capacity["steps"] if s["holds"]])
    goals = {g["id"]: g for g in saved["goals"]}
    assert list(goals) == GOAL_IDS
    for goal in saved["goals"]:
        assert set(goal) >= GOAL_FIELDS, goal["id"]
    # the CPU goal is judged at any load; the others only at 2,000 ops/s x 5 nodes and 1M
    assert isinstance(goals["cpu_over_floor"]["met"], bool)
    assert goals["cpu_over_floor"]["measured"] == saved["floor"]["node_over_floor"]
    for name in ("via_gossip", "latency_p50", "latency_max", "delivered_ops_s", "capacity"):
        assert goals[name]["met"] is None, name
    assert goals["via_gossip"]["measured"] == pytest.approx(
        100 * saved["runs"]["batched"]["via_gossip"] / saved["runs"]["batched"]["remote_deliveries"]
    )
    assert goals["catchup_s"]["measured"] == catchup["catchup_s"]
    assert goals["rss_mb"]["measured"] == max(catchup["rss_mb"])
    for name in ("catchup_s", "rss_mb"):
        assert goals[name]["met"] is None and "not measured at 1M" in goals[name]["note"]
    log = (tmp_path / "log.txt").read_text()
    assert "goals (issue 18" in log and "capacity: " in log
    assert saved["all_delivered"]
    floor = saved["floor"]  # bare py-libp2p peers moving the batched run's bytes
    assert floor["all_received"] and floor["peers"] == 3
    assert floor["ops_per_message"] == round(saved["runs"]["batched"]["ops_per_gossip_message"])
    assert floor["transport_us_per_op_per_peer"] > 0 and floor["verify_us_per_op"] > 0
    cores = floor["cores_at_rate"]
    assert cores["transport_and_verify"] == pytest.approx(cores["transport"] + cores["verify"])
    # beside it, storing the same kind of ops: floor + storing, and the node over that
    base = floor["transport_us_per_op_per_peer"] + floor["verify_us_per_op"]
    assert floor["store_us_per_op"] > 0 and floor["store_ops"] == 300
    assert floor["floor_and_store_us"] == pytest.approx(base + floor["store_us_per_op"])
    assert floor["node_over_floor_and_store"] == pytest.approx(
        floor["node_us_per_op_per_node"] / floor["floor_and_store_us"]
    )
    assert "floor + storing" in log


# --- the goals and the capacity stepping, on made-up figures (fast) ---------------------------


def fake_run(rate: int, p50: float, p99: float | None, top: float | None) -> dict[str, Any]:
    """A load run's figures as ``_offer`` returns them, as far as the goals read them."""
    return {
        "offered_ops": rate * 6,
        "acknowledged_ops": rate * 6,
        "delivered_ops_s": float(rate),
        "all_on_every_node": p99 is not None,
        "drain_s": 0.5,
        "latency_ms": {"end_to_end": {"p50": p50, "p99": p99, "max": top}},
        "remote_deliveries": rate * 6 * 4,
        "via_gossip": rate * 6 * 4 - 10,
        "node_cpu": {"cores_until_drained": rate / 1000, "until_drained_s": rate * 6 / 1000},
    }


def test_capacity_steps_until_p99_fails() -> None:
    p99s = {1000: 400.0, 1500: 800.0, 2000: 1200.0, 2500: 300.0}
    tried: list[int] = []

    def measure(rate: int) -> dict[str, Any]:
        tried.append(rate)
        return fake_run(rate, 100.0, p99s[rate], 2000.0)

    capacity = run_capacity(Console(file=io.StringIO()), CapacityParams(), measure)
    assert tried == [1000, 1500, 2000]  # the first step that fails ends the stepping
    assert capacity["rate"] == 1500 and capacity["stopped_by"] == "p99 >= 1,000 ms"
    assert capacity["ops_s_per_core"] == pytest.approx(1000)
    # the first step fails: the rate steps down until one holds (or none is left)
    down = run_capacity(
        Console(file=io.StringIO()),
        CapacityParams(start=1000, step=300),
        lambda r: fake_run(r, 1.0, 500.0 if r <= 400 else None, 900.0),
    )
    assert [s["rate"] for s in down["steps"]] == [1000, 700, 400]
    assert down["rate"] == 400 and down["stopped_by"].startswith("not every op")
    none_held = run_capacity(
        Console(file=io.StringIO()), CapacityParams(), lambda r: fake_run(r, 1.0, None, None)
    )
    assert [s["rate"] for s in none_held["steps"]] == [1000, 500]
    assert none_held["rate"] is None


def test_goals_judged_at_the_goal_load() -> None:
    params = {"rate": 2000, "nodes": 5}
    batched = fake_run(2000, 150.0, 500.0, 700.0)
    floor = {"node_over_floor": 1.2}
    capacity = {"rate": 2500, "cores": 1.5, "ops_s_per_core": 1700.0, "steps": []}
    catchup = {
        "missed": 1_000_000,
        "catchup_s": 75.0,
        "expected_count": 1_040_000,
        "node_counts": [1_040_000, 1_040_000, 1_040_000, 90_000],
        "rss_mb": [250.0, 260.0, 240.0, 280.0],  # the last one did not catch up: not counted
    }
    goals = {g["id"]: g for g in build_goals(params, batched, floor, capacity, catchup)}
    assert list(goals) == GOAL_IDS
    met = {name: goal["met"] for name, goal in goals.items()}
    assert met == {
        "cpu_over_floor": True,
        "via_gossip": True,  # 47,990 of 48,000
        "latency_p50": True,
        "latency_max": False,  # 700 ms
        "latency_p99": True,
        "delivered_ops_s": True,
        "capacity": True,
        "catchup_s": False,  # 75 s
        "rss_mb": True,  # the max over the nodes holding every message: 260 MB
    }
    assert goals["rss_mb"]["measured"] == 260.0
    # an op some node never logged: the latency is infinite (None), measured and missed
    lost = fake_run(2000, 150.0, None, None)
    goals = {g["id"]: g for g in build_goals(params, lost, None, None, None)}
    assert goals["latency_max"]["met"] is False and goals["latency_max"]["measured"] is None
    assert goals["cpu_over_floor"]["met"] is None  # no floor run
    assert goals["capacity"]["met"] is None and goals["catchup_s"]["met"] is None
