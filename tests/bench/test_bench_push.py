"""``chatsync bench push`` on tiny parameters, through its command: the JSON's shape and that
every probe and every poller got every op (correctness, not timing: figures from a shared
machine are never asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import build_app

pytestmark = pytest.mark.slow

RUN_FIELDS = {
    "rate",
    "clients",
    "probes",
    "offered_ops",
    "acknowledged_ops",
    "load_s",
    "posted_ops_s",
    "push",
    "b_hop_ms",
    "gossip_hop_ms",
    "not_in_b_arrival_log",
    "polling",
    "ratios",
    "drain_s",
    "all_clients_caught_up",
    "frames",
    "closes",
    "cpu",
    "writer",
}
LATENCY_FIELDS = {"count", "never", "p50", "p99", "max"}


def test_bench_push_tiny(tmp_path: Path) -> None:
    out = tmp_path / "results" / "push.json"
    args = [
        "bench", "push", "--clients", "20", "--rates", "50", "--seconds", "3", "--probes", "4",
        "--pollers", "1", "--drain-timeout", "30", "--out", str(out),
        "--data", str(tmp_path / "data"),
    ]  # fmt: skip
    result = CliRunner().invoke(build_app(), args)
    assert result.exit_code == 0, result.output

    saved = json.loads(out.read_text())
    assert saved["benchmark"] == "push"
    assert saved["params"]["clients"] == 20 and saved["params"]["rates"] == [50]
    assert {"cpu_count", "python", "loadavg_before", "loadavg_after"} <= set(saved["machine"])
    assert saved["setup"]["clients_streaming"] == 20
    memory = saved["memory"]
    assert memory["clients"] == 20
    assert memory["rss_before_kib"] > 0 and memory["rss_idle_kib"] > 0
    assert memory["kib_per_connection"] == pytest.approx(
        (memory["rss_idle_kib"] - memory["rss_before_kib"]) / 20
    )
    assert len(memory["rss_after_runs_kib"]) == 1
    [run] = saved["runs"]
    assert set(run) >= RUN_FIELDS
    assert run["rate"] == 50 and run["clients"] == 20 and run["probes"] == 4
    assert run["offered_ops"] == 150
    assert run["acknowledged_ops"] == run["offered_ops"]
    push = run["push"]
    # every probe got every op: all (op, probe) pairs timed, none missing
    assert push["delivered"] == push["expected"] == 150 and push["missing"] == 0
    assert push["per_probe_min"] == 150
    assert set(push["latency_ms"]) >= LATENCY_FIELDS | {"cdf"}
    assert push["latency_ms"]["count"] == 150 * 4 and push["latency_ms"]["never"] == 0
    assert push["latency_ms_of_received"]["count"] == 150 * 4
    assert run["all_clients_caught_up"] and run["drain_s"] is not None
    assert set(run["b_hop_ms"]) >= LATENCY_FIELDS and set(run["gossip_hop_ms"]) >= LATENCY_FIELDS
    polling = run["polling"]
    assert polling["pollers"] == 1
    assert polling["delivered"] == polling["expected"] == 150 and polling["missing"] == 0
    assert polling["latency_ms"]["count"] == 150 and polling["errors"] == 0
    assert set(run["ratios"]) == {"polling_over_push_p50", "polling_over_push_p99"}
    assert run["ratios"]["polling_over_push_p50"] is not None
    cpu = {"node_a_cores", "node_b_cores", "harness_cores", "writer_cores", "other_processes_cores"}
    assert cpu <= set(run["cpu"])
    assert "streams_opened_total" in saved["node_b"]["streams"]
    assert saved["node_b"]["streams"]["streams_opened_total"] >= 20
    assert saved["all_delivered"]
    assert Path(saved["plot"]) == out.with_suffix(".png") and out.with_suffix(".png").exists()
