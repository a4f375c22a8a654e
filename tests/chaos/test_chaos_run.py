"""``chatsync chaos`` end to end on real node processes (slow): a 60 s run with every
nemesis passes with every counter 0, and a planted fault is caught."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow


def run_chaos(tmp_path: Path, *args: str, timeout_s: float) -> tuple[int, dict[str, Any], str]:
    out = tmp_path / "chaos.json"
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "chaos", "--data", str(tmp_path / "data"), "--out", str(out), *args],
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return done.returncode, json.loads(out.read_text()), done.stdout


def test_a_minute_of_every_fault_loses_nothing_acknowledged(tmp_path: Path) -> None:
    code, report, stdout = run_chaos(
        tmp_path, "--nodes", "3", "--duration", "60", "--seed", "8", timeout_s=400
    )
    assert "seed 8:" in stdout
    assert report["counters"] == dict.fromkeys(report["counters"], 0), stdout[-4000:]
    assert code == 0 and report["ok"] and report["oracle"]
    stats = report["stats"]
    assert stats["acked"] > 1_000 and stats["fault_actions_failed"] == 0
    assert len({f["kind"] for f in report["schedule"]}) == 7  # every nemesis
    assert (tmp_path / "chaos.png").stat().st_size > 10_000


def test_a_writer_dropping_ops_is_caught(tmp_path: Path) -> None:
    code, report, stdout = run_chaos(
        tmp_path, "--nodes", "3", "--duration", "15", "--seed", "5", "--nemesis", "partition",
        "--plant", "drop-one-in-50", "--no-oracle", timeout_s=200,
    )  # fmt: skip
    assert code == 1 and not report["ok"]
    assert report["counters"]["lost"] > 0, stdout[-4000:]
