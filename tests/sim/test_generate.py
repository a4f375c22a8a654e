"""Generated traces: deterministic, every fault kind, ops real and signed with chat proofs."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pyarrow.parquet as pq

from sim.generate import FAULTS, GenParams, generate, parse_faults
from store import trace as tr
from store.ingress import validate_op
from store.kinds import Claims, decode_reaction
from store.ops import MembershipOp, decode_op
from store.records import MessageKind, MsgV1

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
    assert set(tr.FAULT_KINDS) - {tr.SCOPE} <= kinds  # scope events: scoped traces only
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


class Row(NamedTuple):
    t_ms: int
    node: int
    kind: str
    chat: bytes | None
    user: bytes
    hlc: int


def _ops(path: Path) -> list[Row]:
    rows = tr.read_trace(path).table.to_pylist()
    return [Row(*(r[f] for f in Row._fields)) for r in rows if r["kind"] in tr.OP_KINDS]


def test_the_authorization_scenarios_are_in_a_trace(tmp_path: Path) -> None:
    """Strangers' posts; removed members posting; add, remove, add again with posts in each
    period and in the gap; a post made on another node within milliseconds of its author's
    add (before gossip can bring the add there)."""
    ops = _ops(small_trace(2, tmp_path / "t.parquet"))
    members = [r for r in ops if r.kind in tr.MEMBER_KINDS]
    posts = [r for r in ops if r.kind == tr.MSG]
    added = {(r.chat, r.user) for r in members if r.kind == tr.MEMBER_ADD}
    assert any((p.chat, p.user) not in added for p in posts)  # a stranger's

    removed_posting = readded = 0
    for pair in added:
        history = sorted(
            (r.hlc, r.kind == tr.MEMBER_ADD) for r in members if (r.chat, r.user) == pair
        )
        stamps = [p.hlc for p in posts if (p.chat, p.user) == pair]
        removes = [hlc for hlc, is_add in history if not is_add]
        removed_posting += bool(removes) and any(s > removes[0] for s in stamps)
        for (a, add), (r, rm), (b, again) in zip(history, history[1:], history[2:], strict=False):
            if add and not rm and again:  # add, remove, add again; a post in each stretch
                readded += all(
                    any(lo <= s < hi for s in stamps)
                    for lo, hi in ((a, r), (r + 1, b), (b, 1 << 62))
                )
    assert removed_posting >= 1 and readded >= 1

    overtaken = [
        (add, p)
        for add in members
        if add.kind == tr.MEMBER_ADD
        for p in posts
        if (p.chat, p.user) == (add.chat, add.user)
        and p.node != add.node
        and 0 < p.t_ms - add.t_ms <= 40
    ]
    assert overtaken


def test_a_removal_races_a_post_across_every_partition(tmp_path: Path) -> None:
    """Each partition episode: a member removed on one side posts on the other moments later."""
    path = small_trace(2, tmp_path / "t.parquet")
    rows = tr.read_trace(path).table.to_pylist()
    ops = _ops(path)
    cuts = [r for r in rows if r["kind"] in (tr.PARTITION, tr.PARTITION_ONEWAY)]
    assert cuts
    for cut in cuts:
        group = set(cut["group"])
        heal = min(r["t_ms"] for r in rows if r["kind"] == tr.HEAL and r["t_ms"] > cut["t_ms"])
        races = [
            (rm, p)
            for rm in ops
            if rm.kind == tr.MEMBER_REMOVE and cut["t_ms"] < rm.t_ms < heal
            for p in ops
            if p.kind == tr.MSG
            and (p.chat, p.user) == (rm.chat, rm.user)
            and 0 <= p.t_ms - rm.t_ms < 1_500
            and (p.node in group) != (rm.node in group)
        ]
        assert races, cut


def test_the_message_kind_scenarios_are_in_a_trace(tmp_path: Path) -> None:
    """Edits (some by others, some racing from two nodes), deletes (by the author, by others,
    with lying claims), reactions and retractions, receipts, and admin adds after the start."""
    trace = tr.read_trace(small_trace(3, tmp_path / "t.parquet", ops=1_200))
    rows = trace.table.to_pylist()
    msgs: dict[bytes, tuple[MsgV1, int]] = {}
    for row in rows:
        if row["kind"] == tr.MSG:
            msg = decode_op(tr.OP_CODES[tr.MSG], row["op"])
            assert isinstance(msg, MsgV1)
            msgs[msg.msg_id] = (msg, row["node"])
    by_kind: dict[MessageKind, list[MsgV1]] = {}
    for msg, _ in msgs.values():
        by_kind.setdefault(msg.kind, []).append(msg)
    assert set(by_kind) == set(MessageKind)

    def target(m: MsgV1) -> MsgV1 | None:
        found = msgs.get(m.ref or b"")
        return None if found is None else found[0]

    edits = by_kind[MessageKind.EDIT]
    assert any((t := target(e)) is not None and t.sender != e.sender for e in edits)
    racing = {
        (a.ref, a.sender)
        for a in edits
        for b in edits
        if a.ref == b.ref and a.sender == b.sender and msgs[a.msg_id][1] != msgs[b.msg_id][1]
    }
    assert racing  # the same author's edits of one message from two nodes
    deletes = by_kind[MessageKind.DELETE]
    named = [(d, t) for d in deletes if (t := target(d)) is not None]
    honest = [(d, t) for d, t in named if Claims.of(t).encode() == d.payload]
    assert len(honest) < len(deletes)  # some lie about their target
    assert {d.sender == t.sender for d, t in honest} == {True, False}  # the author, others
    flags = {decode_reaction(r.payload)[0] for r in by_kind[MessageKind.REACTION]}
    assert flags == {True, False}  # reactions and retractions
    assert all(len(r.payload) == 8 for r in by_kind[MessageKind.READ_RECEIPT])
    start = trace.header.start_ms
    promotions = [
        r for r in rows if r["kind"] == tr.MEMBER_ADD and r["role"] == 1 and r["t_ms"] > start
    ]
    assert promotions
