"""``chatsync bench retention`` on tiny parameters: the JSON report's shape and its checks, no timings."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from bench.retention_bench import RetentionBenchParams, run_retention_bench
from bench.retention_waste import WasteParams

GC_FIELDS = {
    "write_s", "write_msgs_per_s", "disk_before", "tree_build_s", "trim_chats_s",
    "seen_expiry_s", "tree_remove_s", "gc_s", "messages_removed", "messages_expected",
    "disk_after_gc", "compact_s", "disk_after_compaction", "reclaimed_fraction", "checks",
}  # fmt: skip
SUMMARY_FIELDS = {
    "window_records_mean", "bytes_mean", "bytes_a_initiates", "bytes_b_initiates",
    "baseline_bytes_mean", "ratio_to_baseline_mean", "waste_bytes_per_window_record",
    "passes_max", "frames_max", "records_shipped", "expired_shipped", "rejected_old",
    "agree_newer",
}  # fmt: skip


def test_bench_retention_tiny(tmp_path: Path) -> None:
    out = tmp_path / "results" / "retention.json"
    waste = WasteParams(
        rate=10, period_s=120, sessions=3, skews_s=(0, 10, 120), lags_s=(0, 60), losses=(0, 0.02)
    )
    params = RetentionBenchParams(
        messages=5_000, chats=20, out=out, data=tmp_path / "data", waste=waste
    )
    with (tmp_path / "log.txt").open("w") as log:
        report = run_retention_bench(params, console=Console(file=log, width=240))

    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(report))
    assert saved["benchmark"] == "retention"
    assert saved["failures"] == []

    # 1. age GC: exactly the aged messages went, nothing newer was lost, the tree is right
    g = saved["gc"]
    assert set(g) >= GC_FIELDS
    assert g["messages"] == 5_000 and g["messages_expected"] == 4_500
    assert g["messages_removed"] == g["messages_expected"]
    c = g["checks"]
    assert c["ok"]
    assert c["removed_ids_are_the_aged"] and c["tree_equals_rebuild"]
    assert c["older_left_in_seen_msg"] == c["older_left_in_chats"] == 0
    assert c["newer_lost"] == c["unexpected_ids"] == 0
    assert c["messages_paged"] == c["tree_count"] == 500
    assert c["chats_meta_wrong"] == 0 and c["dormant_chats_emptied"] == "1/1"
    assert c["replay_refused"] == "1000/1000" and c["replay_stored"] == 0
    assert c["repeat_cycle_removed"] == 0
    assert g["disk_after_compaction"] < g["disk_before"]

    # 2. size GC on a copy: size_cutoff's estimate removed, the rest intact
    s = saved["size_gc"]
    assert s["ok"] and s["tree_equals_rebuild"] and s["older_left"] == 0
    assert s["messages_removed"] == s["messages_expected"] > 0
    assert s["messages_left"] == 5_000 - s["messages_removed"]

    # 3. waste grid: every (loss, skew, lag), the baseline first per loss
    cases = saved["waste"]["cases"]
    lossless = next(x for x in cases if (x["loss"], x["skew_s"], x["lag_s"]) == (0, 0, 0))
    grid = {(x["loss"], x["skew_s"], x["lag_s"]) for x in cases}
    assert grid == {(loss, s, lag) for loss in (0, 0.02) for s in (0, 10, 120) for lag in (0, 60)}
    for case in cases:
        summary = case["summary"]
        assert set(summary) >= SUMMARY_FIELDS, case
        assert case["failures"] == [], case
        assert summary["expired_shipped"] == 0 and summary["rejected_old"] == 0, case
        assert summary["agree_newer"], case
        assert len(case["sessions"]) == 3
        for row in case["sessions"]:
            assert row["error"] is None, row
            assert row["no_resurrection"] and row["trees_match_records"], row
            assert row["window_records"] <= row["window_bound"], row
            assert row["passes"] <= 3, row
            # only fresh records travel: at most the ones a lost gossip left on one side
            assert row["records_shipped"] == row["fresh_shipped"] <= row["fresh_differences"]
        gap = case["cutoff_gap_s"]
        if gap == 0:
            assert summary["window_records_mean"] == 0
        else:
            assert summary["window_records_mean"] > 0
            # the window costs bytes: the descent finds its nodes (a listing leaves its ids
            # out, so against a lossy baseline that moves lost records it may cost less)
            assert summary["bytes_mean"] > lossless["summary"]["bytes_mean"]
            assert all(not row["converged"] for row in case["sessions"])
    loss0 = [x for x in cases if x["loss"] == 0]
    assert all(
        row["bytes_by_kind"]["records"] == 0 for x in loss0 for row in x["sessions"]
    )  # no gossip loss: the waste carries no record body at all
    assert saved["findings"]
    assert "chatsync bench retention" in (tmp_path / "log.txt").read_text()
