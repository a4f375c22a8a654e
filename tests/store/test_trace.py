"""The trace format (``store/trace.py``): a node's recording hook, merging recordings, bad input."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from store import trace as tr
from store.hlc import Hlc
from store.records import MsgV1
from store.signing import key_from_seed


def test_writer_hook_and_merge_round_trip(tmp_path: Path) -> None:
    """What a node does with --trace-out, then one trace out of two nodes' recordings."""
    key = key_from_seed(bytes(range(32)))
    paths = []
    sent = []
    for node in range(2):
        path = tmp_path / f"node{node}.parquet"
        with tr.TraceWriter(path, tr.TraceHeader(nodes=1, source="recorded")) as writer:
            for i in range(3):
                msg = MsgV1.create(key, bytes(32), Hlc(1_000_000 + 10 * i + node), b"m%d" % i)
                writer.op(1_000_000 + 10 * i + node, 0, msg)
                sent.append((node, msg.msg_id))
            writer.fault(1_000_100, tr.GC, 0)
        paths.append(path)
    merged = tr.merge_traces(paths, tmp_path / "merged.parquet")
    back = tr.read_trace(tmp_path / "merged.parquet")
    assert merged.nodes == back.header.nodes == 2
    assert back.header.source == "recorded"
    rows = back.table.to_pylist()
    assert sorted((r["node"], r["op_id"]) for r in rows if r["kind"] == tr.MSG) == sorted(sent)
    assert [r["seq"] for r in rows] == list(range(len(rows)))
    assert back.header.end_ms > back.header.heal_ms >= rows[-1]["t_ms"]


def test_writer_rejects_unknown_faults_and_reader_non_traces(tmp_path: Path) -> None:
    with (
        tr.TraceWriter(tmp_path / "t.parquet", tr.TraceHeader(nodes=1)) as writer,
        pytest.raises(ValueError, match="unknown fault"),
    ):
        writer.fault(0, "meteor")
    pq.write_table(
        pq.read_table(tmp_path / "t.parquet").replace_schema_metadata({}), tmp_path / "x.parquet"
    )
    with pytest.raises(ValueError, match="not a chatsync trace"):
        tr.read_header(tmp_path / "x.parquet")
