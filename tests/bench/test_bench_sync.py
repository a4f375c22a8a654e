"""``chatsync bench sync`` on tiny parameters: correctness properties of every case, no timings."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from bench.sync_bench import SharedIds, SyncBenchParams, build_base, run_sync_bench


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


def test_a_case_reads_its_held_ids_by_range_empty_ranges_included() -> None:
    """The bench replica's range read (what a sketch covers) is one slice of the case's held
    ids in bucket order: exactly the held ids of the range, an empty range included."""
    base = build_base(3000, seed=1)
    shared = SharedIds(base, held=2500)  # the last 500 base ids are not held
    held = base.ids[:2500]
    for start, end in [(0, 1 << 16), (0, 1), (1000, 1000), (7, 40_000), (65_535, 1 << 16)]:
        blob = bytes(shared.range_blob(start, end))
        ids = sorted(blob[k : k + 32] for k in range(0, len(blob), 32))
        assert ids == sorted(i for i in held if start <= (i[0] << 8 | i[1]) < end)
