"""``chatsync bench store-layouts`` on tiny parameters: the report's shape, and every walk of
a kind paging the same messages (the bench checks it; here it has to have run). No timings."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from bench.store_layouts import LayoutParams, run_store_layouts


def test_store_layouts_tiny(tmp_path: Path) -> None:
    out = tmp_path / "layouts.json"
    params = LayoutParams(messages=2_000, chats=5, batch=250, walked=5, out=out)
    with (tmp_path / "log.txt").open("w") as log:
        report = run_store_layouts(params, console=Console(file=log, width=140))

    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(report))
    assert saved["benchmark"] == "store-layouts"
    assert saved["content_copies"] == 2_000  # every workload message is content
    assert set(saved["writes_msgs_per_s"]) == {"chatdb", "chatdb_content_copy", "sqlite"}
    assert all(rate > 0 for rate in saved["writes_msgs_per_s"].values())
    assert set(saved["chatdb_page_us"]) == {"raw", "content_scan", "folded"}
    assert set(saved["layout_page_us"]) == {"one_raw", "one_content", "apart_raw", "apart_content"}
    items = saved["items"]
    # the op log pages the edits and reactions too (one of each on every 10th message)
    assert items["raw"] == items["one_raw"] == items["apart_raw"]
    assert items["content_scan"] == items["folded"] == items["apart_content"] < items["raw"]
    assert "folded / raw" in (tmp_path / "log.txt").read_text()
