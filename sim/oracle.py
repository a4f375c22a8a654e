"""The oracle: the expected final state, computed by Spark from the trace alone.

Independent of the replica code: DataFrame filters and aggregations over the
trace's op columns, written from the rules as SYNC.md and ``store/merge.py``
state them, not by calling them:

* an op is **valid** if its HLC physical time is at most ``max_offset_ms`` ahead
  of the true time it was made (``t_ms``) — a far-future clock's ops are not;
* **member ops** (the MEMBERS domain): every valid add, remove and leave; ids
  recomputed as BLAKE3 of the op's bytes;
* **messages** (stored): the valid messages whose HLC physical time is after the
  final GC's cutoff (``end_ms - retention_ms`` rounded down to ``gc_grain_ms``)
  and that are *admissible*: their sender has a valid add op in their chat
  stamped at or before the message; ids recomputed as BLAKE3 of the bytes;
* **visible** messages: the stored ones whose sender is *active at* the message's
  stamp t — the greatest valid add stamp <= t beats the greatest valid remove or
  leave stamp <= t (a tie goes to the remove). The generator makes group chats
  only, so there is no DM rule here;
* **member rows**, per (chat, user): ``added_at``, role and add proof (the signed op)
  from the greatest (hlc, role, op bytes) among valid adds, ``removed_at`` and
  remove proof from the greatest (hlc, op bytes) among valid removes and leaves;
  active iff never removed or removed before the add; the row's version is
  ``compute_member_record_id`` over those fields;
* **identity**, per user: the valid put with the greatest (hlc, blob).

Record ids come from ``store.records``' id functions (they define what an id is);
the oracle's roots are ``MerkleTree.from_ids`` over its ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import blake3
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType

from sim.shards import Expected, shard_of
from store import trace as tr
from store.hlc import Hlc
from store.records import compute_identity_record_id, compute_member_record_id
from sync.frames import Domain
from sync.merkle import MerkleTree


@dataclass
class Oracle:
    messages: list[tuple[bytes, bool, int]] = field(default_factory=list)  # (id, visible, key)
    member_ops: list[tuple[bytes, int]] = field(default_factory=list)  # (op id, shard_key)
    # (chat, user, row version, active, shard_key)
    members: list[tuple[bytes, bytes, bytes, bool, int]] = field(default_factory=list)
    identities: list[tuple[bytes, bytes, int]] = field(default_factory=list)  # (user, id, key)
    valid_ops: int = 0
    invalid_ops: int = 0
    inadmissible: int = 0  # valid messages after the cutoff that no op admits

    def ids(self, domain: Domain) -> list[bytes]:
        if domain is Domain.MESSAGES:
            return [m[0] for m in self.messages]
        if domain is Domain.MEMBERS:
            return [m[0] for m in self.member_ops]
        if domain is Domain.DELETES:
            return []  # the generator writes no deletes (yet)
        return [i[1] for i in self.identities]

    def roots(self) -> dict[Domain, tuple[int, int]]:
        out = {}
        for domain in Domain:
            xor, count = MerkleTree.from_ids(self.ids(domain)).root()
            out[domain] = (int.from_bytes(xor, "big"), count)
        return out

    def visible_root(self) -> str:
        """The visible messages' ids as one "xor:count" (as reports write roots): a replay
        through the node's code compares what its readers are shown with it."""
        xor, count = MerkleTree.from_ids(i for i, shown, _ in self.messages if shown).root()
        return f"{int.from_bytes(xor, 'big'):064x}:{count}"

    def active_members(self) -> int:
        return sum(1 for m in self.members if m[3])

    def for_shard(self, shard: int, shards: int) -> Expected:
        exp = Expected()
        mine = [(i, shown) for i, shown, key in self.messages if shard_of(key, shards) == shard]
        exp.messages = {i for i, _ in mine}
        exp.visible = {i for i, shown in mine if shown}
        exp.member_ops = {i for i, key in self.member_ops if shard_of(key, shards) == shard}
        exp.members = {
            (chat, user): (rid, active)
            for chat, user, rid, active, key in self.members
            if shard_of(key, shards) == shard
        }
        exp.identities = {
            user: rid for user, rid, key in self.identities if shard_of(key, shards) == shard
        }
        return exp


def _blake3(data: bytes) -> bytes:
    return blake3.blake3(data).digest()


def _member_id(
    chat: bytes,
    user: bytes,
    role: int,
    added: int,
    removed: int | None,
    add_proof: bytes | None,
    remove_proof: bytes | None,
) -> bytes:
    removed_at = None if removed is None else Hlc.unpack(removed)
    return compute_member_record_id(
        chat, user, role, Hlc.unpack(added), removed_at, add_proof, remove_proof
    )


def _identity_id(user: bytes, hlc: int, blob: bytes) -> bytes:
    return compute_identity_record_id(user, Hlc.unpack(hlc), blob)


def valid_ops(spark: SparkSession, trace_uri: str, header: tr.TraceHeader) -> DataFrame:
    df = spark.read.parquet(trace_uri)
    ops = df.where(F.col("kind").isin(*tr.OP_KINDS))
    physical = F.shiftright(F.col("hlc"), 16)
    return ops.withColumn("physical", physical).withColumn(
        "valid", (F.col("physical") - F.col("t_ms")) <= F.lit(header.max_offset_ms)
    )


def _messages(msgs: DataFrame, member_ops: DataFrame, record_id: Any) -> DataFrame:
    """Per message (id, shard_key): admissible and visible, from the ops of its (chat, sender)
    stamped at or before it. A: the greatest add stamp; R: the greatest remove or leave
    stamp. Admissible iff A exists; visible iff also R is absent or older than A."""
    m = msgs.select(
        record_id("op").alias("id"), "chat", "user", F.col("hlc").alias("t"), "shard_key"
    ).distinct()
    o = member_ops.select(
        F.col("chat").alias("o_chat"),
        F.col("user").alias("o_user"),
        F.col("hlc").alias("o_hlc"),
        (F.col("kind") == tr.MEMBER_ADD).alias("is_add"),
    )
    before = (m.chat == o.o_chat) & (m.user == o.o_user) & (o.o_hlc <= m.t)
    decided = (
        m.join(o, before, "left")
        .groupBy("id", "shard_key")
        .agg(
            F.max(F.when(F.col("is_add"), F.col("o_hlc"))).alias("A"),
            F.max(F.when(~F.col("is_add"), F.col("o_hlc"))).alias("R"),
        )
    )
    admissible = F.col("A").isNotNull()
    return decided.select(
        "id",
        "shard_key",
        admissible.alias("admissible"),
        (admissible & (F.col("R").isNull() | (F.col("R") < F.col("A")))).alias("visible"),
    )


def compute_oracle(spark: SparkSession, trace_uri: str, header: tr.TraceHeader) -> Oracle:
    # Few shuffle partitions for small traces: each one costs a task and a Python worker.
    spark.conf.set("spark.sql.shuffle.partitions", str(2 if header.ops < 50_000 else 8))
    ops = valid_ops(spark, trace_uri, header)
    counts = {bool(r["valid"]): int(r["count"]) for r in ops.groupBy("valid").count().collect()}
    valid = ops.where(F.col("valid"))
    oracle = Oracle(valid_ops=counts.get(True, 0), invalid_ops=counts.get(False, 0))

    record_id = F.udf(_blake3, BinaryType())
    raw = header.end_ms - header.retention_ms
    cutoff = raw - raw % header.gc_grain_ms  # the final GC's cutoff, rounded to the GC grain
    member_ops = valid.where(F.col("kind").isin(*tr.MEMBER_KINDS))
    oracle.member_ops = [
        (r["id"], r["shard_key"])
        for r in member_ops.select(record_id("op").alias("id"), "shard_key").distinct().collect()
    ]
    messages = _messages(
        valid.where((F.col("kind") == tr.MSG) & (F.col("physical") > F.lit(cutoff))),
        member_ops,
        record_id,
    )
    decided = messages.collect()
    oracle.messages = [
        (r["id"], bool(r["visible"]), r["shard_key"]) for r in decided if r["admissible"]
    ]
    oracle.inadmissible = len(decided) - len(oracle.messages)

    key = ["chat", "user"]
    adds = (
        valid.where(F.col("kind") == tr.MEMBER_ADD)
        .groupBy(*key)
        .agg(F.max(F.struct("hlc", "role", "op")).alias("top"), F.first("shard_key").alias("k1"))
    )
    removes = (
        valid.where(F.col("kind").isin(tr.MEMBER_REMOVE, tr.MEMBER_LEAVE))
        .groupBy(*key)
        .agg(F.max(F.struct("hlc", "op")).alias("rm"), F.first("shard_key").alias("k2"))
    )
    rows = (
        adds.join(removes, on=key, how="full_outer")
        .select(
            *key,
            F.coalesce(F.col("top.hlc"), F.lit(0)).alias("added_at"),
            F.coalesce(F.col("top.role"), F.lit(0)).cast("int").alias("role"),
            F.col("top.op").alias("add_proof"),
            F.col("rm.hlc").alias("removed_at"),
            F.col("rm.op").alias("remove_proof"),
            F.coalesce("k1", "k2").alias("shard_key"),
        )
        .withColumn(
            "active",
            F.col("removed_at").isNull() | (F.col("removed_at") < F.col("added_at")),
        )
    )
    member_id = F.udf(_member_id, BinaryType())
    members = rows.select(
        *key,
        member_id(
            "chat", "user", "role", "added_at", "removed_at", "add_proof", "remove_proof"
        ).alias("id"),
        "active",
        "shard_key",
    )
    oracle.members = [
        (r["chat"], r["user"], r["id"], bool(r["active"]), r["shard_key"])
        for r in members.collect()
    ]

    identity_id = F.udf(_identity_id, BinaryType())
    identities = (
        valid.where(F.col("kind") == tr.IDENTITY)
        .groupBy("user")
        .agg(F.max(F.struct("hlc", "blob")).alias("top"), F.first("shard_key").alias("shard_key"))
        .select("user", identity_id("user", "top.hlc", "top.blob").alias("id"), "shard_key")
    )
    oracle.identities = [(r["user"], r["id"], r["shard_key"]) for r in identities.collect()]
    return oracle


def oracle_summary(oracle: Oracle) -> dict[str, Any]:
    return {
        "valid_ops": oracle.valid_ops,
        "invalid_ops": oracle.invalid_ops,
        "messages": len(oracle.messages),
        "messages_visible": sum(1 for m in oracle.messages if m[1]),
        "visible_root": oracle.visible_root(),
        "messages_inadmissible": oracle.inadmissible,
        "member_ops": len(oracle.member_ops),
        "member_rows": len(oracle.members),
        "active_members": oracle.active_members(),
        "identities": len(oracle.identities),
    }
