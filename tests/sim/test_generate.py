"""Generated traces: deterministic, every fault kind, ops real and signed with chat proofs."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from sim.generate import FAULTS, GenParams, generate, parse_faults
from store import trace as tr
from store.ops import MembershipOp, decode_op, validate_op

from sim_support import SMALL, small_trace


def test_generated_ops_are_real_signed_records_with_consistent_columns(tmp_path: Path) -> None:
    trace = tr.read_trace(small_trace(3, tmp_path / "t.parquet"))
    rows = trace.table.to_pylist()
    times = [(r["t_ms"], r["seq"]) for r in rows]
    assert times == sorted(times)
    ops = [r for r in rows if r["kind"] in tr.OP_KINDS]
    assert len(ops) == trace.header.ops >= SMALL["ops"]
    assert {r["kind"] for r in ops} == set(tr.OP_KINDS)
    invalid = 0
    for row in ops:
        op = decode_op(tr.OP_CODES[row["kind"]], row["op"])
        columns = tr.op_columns(op)
        for name, value in columns.items():
            assert row[name] == value, name
        if op.hlc.physical_ms - row["t_ms"] > trace.header.max_offset_ms:
            invalid += 1  # a far-future clock's op: signed, but never valid
            continue
        validate_op(op, now_ms=op.hlc.physical_ms, max_offset_ms=0)  # signature + authorization
    assert 0 < invalid < len(ops) // 2


def test_every_fault_kind_is_in_an_all_faults_trace(tmp_path: Path) -> None:
    trace = tr.read_trace(small_trace(4, tmp_path / "t.parquet"))
    kinds = set(trace.table.column("kind").to_pylist())
    assert set(tr.FAULT_KINDS) <= kinds
    assert trace.header.params["faults"] == sorted(FAULTS)
    none = tr.read_trace(small_trace(4, tmp_path / "n.parquet", faults=parse_faults("none")))
    assert set(none.table.column("kind").to_pylist()) <= set(tr.OP_KINDS) | {tr.HEAL, tr.NET}


def test_same_seed_same_trace_other_seed_other_trace(tmp_path: Path) -> None:
    a = pq.read_table(small_trace(5, tmp_path / "a.parquet"))
    b = pq.read_table(small_trace(5, tmp_path / "b.parquet"))
    c = pq.read_table(small_trace(6, tmp_path / "c.parquet"))
    assert a.equals(b)
    assert not a.equals(c)


def test_parallel_signing_writes_the_same_trace(tmp_path: Path) -> None:
    params = {**SMALL, "ops": 2_500, "seed": 9}
    one = generate(GenParams(**params, workers=1), tmp_path / "one.parquet")
    two = generate(GenParams(**params, workers=2), tmp_path / "two.parquet")
    assert pq.read_table(one.path).equals(pq.read_table(two.path))


def test_membership_ops_carry_chat_proofs(tmp_path: Path) -> None:
    trace = tr.read_trace(small_trace(7, tmp_path / "t.parquet"))
    grants = 0
    for row in trace.table.to_pylist():
        if row["kind"] in tr.MEMBER_KINDS:
            op = decode_op(tr.OP_CODES[row["kind"]], row["op"])
            assert isinstance(op, MembershipOp)
            assert op.proof is not None and op.proof.chat_id() == op.chat_id
            grants += op.grant is not None
    assert grants > 0
