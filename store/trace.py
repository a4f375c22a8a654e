"""The simulator's trace format: one Parquet file of timestamped events, ops and faults, per node.

SIM.md documents the columns; this module is the one place that knows them. It
lives in ``store`` because both the simulator (``sim/``) and a node's recorder
(``node/recorder.py``) use it, and neither may import the other.
``TraceWriter`` is the API both the generator and a running node (``--trace-out``)
use: ``op(t_ms, node, op)`` records a signed op exactly as ``store.ops`` encodes it
for gossip, ``fault(...)`` records a fault. ``read_trace`` / ``read_header`` read
one back. Times are true (virtual) milliseconds since the Unix epoch: a node
records its wall clock, the generator its virtual clock; a node's skewed clock
shows only in the HLC stamps inside its ops and in ``skew`` events.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import blake3
import pyarrow as pa
import pyarrow.parquet as pq

from store.ops import MembershipAction, MembershipOp, Op, OpKind, encode_op
from store.records import IdentityRecord, MsgV1

FORMAT_VERSION = 2  # 2: messages and member ops shard by their chat
META_KEY = b"chatsync.sim.header"
QUIESCE_ROUNDS = 30  # anti-entropy rounds a merged recording gets after its last event

# --- event kinds -------------------------------------------------------------------------

MSG = "msg"
MEMBER_ADD = "member_add"
MEMBER_REMOVE = "member_remove"
MEMBER_LEAVE = "member_leave"
IDENTITY = "identity"
OP_KINDS = (MSG, MEMBER_ADD, MEMBER_REMOVE, MEMBER_LEAVE, IDENTITY)
# the store's op kind of each op row (``store.ops.decode_op(OP_CODES[kind], row["op"])``)
OP_CODES = {
    MSG: OpKind.PUT_MESSAGE,
    MEMBER_ADD: OpKind.MEMBERSHIP,
    MEMBER_REMOVE: OpKind.MEMBERSHIP,
    MEMBER_LEAVE: OpKind.MEMBERSHIP,
    IDENTITY: OpKind.PUT_IDENTITY,
}
MEMBER_KINDS = (MEMBER_ADD, MEMBER_REMOVE, MEMBER_LEAVE)

PARTITION = "partition"  # group <-> the rest, both directions cut
PARTITION_ONEWAY = "partition_oneway"  # group -> the rest cut; the rest -> group flows
HEAL = "heal"  # every partition removed
NET = "net"  # gossip conditions from now on: drop, dup, delay_ms, jitter_ms
CRASH = "crash"  # node stops; writes it received but had not flushed are lost
RESTART = "restart"
SKEW = "skew"  # node's clock reads true time + offset_ms from now on
FAR_FUTURE = "far_future"  # a skew beyond max offset: the node's HLC is poisoned
GC = "gc"  # node runs the retention GC
SCOPE = "scope"  # node holds the shards in ``group`` from now on (partial replication)
FAULT_KINDS = (PARTITION, PARTITION_ONEWAY, HEAL, NET, CRASH, RESTART, SKEW, FAR_FUTURE, GC, SCOPE)

_ACTION_KIND = {
    MembershipAction.ADD: MEMBER_ADD,
    MembershipAction.REMOVE: MEMBER_REMOVE,
    MembershipAction.LEAVE: MEMBER_LEAVE,
}

SCHEMA = pa.schema(
    [
        pa.field("t_ms", pa.int64(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("node", pa.int32(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("op", pa.binary()),
        pa.field("op_id", pa.binary(32)),
        pa.field("shard_key", pa.int32()),
        pa.field("chat", pa.binary()),
        pa.field("user", pa.binary()),
        pa.field("hlc", pa.int64()),
        pa.field("role", pa.int8()),
        pa.field("blob", pa.binary()),
        pa.field("group", pa.list_(pa.int32())),
        pa.field("drop", pa.float64()),
        pa.field("dup", pa.float64()),
        pa.field("delay_ms", pa.int64()),
        pa.field("jitter_ms", pa.int64()),
        pa.field("offset_ms", pa.int64()),
    ]
)
COLUMNS = tuple(SCHEMA.names)


@dataclass
class TraceHeader:
    """File-level facts the replay needs; stored as JSON in the Parquet schema metadata."""

    nodes: int
    seed: int = 0
    start_ms: int = 0
    heal_ms: int = 0  # the trace's faults are over: every node up, healed, clocks fixed
    end_ms: int = 0  # last event; the check runs here (after the final GC at end_ms)
    retention_ms: int = 7 * 86_400_000
    gc_grain_ms: int = 1  # retention cutoffs are rounded down to this (sim/retention_model.py)
    max_offset_ms: int = 120_000
    anti_entropy_ms: int = 5_000  # every live node starts a session this often
    flush_ms: int = 1_000  # received writes become durable on this grid (and at local writes)
    delay_ms: int = 50  # gossip conditions at start (``net`` events change them)
    jitter_ms: int = 100
    drop: float = 0.0
    dup: float = 0.0
    users: int = 0
    chats: int = 0
    ops: int = 0
    source: str = "generated"  # or "recorded" (a node's --trace-out)
    command: str = ""  # the command that made it (replays it)
    params: dict[str, Any] = field(default_factory=dict)
    format: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TraceHeader:
        data = json.loads(text)
        if data.get("format") != FORMAT_VERSION:
            raise ValueError(f"unsupported trace format {data.get('format')!r}")
        return cls(**data)


def row_shard_key(*parts: bytes) -> int:
    """0..65535: a hash of the key a record is sharded by (``chat_shard_key``, an identity's user)."""
    digest = blake3.blake3(b"".join(parts)).digest(2)
    return (digest[0] << 8) | digest[1]


def chat_shard_key(chat_id: bytes) -> int:
    """A message's and a member op's shard key: a message's visibility is a function of its
    chat's member ops, so a shard holds a chat's messages and member ops together."""
    return row_shard_key(chat_id)


def op_columns(op: Op) -> dict[str, Any]:
    """The op's columns (kind, op bytes, ids, and the fields the oracle reads)."""
    data = encode_op(op)
    if isinstance(op, MsgV1):
        msg_id = op.msg_id
        return {
            "kind": MSG,
            "op": data,
            "op_id": msg_id,
            "shard_key": chat_shard_key(op.chat_id),
            "chat": op.chat_id,
            "user": op.sender,
            "hlc": op.hlc.pack(),
        }
    op_id = blake3.blake3(data).digest()
    if isinstance(op, MembershipOp):
        return {
            "kind": _ACTION_KIND[op.action],
            "op": data,
            "op_id": op_id,
            "shard_key": chat_shard_key(op.chat_id),
            "chat": op.chat_id,
            "user": op.user_id,
            "hlc": op.hlc.pack(),
            "role": int(op.role),
        }
    if isinstance(op, IdentityRecord):
        return {
            "kind": IDENTITY,
            "op": data,
            "op_id": op_id,
            "shard_key": row_shard_key(op.user_id),
            "user": op.user_id,
            "hlc": op.hlc.pack(),
            "blob": op.blob,
        }
    raise TypeError(f"not an op: {type(op).__name__}")


class TraceWriter:
    """Append events to a trace file; the hook a running node calls for ``--trace-out``.

    ``op`` and ``fault`` buffer rows; every ``row_group`` rows go to disk as one
    Parquet row group; ``close`` writes the rest and the footer (a trace is
    readable only after ``close``). Events should come in time order; the reader
    sorts by ``(t_ms, seq)`` anyway, ``seq`` being the call order.
    """

    def __init__(self, path: str | Path, header: TraceHeader, *, row_group: int = 65_536) -> None:
        self.path = Path(path)
        self.header = header
        self._row_group = row_group
        self._rows: dict[str, list[Any]] = {c: [] for c in COLUMNS}
        self._seq = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        schema = SCHEMA.with_metadata({META_KEY: header.to_json().encode()})
        self._writer: pq.ParquetWriter | None = pq.ParquetWriter(
            str(self.path), schema, compression="zstd"
        )

    def op(self, t_ms: int, node: int, op: Op) -> None:
        self.op_row(t_ms, node, op_columns(op))

    def op_row(self, t_ms: int, node: int, columns: dict[str, Any]) -> None:
        """Record an op from precomputed ``op_columns`` (the generator signs in workers)."""
        self._append(t_ms, node, columns)

    def fault(
        self,
        t_ms: int,
        kind: str,
        node: int = -1,
        *,
        group: list[int] | None = None,
        drop: float | None = None,
        dup: float | None = None,
        delay_ms: int | None = None,
        jitter_ms: int | None = None,
        offset_ms: int | None = None,
    ) -> None:
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}")
        columns = {
            "kind": kind,
            "group": group,
            "drop": drop,
            "dup": dup,
            "delay_ms": delay_ms,
            "jitter_ms": jitter_ms,
            "offset_ms": offset_ms,
        }
        self._append(t_ms, node, columns)

    def _append(self, t_ms: int, node: int, columns: dict[str, Any]) -> None:
        if self._writer is None:
            raise ValueError("trace writer is closed")
        row = {"t_ms": t_ms, "seq": self._seq, "node": node, **columns}
        self._seq += 1
        for name, values in self._rows.items():
            values.append(row.get(name))
        if len(self._rows["t_ms"]) >= self._row_group:
            self._flush()

    def _flush(self) -> None:
        if self._writer is None or not self._rows["t_ms"]:
            return
        table = pa.table(self._rows, schema=SCHEMA)
        self._writer.write_table(table)
        self._rows = {c: [] for c in COLUMNS}

    def close(self) -> None:
        if self._writer is not None:
            self._flush()
            self._writer.close()
            self._writer = None

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@dataclass
class Trace:
    header: TraceHeader
    table: pa.Table  # sorted by (t_ms, seq)

    @property
    def events(self) -> int:
        return int(self.table.num_rows)


def read_header(path: str | Path) -> TraceHeader:
    metadata = pq.read_schema(str(path)).metadata or {}
    if META_KEY not in metadata:
        raise ValueError(f"{path}: not a chatsync trace (no {META_KEY.decode()} metadata)")
    return TraceHeader.from_json(metadata[META_KEY].decode())


def read_trace(path: str | Path, columns: list[str] | None = None) -> Trace:
    header = read_header(path)
    wanted = None if columns is None else list(dict.fromkeys(["t_ms", "seq", *columns]))
    table = pq.read_table(str(path), columns=wanted)
    table = table.sort_by([("t_ms", "ascending"), ("seq", "ascending")])
    return Trace(header, table)


def merge_traces(paths: list[Path], out: Path, header: TraceHeader | None = None) -> TraceHeader:
    """One trace from several nodes' recordings: node i's events come from ``paths[i]``."""
    tables = []
    headers = [read_header(p) for p in paths]
    for index, path in enumerate(paths):
        table = pq.read_table(str(path))
        nodes = pa.array([index] * table.num_rows, pa.int32())
        tables.append(table.set_column(table.schema.get_field_index("node"), "node", nodes))
    merged = pa.concat_tables(tables).sort_by([("t_ms", "ascending"), ("seq", "ascending")])
    merged = merged.set_column(
        merged.schema.get_field_index("seq"), "seq", pa.array(range(merged.num_rows), pa.int64())
    )
    t = merged.column("t_ms")
    base = header or headers[0]
    combined = TraceHeader(
        **{
            **asdict(base),
            "nodes": len(paths),
            "source": "recorded",
            # recordings write their header before they know how many ops follow
            "ops": sum(1 for kind in merged.column("kind").to_pylist() if kind in OP_KINDS),
            "start_ms": int(t[0].as_py()) if merged.num_rows else 0,
        }
    )
    if merged.num_rows:
        last = int(t[merged.num_rows - 1].as_py())
        combined.heal_ms = max(combined.heal_ms, last)
        combined.end_ms = max(combined.end_ms, last + QUIESCE_ROUNDS * combined.anti_entropy_ms)
    schema = SCHEMA.with_metadata({META_KEY: combined.to_json().encode()})
    pq.write_table(merged.cast(schema), str(out), compression="zstd")
    return combined
