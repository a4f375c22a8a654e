"""Helpers for the simulator tests: small traces, a brute-force oracle without Spark, the Spark marks.

``brute_force_expected`` applies every valid op of a trace to one
``sync.replica.MemoryReplica`` through the store's own merge rules — a second,
independent way to the final state that the Spark oracle must agree with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sim.hunt import SMALL, small_trace
from sim.shards import Expected
from store import trace as tr
from store.ops import MembershipOp, decode_op
from store.records import MemberRecord, compute_identity_record_id, member_record_id
from sync.frames import Domain
from sync.replica import MemoryReplica

__all__ = ["SMALL", "SPARK_WARNINGS", "brute_force_expected", "small_trace"]

# PySpark's warnings on every Arrow UDF, silenced in the Spark tests
SPARK_WARNINGS = [
    pytest.mark.filterwarnings("ignore:Arrow optimization:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:Cannot infer the eval type:UserWarning"),
]


def brute_force_expected(path: Path) -> Expected:
    trace = tr.read_trace(path)
    h = trace.header
    replica = MemoryReplica()
    rows = trace.table.select(["t_ms", "kind", "op"]).to_pylist()
    for row in rows:
        kind = row["kind"]
        if kind not in tr.OP_CODES:
            continue
        op = decode_op(tr.OP_CODES[kind], row["op"])
        if op.hlc.physical_ms - row["t_ms"] > h.max_offset_ms:
            continue  # invalid: made by a clock past max offset
        if isinstance(op, MembershipOp):
            record: Any = MemberRecord(op.chat_id, op.user_id, op.state())
            replica.apply(Domain.MEMBERS, [record])
        elif kind == tr.MSG:
            replica.apply(Domain.MESSAGES, [op])
        else:
            replica.apply(Domain.IDENTITY, [op])
    raw = h.end_ms - h.retention_ms
    cutoff = raw - raw % h.gc_grain_ms
    exp = Expected()
    exp.messages = {i for i, m in replica.messages.items() if m.hlc.physical_ms > cutoff}
    exp.members = {
        key: (member_record_id(key[0], key[1], info), info.active)
        for key, info in replica.members.items()
    }
    exp.identities = {
        user: compute_identity_record_id(user, *stored)
        for user, stored in replica.identities.items()
    }
    return exp
