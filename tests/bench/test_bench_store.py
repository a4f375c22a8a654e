"""``chatsync bench store`` on tiny parameters: the JSON report's shape and sanity, no timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from bench.store_bench import ChatDbWriter, RawWriter, StoreBenchParams, run_store_bench
from bench.workload import make_workload
from store.rocks import COLUMN_FAMILIES

STORES = {
    "write_batched": {"chatdb", "raw", "raw_no_log", "raw_3_per_msg", "sqlite"},
    "write_single": {"chatdb", "raw", "raw_no_log", "sqlite"},
    "range": {"chatdb", "sqlite", "sqlite_by_timestamp"},
    # the hidden-index check: the same walk with it and without, on their own
    "range_check": {"checked", "unchecked"},
    "list_user_chats": {"chatdb", "sqlite"},
    # the node's write path (DbReplica.apply_ops) with the authorization check and without
    "node_batched": {"node_checked", "node_open"},
    "node_single": {"node_checked", "node_open"},
    # MESSAGES.md: the folded history beside the raw op log; deletes with the erase
    "folded_range": {"folded", "raw"},
    "deletes": {"batched", "single"},
}


def test_bench_store_tiny(tmp_path: Path) -> None:
    out = tmp_path / "results" / "store.json"
    params = StoreBenchParams(
        messages=2_000,
        chats=5,
        batch=250,
        single=300,
        range_chats=5,
        list_calls=40,
        out=out,
        data=tmp_path / "data",
    )
    with (tmp_path / "log.txt").open("w") as log:
        report = run_store_bench(params, console=Console(file=log, width=140))

    assert out.exists()
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(report))
    assert saved["benchmark"] == "store"
    assert saved["params"]["messages"] == 2_000
    assert {"cpu_count", "python", "rocksdict", "sqlite"} <= saved["machine"].keys()
    assert saved["sqlite"]["pragmas"]["journal_mode"] == "WAL"
    assert saved["sqlite"]["query_plans"]["page_rfc"]

    results = saved["results"]
    assert {op: set(stores) for op, stores in results.items()} == STORES
    for op, stores in results.items():
        for name, rate in stores.items():
            assert rate["per_s"] > 0, (op, name)
            assert rate["count"] > 0 and rate["seconds"] > 0, (op, name)
    assert {rate["count"] for rate in results["write_batched"].values()} == {2_000}
    assert {rate["count"] for rate in results["write_single"].values()} == {300}
    assert {rate["count"] for rate in results["node_batched"].values()} == {2_000}
    assert {rate["count"] for rate in results["node_single"].values()} == {300}
    assert {rate["count"] for rate in results["list_user_chats"].values()} == {40}
    # Every message of the five chats was paged, in as many pages on both sides.
    rng = results["range"]
    assert {rate["items"] for rate in rng.values()} == {2_000}
    assert rng["chatdb"]["count"] == rng["sqlite"]["count"] == rng["sqlite_by_timestamp"]["count"]
    check = results["range_check"]
    assert check["checked"]["count"] == check["unchecked"]["count"] == rng["chatdb"]["count"]
    # the folded walk pages the messages; the raw one their edits and reactions too
    folded = results["folded_range"]
    assert folded["folded"]["items"] == 2_000 < folded["raw"]["items"]
    # the like-for-like ratio: the time of the same chats' walks
    same = folded["raw"]["seconds"] / folded["folded"]["seconds"]
    assert saved["ratios"]["folded_vs_raw_same_chats"] == pytest.approx(same)
    # every delete erased its target: 200 in batches, 20 one at a time
    assert [(r["count"], r["items"]) for r in results["deletes"].values()] == [(200, 200), (20, 20)]

    assert set(saved["ratios"]) == {
        "write_batched_vs_raw",
        "write_batched_vs_raw_no_log",
        "write_batched_vs_raw_3_per_msg",
        "write_batched_vs_sqlite",
        "write_single_vs_raw",
        "write_single_vs_raw_no_log",
        "write_single_vs_sqlite",
        "range_vs_sqlite",
        "range_vs_sqlite_by_timestamp",
        "list_user_chats_vs_sqlite",
        "node_batched_checked_vs_open",
        "node_single_checked_vs_open",
        "range_visible_vs_unfiltered",
        "folded_vs_raw_range",
        "folded_vs_raw_same_chats",
    }
    assert all(ratio > 0 for ratio in saved["ratios"].values())
    assert all(isinstance(goal["met"], bool) for goal in saved["goals"].values())
    assert "chatsync bench store" in (tmp_path / "log.txt").read_text()


def test_raw_writes_the_entries_chatdb_writes(tmp_path: Path) -> None:
    """The raw contender writes what ChatDb writes, byte for byte: every column family of the
    two stores equal after the same messages, in batches and one at a time (``raw_no_log``:
    the same without the events row and the positions)."""
    wl = make_workload(300, 3, 20)
    for each, step in ((False, 100), (True, 1)):
        chatdb = ChatDbWriter(tmp_path / f"chatdb-{each}", wl)
        raw = RawWriter(tmp_path / f"raw-{each}", wl)
        no_log = RawWriter(tmp_path / f"no-log-{each}", wl, log=False)
        try:
            for lo in range(0, 300, step):
                for writer in (chatdb, raw, no_log):
                    writer.put(lo, lo + step, each=each)
            rows = [{cf: list(w.db.iter_all(cf)) for cf in COLUMN_FAMILIES} for w in (chatdb, raw)]
            assert rows[0] == rows[1]
            assert len(rows[0]["events"]) == (300 if each else 3)
            assert list(no_log.db.iter_all("events")) == []
            assert list(no_log.db.iter_all("messages")) == rows[0]["messages"]
        finally:
            for writer in (chatdb, raw, no_log):
                writer.close()
