"""``chatsync bench sync`` on tiny parameters: correctness properties of every case, no timings."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from bench.sync_bench import SyncBenchParams, run_sync_bench


def test_bench_sync_tiny(tmp_path: Path) -> None:
    out = tmp_path / "results" / "sync.json"
    params = SyncBenchParams(sizes=(2000,), diffs=(0, 5, 50), out=out, rebuild_ids=5000)
    with (tmp_path / "log.txt").open("w") as log:
        report = run_sync_bench(params, console=Console(file=log, width=170))

    assert out.exists()
    saved = json.loads(out.read_text())
    assert saved["benchmark"] == "sync"
    cases = saved["cases"]
    assert {(c["d"], c["placement"]) for c in cases} == {
        (d, p) for d in (0, 5, 50) for p in ("scattered", "newest")
    }
    for c in [*cases, *saved["hash_widths"]]:
        assert c["n"] == 2000
        assert c["records_shipped"] == c["d"], c
        assert c["unneeded_shipped"] == 0, c
        assert c["base_id_requests"] == 0, c
        assert c["unknown_id_requests"] == 0, c
        assert c["roots_equal"] and c["converged"], c
        assert c["counts"] == [2000, 2000], c
        assert c["second"]["bytes"] <= 512, c
        assert c["second"]["round_trips"] == 1, c
        assert c["failures"] == [], c
    assert [c["hash_width"] for c in saved["hash_widths"]] == [3, 4, 5]
    assert saved["rebuild"]["incremental_equals_rebuilt"]
    assert saved["failures"] == []
    assert report["cases"] == cases
