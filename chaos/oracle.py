"""The simulator's oracle (``sim/oracle.py``, Spark) fed a chaos run's final op set: every
acknowledged op and every other op some node holds, as a one-node recorded trace whose
times are when the clients signed them. Gives the checker its ``Expected``."""

from __future__ import annotations

import base64
from pathlib import Path

from chaos.checker import Expected
from chaos.history import DELETES, IDENTITY, MEMBERS, MESSAGES, OpRecord
from store import trace as tr
from store.ops import OpKind, decode_op


def write_trace(ops: list[OpRecord], path: Path, nodes: int, max_offset_ms: int) -> tr.TraceHeader:
    ordered = sorted(ops, key=lambda op: op.made_ms)
    start = ordered[0].made_ms if ordered else 0
    end = ordered[-1].made_ms + 1 if ordered else 1
    header = tr.TraceHeader(
        nodes=nodes, start_ms=start, heal_ms=end, end_ms=end, retention_ms=end,  # keep all
        max_offset_ms=max_offset_ms, ops=len(ordered), source="recorded", command="chatsync chaos",
    )  # fmt: skip
    with tr.TraceWriter(path, header) as writer:
        for op in ordered:
            writer.op(
                op.made_ms,
                op.node,
                decode_op(OpKind(op.op_kind), base64.urlsafe_b64decode(op.data)),
            )
    return header


def run_oracle(ops: list[OpRecord], work: Path, nodes: int, max_offset_ms: int) -> Expected:
    from sim.oracle import compute_oracle  # loads PySpark
    from sim.spark import spark_session

    path = work / "final-ops.parquet"
    header = write_trace(ops, path, nodes, max_offset_ms)
    spark = spark_session("local[2]", app="chatsync-chaos-oracle")
    try:
        oracle = compute_oracle(spark, str(path), header)
    finally:
        spark.stop()
    return Expected(
        ids={
            MESSAGES: {i.hex() for i, _, _ in oracle.messages},
            DELETES: {i.hex() for i, _ in oracle.deletes},
            MEMBERS: {i.hex() for i, _ in oracle.member_ops},
            IDENTITY: {i.hex() for _, i, _ in oracle.identities},
        },
        visible={i.hex() for i, shown, _ in oracle.messages if shown},
        views={chat.hex(): digest.hex() for chat, digest, _ in oracle.views},
        erased={i.hex() for i, _ in oracle.erased},
    )
