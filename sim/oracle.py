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
* **identity**, per user: the valid put with the greatest (hlc, blob);
* **message kinds** (MESSAGES.md), folded per chat by this module's own code
  (``fold_kinds``, not ``store/kinds.py``): the DELETES domain is every admissible
  DELETE (never collected); a delete is *valid* if its 29-byte claims name content
  stamped before it and it is by the claimed sender, the group's creator or a user
  with an admin add stamped at or before it; a valid delete *erases* the message with
  its ref id whose header matches the claims, the EDITs with that ref by the claimed
  sender and the REACTIONs with that ref. The MESSAGES domain is the admissible
  messages newer than the cutoff minus the erased ones (deletes apart); the expected
  **view** of each chat is folded from those (current payload, edited, reply state,
  reactions, tombstones, read positions);
* **group keys** (``sim.key_oracle``): per group message, who should read it (members at
  its stamp) and who can (holders of a grant covering it): ``undecryptable_for_member`` and
  ``readable_by_removed``, which the check wants 0.

Record ids come from ``store.records``' id functions (they define what an id is);
the oracle's roots are ``MerkleTree.from_ids`` over its ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import blake3
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, BooleanType, IntegerType, StructField, StructType

from sim import key_oracle
from sim.key_oracle import KeyCounts
from sim.shards import (
    Expected,
    ViewItem,
    content_item,
    shard_of,
    tombstone_item,
    view_digest,
    views_digest,
)
from store import trace as tr
from store.hlc import Hlc
from store.ops import MembershipOp, OpKind, decode_op
from store.records import MsgV1, compute_identity_record_id, compute_member_record_id
from sync.frames import Domain
from sync.merkle import MerkleTree


@dataclass
class Oracle:
    messages: list[tuple[bytes, bool, int]] = field(default_factory=list)  # (id, visible, key)
    member_ops: list[tuple[bytes, int]] = field(default_factory=list)  # (op id, shard_key)
    # (chat, user, row version, active, shard_key)
    members: list[tuple[bytes, bytes, bytes, bool, int]] = field(default_factory=list)
    identities: list[tuple[bytes, bytes, int]] = field(default_factory=list)  # (user, id, key)
    deletes: list[tuple[bytes, int]] = field(default_factory=list)  # (delete id, shard_key)
    erased: list[tuple[bytes, int]] = field(default_factory=list)  # (message id, shard_key)
    views: list[tuple[bytes, bytes, int]] = field(default_factory=list)  # (chat, digest, key)
    edited: int = 0  # content messages kept whose view shows an edit
    tombstones: int = 0
    valid_ops: int = 0
    invalid_ops: int = 0
    inadmissible: int = 0  # valid messages after the cutoff that no op admits
    keys: KeyCounts = field(default_factory=KeyCounts)  # who can read which group message
    # scoped traces: each node's last scope event, the chat of every message, delete and
    # member op, and the user each member op names
    final_scopes: dict[int, frozenset[int]] = field(default_factory=dict)
    chat_of: dict[bytes, bytes] = field(default_factory=dict)
    user_of: dict[bytes, bytes] = field(default_factory=dict)
    scope_shards: int = 0
    replication: int = 3

    def ids(self, domain: Domain) -> list[bytes]:
        if domain is Domain.MESSAGES:
            return [m[0] for m in self.messages]
        if domain in (Domain.MEMBERS, Domain.INDEX):  # a full node indexes every op
            return [m[0] for m in self.member_ops]
        if domain is Domain.DELETES:
            return [d[0] for d in self.deletes]
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
        exp.deletes = {i for i, key in self.deletes if shard_of(key, shards) == shard}
        exp.erased = {i for i, key in self.erased if shard_of(key, shards) == shard}
        exp.views = {chat: d for chat, d, key in self.views if shard_of(key, shards) == shard}
        if self.scope_shards:
            exp.scope_shards, exp.replication = self.scope_shards, self.replication
            exp.final_scopes = self.final_scopes
            held = (*exp.messages, *exp.deletes, *exp.erased, *exp.member_ops)
            exp.chat_of = {i: self.chat_of[i] for i in held}
            exp.user_of = {i: self.user_of[i] for i in exp.member_ops}
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
    """Per message (id, shard_key, and its fields): admissible and visible, from the ops of
    its (chat, sender) stamped at or before it. A: the greatest add stamp; R: the greatest
    remove or leave stamp. Admissible iff A exists; visible iff also R is absent or older
    than A."""
    fields = ("chat", "user", "t", "physical", "mkind", "ref", "payload")
    m = msgs.select(
        record_id("op").alias("id"),
        "chat",
        "user",
        F.col("hlc").alias("t"),
        "shard_key",
        "physical",
        "msg.mkind",
        "msg.ref",
        "msg.payload",
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
        .groupBy("id", "shard_key", *fields)
        .agg(
            F.max(F.when(F.col("is_add"), F.col("o_hlc"))).alias("A"),
            F.max(F.when(~F.col("is_add"), F.col("o_hlc"))).alias("R"),
        )
    )
    admissible = F.col("A").isNotNull()
    return decided.select(
        "id",
        "shard_key",
        *fields,
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
    ops = member_ops.select(record_id("op").alias("id"), "shard_key", "chat", "user").distinct()
    oracle.member_ops = []
    for r in ops.collect():
        oracle.member_ops.append((r["id"], r["shard_key"]))
        if header.params.get("scope_shards"):
            oracle.chat_of[r["id"]], oracle.user_of[r["id"]] = r["chat"], r["user"]
    # Every valid message, aged or not: a delete erases whatever it names, at any age.
    decoded = valid.where(F.col("kind") == tr.MSG).withColumn(
        "msg", F.udf(_msg_fields, MSG_FIELDS)("op")
    )
    # a malformed public payload is refused at every ingress (the origin's included)
    malformed = decoded.where(~F.col("msg.well_formed")).count()
    oracle.valid_ops -= malformed
    oracle.invalid_ops += malformed
    msgs = decoded.where(F.col("msg.well_formed"))
    messages = _messages(msgs, member_ops, record_id)
    oracle.inadmissible = messages.where(
        ~F.col("admissible") & (F.col("physical") > F.lit(cutoff)) & (F.col("mkind") != DELETE)
    ).count()
    creator = F.udf(_creator, BinaryType())
    creators = {
        r["chat"]: r["creator"]
        for r in member_ops.groupBy("chat").agg(F.first(creator("op")).alias("creator")).collect()
    }
    admin_adds = (
        member_ops.where((F.col("kind") == tr.MEMBER_ADD) & (F.col("role") == ADMIN_ROLE))
        .groupBy("chat", "user")
        .agg(F.min("hlc").alias("since"))
    )
    admins: dict[bytes, dict[bytes, int]] = {}
    for r in admin_adds.collect():
        admins.setdefault(r["chat"], {})[r["user"]] = r["since"]
    chat_keys = {
        r["chat"]: r["shard_key"]
        for r in member_ops.select("chat", "shard_key").distinct().collect()
    }
    admitted = messages.where(F.col("admissible")).select(
        "chat", "id", "user", "t", "mkind", "ref", "payload", "visible", "physical"
    )
    folded = (
        admitted.rdd.map(lambda r: (r["chat"], tuple(r)[1:]))
        .groupByKey()
        .map(
            lambda kv: (
                kv[0],
                fold_kinds(list(kv[1]), creators.get(kv[0]), admins.get(kv[0], {}), cutoff),
            )
        )
        .collect()
    )
    empty = view_digest([], [])
    digests = dict.fromkeys(chat_keys, empty)
    for chat, out in folded:
        key = chat_keys.get(chat, tr.chat_shard_key(chat))
        if header.params.get("scope_shards"):
            oracle.chat_of.update((i, chat) for i in (*(i for i, _ in out.kept), *out.deletes))
            oracle.chat_of.update((i, chat) for i in out.erased)
        oracle.messages += [(i, shown, key) for i, shown in out.kept]
        oracle.deletes += [(i, key) for i in out.deletes]
        oracle.erased += [(i, key) for i in out.erased]
        oracle.edited += out.edited
        oracle.tombstones += out.tombstones
        digests[chat] = out.digest
    oracle.views = [
        (chat, d, chat_keys.get(chat, tr.chat_shard_key(chat))) for chat, d in digests.items()
    ]
    oracle.keys = _count_keys(member_ops, msgs)

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
    if header.params.get("scope_shards"):
        _final_scopes(spark, trace_uri, header, oracle)
    return oracle


def _final_scopes(
    spark: SparkSession, trace_uri: str, header: tr.TraceHeader, oracle: Oracle
) -> None:
    """Scoped traces: what each node holds at the end — its last ``scope`` event."""
    oracle.scope_shards = int(header.params["scope_shards"])
    oracle.replication = int(header.params.get("replication", 3))
    last = (
        spark.read.parquet(trace_uri)
        .where(F.col("kind") == tr.SCOPE)
        .groupBy("node")
        .agg(F.max(F.struct("t_ms", "seq", "group")).alias("last"))
    )
    oracle.final_scopes = {
        int(r["node"]): frozenset(r["last"]["group"] or ()) for r in last.collect()
    }


def _count_keys(member_ops: DataFrame, msgs: DataFrame) -> KeyCounts:
    """Group keys (``sim.key_oracle``): per chat, from its valid member ops and its valid
    group and KEYS messages, whatever their age."""
    ops = member_ops.select(
        "chat", "user", "hlc", (F.col("kind") == tr.MEMBER_ADD).alias("is_add")
    ).distinct()
    sealed = (
        msgs.where(F.col("msg.mkind").isin(*key_oracle.KINDS))
        .select("chat", "user", "hlc", "msg.mkind", "msg.payload")
        .distinct()
    )
    rows = ops.rdd.map(lambda r: (r[0], (True, r[1], r[2], int(r[3]), None))).union(
        sealed.rdd.map(lambda r: (r[0], (False, r[1], r[2], r[3], r[4])))
    )
    total = KeyCounts()
    for counts in rows.groupByKey().map(lambda kv: key_oracle.count_keys(kv[1])).collect():
        total.add(counts)
    return total


# --- message kinds, per chat (MESSAGES.md; this module's own fold) ---------------------------

NEW, EDIT, REPLY, REACTION, READ_RECEIPT, DELETE = range(6)  # MsgV1's kind byte
CONTENT_KINDS = (NEW, REPLY)
ADMIN_ROLE = 1  # a member op's role byte for an admin
CLAIMS_BYTES = 20 + 8 + 1  # sender, packed HLC, kind
MSG_FIELDS = StructType(
    [
        StructField("mkind", IntegerType()),
        StructField("ref", BinaryType()),
        StructField("payload", BinaryType()),
        StructField("well_formed", BooleanType()),
    ]
)


def _msg_fields(op: bytes) -> tuple[int, bytes | None, bytes, bool]:
    msg = decode_op(OpKind.PUT_MESSAGE, op)
    assert isinstance(msg, MsgV1)
    kind, payload = int(msg.kind), msg.payload
    return kind, msg.ref, payload, _well_formed(kind, payload, msg.hlc.pack())


def _well_formed(kind: int, payload: bytes, hlc: int) -> bool:
    """The public payloads (MESSAGES.md): a delete's 29 bytes of claims naming a known kind,
    a reaction's flag (0 or 1) and 1..64-byte key, a receipt's position not after its stamp."""
    if kind == DELETE:
        return len(payload) == CLAIMS_BYTES and payload[-1] <= DELETE
    if kind == REACTION:
        return 2 <= len(payload) <= 65 and payload[0] in (0, 1)
    if kind == READ_RECEIPT:
        return len(payload) == 8 and int.from_bytes(payload, "big") <= hlc
    return True


def _creator(op: bytes) -> bytes | None:
    member_op = decode_op(OpKind.MEMBERSHIP, op)
    assert isinstance(member_op, MembershipOp)
    proof = member_op.proof
    return getattr(proof, "creator", None)


@dataclass
class Row:
    """One admissible message of a chat, as the fold reads it (stamps packed)."""

    id: bytes
    user: bytes
    hlc: int
    kind: int
    ref: bytes | None
    payload: bytes
    visible: bool
    physical: int

    @property
    def order(self) -> tuple[int, bytes]:
        return self.hlc, self.id


@dataclass
class Folded:
    kept: list[tuple[bytes, bool]]  # the MESSAGES domain: (id, visible)
    deletes: list[bytes]
    erased: list[bytes]
    digest: bytes
    edited: int
    tombstones: int


def _claims(delete: Row) -> tuple[bytes, int, int] | None:
    """(sender, packed stamp, kind) from a delete's payload, or None if malformed."""
    p = delete.payload
    if len(p) != CLAIMS_BYTES or p[-1] > DELETE:
        return None
    return p[:20], int.from_bytes(p[20:28], "big"), p[-1]


def fold_kinds(
    rows: list[tuple[Any, ...]], creator: bytes | None, admins: dict[bytes, int], cutoff: int
) -> Folded:
    """One chat: which messages it keeps, which deletes it holds and erases, and its view."""
    msgs = [Row(*r) for r in rows]
    deletes = [m for m in msgs if m.kind == DELETE]

    def valid(d: Row) -> bool:
        claims = _claims(d)
        if claims is None or claims[2] not in CONTENT_KINDS or not claims[1] < d.hlc:
            return False
        since = admins.get(d.user)
        return d.user in (claims[0], creator) or (since is not None and since <= d.hlc)

    valid_deletes = sorted((d for d in deletes if valid(d)), key=lambda d: d.order)
    by_ref: dict[bytes, list[tuple[bytes, int, int]]] = {}
    for d in valid_deletes:
        assert d.ref is not None
        claims = _claims(d)
        assert claims is not None
        by_ref.setdefault(d.ref, []).append(claims)

    def erased(m: Row) -> bool:
        if any(c == (m.user, m.hlc, m.kind) for c in by_ref.get(m.id, ())):
            return True
        if m.ref is None or m.ref not in by_ref:
            return False
        if m.kind == REACTION:
            return True
        return m.kind == EDIT and any(c[0] == m.user for c in by_ref[m.ref])

    others = [m for m in msgs if m.kind != DELETE]
    gone = {m.id for m in others if erased(m)}
    kept = {m.id: m for m in others if m.id not in gone and m.physical > cutoff}
    shown = [m for m in kept.values() if m.visible]
    refs: dict[bytes, list[Row]] = {}
    for m in shown:
        if m.ref is not None:
            refs.setdefault(m.ref, []).append(m)
    items: list[ViewItem] = []
    edited = 0
    for m in shown:
        if m.kind not in CONTENT_KINDS:
            continue
        near = refs.get(m.id, [])
        edits = [e for e in near if e.kind == EDIT and e.user == m.user and m.hlc < e.hlc]
        latest = max(edits, key=lambda e: e.order) if edits else None
        edited += latest is not None
        items.append(
            content_item(
                m.id,
                m.hlc,
                latest.payload if latest else m.payload,
                latest.hlc if latest else None,
                _reply_state(m, kept, by_ref),
                _reactions([r for r in near if r.kind == REACTION]).items(),
            )
        )
    tombstones = 0
    for ref in {d.ref for d in valid_deletes if d.ref not in kept}:
        first = next(d for d in valid_deletes if d.ref == ref)  # sorted: the earliest
        claims = _claims(first)
        assert ref is not None and claims is not None
        items.append(tombstone_item(ref, claims[1], claims[0], first.user, first.hlc))
        tombstones += 1
    positions: dict[bytes, int] = {}
    for m in shown:
        if m.kind == READ_RECEIPT and len(m.payload) == 8:
            position = int.from_bytes(m.payload, "big")
            if position <= m.hlc:
                positions[m.user] = max(positions.get(m.user, position), position)
    return Folded(
        [(i, m.visible) for i, m in kept.items()],
        [d.id for d in deletes],
        sorted(gone),
        view_digest(items, positions.items()),
        edited,
        tombstones,
    )


def _reply_state(
    m: Row, kept: dict[bytes, Row], by_ref: dict[bytes, list[tuple[bytes, int, int]]]
) -> str | None:
    if m.kind != REPLY:
        return None
    if m.ref in kept:
        return "present"
    return "deleted" if m.ref in by_ref else "unknown"


def _reactions(reactions: list[Row]) -> dict[bytes, list[bytes]]:
    """key -> users whose latest (hlc, id) reaction with that key is on."""
    latest: dict[tuple[bytes, bytes], Row] = {}
    for r in reactions:
        if not 2 <= len(r.payload) <= 65 or r.payload[0] > 1:
            continue
        slot = (r.user, r.payload[1:])
        if slot not in latest or r.order > latest[slot].order:
            latest[slot] = r
    users: dict[bytes, list[bytes]] = {}
    for (user, key), r in latest.items():
        if r.payload[0] == 1:
            users.setdefault(key, []).append(user)
    return users


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
        "deletes": len(oracle.deletes),
        "erased": len(oracle.erased),
        "edited_messages": oracle.edited,
        "tombstones": oracle.tombstones,
        "views_digest": views_digest({chat: d for chat, d, _ in oracle.views}),
        "group_messages": oracle.keys.group_messages,
        "keys_messages": oracle.keys.keys_messages,
        "undecryptable_for_member": oracle.keys.undecryptable_for_member,
        "readable_by_removed": oracle.keys.readable_by_removed,
        "hidden_keys_messages": oracle.keys.hidden_keys_messages,
    }
