"""Helpers for the simulator tests: small traces, a brute-force oracle without Spark, the Spark marks.

``brute_force_expected`` applies every valid op of a trace to one
``sync.replica.MemoryReplica`` through the store's own merge rules and message
rule (``store.access``) and its message kinds (``store.kinds``: deletes, erasure, the
view) — a second, independent way to the final state (stored, visible, deletes, erased,
views) that the Spark oracle must agree with.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.engine import view_digest_of
from sim.hunt import SMALL, small_trace
from sim.key_oracle import KeyCounts, Row, count_keys
from sim.shards import Expected, shard_of
from store import trace as tr
from store.errors import DecodeError
from store.kinds import check_public_payload
from store.ops import decode_op
from store.records import MsgV1, compute_identity_record_id, member_record_id
from sync.replica import MemoryReplica

__all__ = ["SMALL", "SPARK_WARNINGS", "brute_force_expected", "brute_force_keys", "small_trace"]

# PySpark's warnings on every Arrow UDF, silenced in the Spark tests
SPARK_WARNINGS = [
    pytest.mark.filterwarnings("ignore:Arrow optimization:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:Cannot infer the eval type:UserWarning"),
]


def _well_formed(msg: MsgV1) -> bool:
    try:
        check_public_payload(msg)
    except DecodeError:
        return False
    return True


def brute_force_expected(path: Path, shard: int = 0, shards: int = 1) -> Expected:
    """The final state of shard ``shard`` of ``shards``: every valid op, in trace order."""
    trace = tr.read_trace(path)
    h = trace.header
    replica = MemoryReplica()
    rows = trace.table.select(["t_ms", "kind", "op", "shard_key"]).to_pylist()
    chats_of: dict[bytes, int] = {}  # message id -> shard key
    for row in rows:
        kind = row["kind"]
        if kind not in tr.OP_CODES:
            continue
        op = decode_op(tr.OP_CODES[kind], row["op"])
        if isinstance(op, MsgV1):
            chats_of[op.msg_id] = row["shard_key"]
        if op.hlc.physical_ms - row["t_ms"] > h.max_offset_ms:
            continue  # invalid: made by a clock past max offset
        if isinstance(op, MsgV1) and not _well_formed(op):
            continue  # a malformed public payload: refused at every ingress
        replica.apply_ops([op])
    raw = h.end_ms - h.retention_ms
    cutoff = raw - raw % h.gc_grain_ms
    replica.expire_messages(cutoff)  # the final GC (deletes are never collected)

    def mine(key: int) -> bool:
        return shard_of(key, shards) == shard

    exp = Expected()
    kept = {
        i: m
        for i, m in replica.messages.items()
        if m.hlc.physical_ms > cutoff and mine(tr.chat_shard_key(m.chat_id))
    }
    exp.messages = set(kept)
    exp.visible = {i for i, m in kept.items() if replica.is_visible(m)}
    exp.member_ops = {
        i for i, op in replica.member_ops.items() if mine(tr.chat_shard_key(op.chat_id))
    }
    exp.members = {
        key: (member_record_id(key[0], key[1], info), info.active)
        for key, info in replica.members.items()
        if mine(tr.chat_shard_key(key[0]))
    }
    exp.identities = {
        user: compute_identity_record_id(user, *stored)
        for user, stored in replica.identities.items()
        if mine(tr.row_shard_key(user))
    }
    exp.deletes = {i for i, d in replica.deletes.items() if mine(tr.chat_shard_key(d.chat_id))}
    exp.erased = {i for i in replica.erased if i in chats_of and mine(chats_of[i])}
    exp.views = {
        chat: view_digest_of(replica.view(chat))
        for chat in {op.chat_id for op in replica.member_ops.values()}
        if mine(tr.chat_shard_key(chat))
    }
    return exp


def brute_force_keys(path: Path) -> KeyCounts:
    """The group-key counters without Spark: every valid op of the trace, decoded here, each
    chat's rows handed to ``sim.key_oracle.count_keys``."""
    trace = tr.read_trace(path)
    h = trace.header
    chats: dict[bytes, list[Row]] = {}
    seen: set[bytes] = set()
    for row in trace.table.select(["t_ms", "kind", "op"]).to_pylist():
        kind, data = row["kind"], row["op"]
        if kind not in tr.OP_CODES or data in seen:
            continue
        seen.add(data)
        op = decode_op(tr.OP_CODES[kind], data)
        if op.hlc.physical_ms - row["t_ms"] > h.max_offset_ms:
            continue
        if isinstance(op, MsgV1):
            chat_rows = chats.setdefault(op.chat_id, [])
            chat_rows.append((False, op.sender, op.hlc.pack(), int(op.kind), op.payload))
        elif kind in tr.MEMBER_KINDS:
            is_add = int(kind == tr.MEMBER_ADD)
            chats.setdefault(op.chat_id, []).append((True, op.user_id, op.hlc.pack(), is_add, None))
    total = KeyCounts()
    for rows in chats.values():
        total.add(count_keys(rows))
    return total
