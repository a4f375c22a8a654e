"""``chatsync bench e2ee`` on tiny parameters, through its command: every row in the JSON, the
figures positive and consistent with each other, the plot saved (no timing is asserted)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import build_app
from client.group_e2e import MAX_RECIPIENTS

pytestmark = pytest.mark.slow  # starts a node process

SIZES = [100, 1024]
GROUPS = [2, 10, MAX_RECIPIENTS + 2]  # the last one's rotation takes two KEYS messages
OPS = ("encrypt", "decrypt", "sign", "verify")


def test_bench_e2ee_tiny(tmp_path: Path) -> None:
    out = tmp_path / "results" / "e2ee.json"
    args = [
        "bench", "e2ee", "--sizes", ",".join(map(str, SIZES)), "--iterations", "5",
        "--groups", ",".join(map(str, GROUPS)), "--page", "8", "--rounds", "1",
        "--out", str(out), "--data", str(tmp_path / "data"),
    ]  # fmt: skip
    result = CliRunner().invoke(build_app(), args)
    assert result.exit_code == 0, result.output
    assert "per removal" in result.output and "history page" in result.output

    saved = json.loads(out.read_text())
    assert saved["benchmark"] == "e2ee"
    assert {"cpu_count", "python", "loadavg_before", "loadavg_after"} <= set(saved["machine"])
    assert out.with_suffix(".png").stat().st_size > 0

    assert [row["payload_bytes"] for row in saved["per_message"]] == SIZES
    for row in saved["per_message"]:
        assert row["sealed_bytes"] > row["payload_bytes"]  # key id, nonce, tag
        assert all(row[f"{op}_us"] > 0 for op in OPS)
        assert row["encrypt_vs_sign"] == pytest.approx(row["encrypt_us"] / row["sign_us"])
        assert row["decrypt_vs_verify"] == pytest.approx(row["decrypt_us"] / row["verify_us"])

    assert [row["members"] for row in saved["removal"]] == GROUPS
    for row in saved["removal"]:
        one, every, remaining = row["per_sender"], row["all_senders"], row["remaining"]
        assert remaining == row["members"] - 1 and row["plain_group_bytes"] == 0
        assert one["keys_messages"] == math.ceil(remaining / MAX_RECIPIENTS)
        assert one["box_ops"] == remaining
        assert one["keys_message_bytes"] > one["grants_payload_bytes"] > 0  # signed envelope
        assert one["seal_and_sign_ms"] > 0 and row["recipient_open_ms"] > 0
        assert row["bytes_per_recipient"] == pytest.approx(one["grants_payload_bytes"] / remaining)
        for key in ("keys_messages", "grants_payload_bytes", "keys_message_bytes", "box_ops"):
            assert every[key] == remaining * one[key], key
        assert every["seal_and_sign_ms"] == pytest.approx(remaining * one["seal_and_sign_ms"])
    sizes = [row["per_sender"]["grants_payload_bytes"] for row in saved["removal"]]
    assert sizes == sorted(sizes)  # more members, more bytes

    history = saved["history"]
    assert history["messages"] == 8 and history["rounds"] == 20
    for key in ("plain_fetch_ms", "sealed_fetch_ms", "open_ms", "learn_keys_ms"):
        assert history[key] > 0, key
    assert history["sealed_read_ms"] == pytest.approx(
        history["sealed_fetch_ms"] + history["open_ms"]
    )
    assert history["sealed_read_vs_plain"] == pytest.approx(
        history["sealed_read_ms"] / history["plain_fetch_ms"]
    )
