"""Sync frames: small frozen classes and their CBOR codec.

Every frame is a CBOR array ``[type, ...]``. ``decode_frame`` checks the size,
the structure and every field's type and bounds; what depends on the session
(which bitmap length is expected, whether a bucket is under reconciliation) is
checked by the protocol. Anything wrong raises ``RemoteProtocolError`` with a
reason — never a cbor2, KeyError or IndexError.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import cbor2

from store.errors import shown
from store.keys import NUM_BUCKETS, RECORD_ID_LEN
from sync.errors import RemoteProtocolError
from sync.scope import EVERYTHING, MAX_SHARDS, Scope, ScopeError

PROTOCOL_VERSION = 1
SALT_LEN = 16
ID_PREFIX_LEN = 8  # salted id prefixes in bucket id lists
CELL_LEN = 4 + 32 + 4  # count u32, xor 256 bits, check u32
MIN_HASH_WIDTH, MAX_HASH_WIDTH = 2, 16


class Domain(IntEnum):
    MESSAGES = 0
    MEMBERS = 1
    IDENTITY = 2
    DELETES = 3  # DELETE messages: grow-only, never expired (MESSAGES.md)


class FrameType(IntEnum):
    HELLO = 1
    DONE = 2
    NODES = 3
    CELLS = 4
    TRANSFER = 5
    ABORT = 6


@dataclass(frozen=True, slots=True)
class Hello:
    """Starts a pass: the initiator's full-width roots, the pass's salt and hash width.

    ``cutoff_ms``: the initiator's retention cutoff for messages (0: none). ``final``:
    compare roots and end — no descent (the last pass moved nothing it could move).
    ``scope``: what the initiator offers to reconcile (``sync.scope``); the roots of the
    scoped domains are over it. Full: not on the wire (today's seven fields).
    """

    pass_no: int
    salt: bytes
    width: int
    roots: dict[Domain, tuple[bytes, int]]  # domain -> (xor, count)
    cutoff_ms: int = 0
    final: bool = False
    scope: Scope = EVERYTHING


@dataclass(frozen=True, slots=True)
class Done:
    converged: bool


@dataclass(frozen=True, slots=True)
class Nodes:
    """Per domain: a bitmap over the peer's last node list (which differed) and our next hashes.

    ``cutoff_ms`` in the responder's first NODES of a pass: the session's message cutoff,
    the later of both sides' (0: none); both then neither list, ship nor accept older.
    ``scope`` in the responder's first NODES of a pass, when the intersection of both
    scopes is narrower than the initiator's HELLO offered: the session's scope from now on.
    """

    sections: dict[Domain, tuple[bytes, bytes]]  # domain -> (flags, concatenated hashes)
    cutoff_ms: int = 0
    scope: Scope | None = None


@dataclass(frozen=True, slots=True)
class Cells:
    """Per domain: a bitmap over the peer's leaf list and our cells for the flagged leaves."""

    sections: dict[Domain, tuple[bytes, bytes]]  # domain -> (flags, concatenated cells)


@dataclass(frozen=True, slots=True)
class IdList:
    bucket: int
    complete: bool  # False: a salted sample of an oversized bucket, absence proves nothing
    prefixes: bytes  # concatenated ID_PREFIX_LEN-byte salted prefixes


@dataclass(frozen=True, slots=True)
class PrefixWant:
    bucket: int
    prefixes: bytes


@dataclass(frozen=True, slots=True)
class TransferSection:
    records: list[bytes] = field(default_factory=list)
    wants: bytes = b""  # concatenated 32-byte record ids
    id_lists: list[IdList] = field(default_factory=list)
    prefix_wants: list[PrefixWant] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.records or self.wants or self.id_lists or self.prefix_wants)


@dataclass(frozen=True, slots=True)
class Transfer:
    """Records, and requests for records. ``idle``: the sender has nothing queued and asks nothing."""

    idle: bool
    sections: dict[Domain, TransferSection]


@dataclass(frozen=True, slots=True)
class Abort:
    reason: str


Frame = Hello | Done | Nodes | Cells | Transfer | Abort


# --- encoding -----------------------------------------------------------------------------


def encode_frame(frame: Frame) -> bytes:
    match frame:
        case Hello(pass_no, salt, width, roots, cutoff_ms, final, scope):
            body: list[Any] = [
                FrameType.HELLO, PROTOCOL_VERSION, pass_no, salt, width,
                [[int(d), xor, count] for d, (xor, count) in sorted(roots.items())],
                cutoff_ms, final,
            ]  # fmt: skip
            if not scope.is_full:
                body.append(scope.to_wire())
        case Done(converged):
            body = [FrameType.DONE, converged]
        case Nodes(sections, cutoff_ms, scope):
            body = [FrameType.NODES, _tree_sections(sections), cutoff_ms]
            if scope is not None and not scope.is_full:
                body.append(scope.to_wire())
        case Cells(sections):
            body = [FrameType.CELLS, _tree_sections(sections)]
        case Transfer(idle, sections):
            body = [
                FrameType.TRANSFER,
                idle,
                [_encode_section(d, s) for d, s in sorted(sections.items())],
            ]
        case Abort(reason):
            body = [FrameType.ABORT, reason[:200]]
    return cbor2.dumps(body)


def _tree_sections(sections: dict[Domain, tuple[bytes, bytes]]) -> list[Any]:
    return [[int(d), a, b] for d, (a, b) in sorted(sections.items())]


def _encode_section(domain: Domain, s: TransferSection) -> list[Any]:
    return [
        int(domain),
        s.records,
        s.wants,
        [[i.bucket, i.complete, i.prefixes] for i in s.id_lists],
        [[w.bucket, w.prefixes] for w in s.prefix_wants],
    ]


# --- decoding -----------------------------------------------------------------------------


def _fail(message: str, reason: str = "malformed_frame") -> RemoteProtocolError:
    return RemoteProtocolError(message, reason=reason)


def _list(value: Any, what: str, max_len: int) -> list[Any]:
    if type(value) is not list:
        raise _fail(f"{what} must be an array")
    if len(value) > max_len:
        raise _fail(f"{what} has {len(value)} items, over {max_len}", "too_many_items")
    return value


def _uint(value: Any, what: str, limit: int = 1 << 64) -> int:
    if type(value) is not int or not 0 <= value < limit:
        raise _fail(f"{what} must be an unsigned integer below {limit}")
    return value


def _bytes(value: Any, what: str, *, length: int | None = None, multiple: int = 1) -> bytes:
    if type(value) is not bytes:
        raise _fail(f"{what} must be a byte string")
    if length is not None and len(value) != length:
        raise _fail(f"{what} must be {length} bytes, got {len(value)}")
    if len(value) % multiple:
        raise _fail(f"{what} length {len(value)} is not a multiple of {multiple}")
    return value


def _bool(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise _fail(f"{what} must be a boolean")
    return value


def _domain(value: Any) -> Domain:
    number = _uint(value, "domain", 256)
    try:
        return Domain(number)
    except ValueError:
        raise _fail(f"unknown domain {number}", "unknown_domain") from None


def _bucket(value: Any) -> int:
    if type(value) is not int or not 0 <= value < NUM_BUCKETS:
        raise _fail(f"bucket out of range 0..{NUM_BUCKETS - 1}: {shown(value)}", "bad_bucket")
    return value


def _sections(value: Any, what: str) -> list[tuple[Domain, list[Any]]]:
    out: dict[Domain, list[Any]] = {}
    for item in _list(value, what, len(Domain)):
        item = _list(item, f"{what} section", 8)
        if not item:
            raise _fail(f"{what} section is empty")
        domain = _domain(item[0])
        if domain in out:
            raise _fail(f"{what}: domain {domain.name} appears twice", "duplicate_domain")
        out[domain] = item[1:]
    return list(out.items())


def _arity(items: list[Any], n: int, what: str) -> list[Any]:
    if len(items) != n:
        raise _fail(f"{what} must have {n} fields, got {len(items)}")
    return items


def decode_frame(data: bytes, *, max_frame: int, max_ids: int) -> Frame:
    """Parse one frame from a peer. ``max_ids`` bounds the ids, prefixes and records it may carry."""
    if len(data) > max_frame:
        raise _fail(
            f"frame of {len(data)} bytes exceeds the limit of {max_frame}", "oversize_frame"
        )
    try:
        value = cbor2.loads(data)
    except Exception as exc:  # cbor2 raises many types on garbage; all mean the same here
        raise _fail(f"frame is not valid CBOR ({exc.__class__.__name__})") from None
    if type(value) is not list or not value:
        raise _fail("frame must be a non-empty array")
    kind = value[0]
    if type(kind) is not int or kind not in FrameType._value2member_map_:
        raise _fail(f"unknown frame type {shown(kind)}", "unknown_frame")
    decoder = _DECODERS[FrameType(kind)]
    return decoder(value[1:], max_ids)


def _scope(value: Any) -> Scope:
    """``[S, bitmap]``: at most ``MAX_SHARDS`` shards, a bitmap of exactly ⌈S/8⌉ bytes."""
    num_shards, bitmap = _arity(_list(value, "scope", 2), 2, "scope")
    num_shards = _uint(num_shards, "number of shards")
    if num_shards > MAX_SHARDS:
        raise _fail(f"a scope of {num_shards} shards, over {MAX_SHARDS}", "scope_too_large")
    try:
        return Scope.from_bitmap(num_shards, _bytes(bitmap, "scope bitmap"))
    except ScopeError as exc:
        raise _fail(f"scope: {exc}", "bad_scope") from None


def _decode_hello(v: list[Any], max_ids: int) -> Hello:
    scope = _scope(v.pop()) if len(v) == 8 else EVERYTHING
    version, pass_no, salt, width, roots, cutoff_ms, final = _arity(v, 7, "HELLO")
    if _uint(version, "version") != PROTOCOL_VERSION:
        raise _fail(f"unsupported protocol version {version}", "unsupported_version")
    width = _uint(width, "hash width", 256)
    if not MIN_HASH_WIDTH <= width <= MAX_HASH_WIDTH:
        raise _fail(f"hash width {width} outside {MIN_HASH_WIDTH}..{MAX_HASH_WIDTH}", "bad_width")
    parsed: dict[Domain, tuple[bytes, int]] = {}
    for domain, rest in _sections(roots, "HELLO roots"):
        xor, count = _arity(rest, 2, "HELLO root")
        parsed[domain] = (_bytes(xor, "root xor", length=32), _uint(count, "root count"))
    return Hello(
        _uint(pass_no, "pass", 1 << 16),
        _bytes(salt, "salt", length=SALT_LEN),
        width,
        parsed,
        _uint(cutoff_ms, "cutoff"),
        _bool(final, "final"),
        scope,
    )


def _decode_done(v: list[Any], max_ids: int) -> Done:
    (converged,) = _arity(v, 1, "DONE")
    return Done(_bool(converged, "converged"))


def _decode_tree_sections(
    v: list[Any], what: str, unit: int | None
) -> dict[Domain, tuple[bytes, bytes]]:
    (sections,) = _arity(v, 1, what)
    out = {}
    for domain, rest in _sections(sections, what):
        flags, payload = _arity(rest, 2, f"{what} section")
        out[domain] = (_bytes(flags, "flags"), _bytes(payload, "payload", multiple=unit or 1))
    return out


def _decode_nodes(v: list[Any], max_ids: int) -> Nodes:
    scope = _scope(v.pop()) if len(v) == 3 else None
    sections, cutoff_ms = _arity(v, 2, "NODES")
    return Nodes(
        _decode_tree_sections([sections], "NODES", None), _uint(cutoff_ms, "cutoff"), scope
    )


def _decode_cells(v: list[Any], max_ids: int) -> Cells:
    return Cells(_decode_tree_sections(v, "CELLS", CELL_LEN))


def _decode_transfer(v: list[Any], max_ids: int) -> Transfer:
    idle, sections = _arity(v, 2, "TRANSFER")
    out: dict[Domain, TransferSection] = {}
    for domain, rest in _sections(sections, "TRANSFER"):
        records, wants, id_lists, prefix_wants = _arity(rest, 4, "TRANSFER section")
        records = [_bytes(r, "record") for r in _list(records, "records", max_ids)]
        wants = _bytes(wants, "wants", multiple=RECORD_ID_LEN)
        if len(wants) // RECORD_ID_LEN > max_ids:
            raise _fail(
                f"{len(wants) // RECORD_ID_LEN} wanted ids, over {max_ids}", "too_many_items"
            )
        lists = []
        for item in _list(id_lists, "id lists", max_ids):
            bucket, complete, prefixes = _arity(_list(item, "id list", 3), 3, "id list")
            lists.append(
                IdList(_bucket(bucket), _bool(complete, "complete"),
                       _bytes(prefixes, "prefixes", multiple=ID_PREFIX_LEN))
            )  # fmt: skip
        pwants = []
        for item in _list(prefix_wants, "prefix wants", max_ids):
            bucket, prefixes = _arity(_list(item, "prefix want", 2), 2, "prefix want")
            pwants.append(
                PrefixWant(_bucket(bucket), _bytes(prefixes, "prefixes", multiple=ID_PREFIX_LEN))
            )
        total_prefixes = sum(len(i.prefixes) for i in lists) + sum(len(w.prefixes) for w in pwants)
        if total_prefixes // ID_PREFIX_LEN > max_ids:
            raise _fail("too many id prefixes in one frame", "too_many_items")
        out[domain] = TransferSection(records, wants, lists, pwants)
    return Transfer(_bool(idle, "idle"), out)


def _decode_abort(v: list[Any], max_ids: int) -> Abort:
    (reason,) = _arity(v, 1, "ABORT")
    if type(reason) is not str or len(reason) > 200:
        raise _fail("ABORT reason must be a short string")
    return Abort(reason)


_DECODERS: dict[FrameType, Callable[[list[Any], int], Frame]] = {
    FrameType.HELLO: _decode_hello,
    FrameType.DONE: _decode_done,
    FrameType.NODES: _decode_nodes,
    FrameType.CELLS: _decode_cells,
    FrameType.TRANSFER: _decode_transfer,
    FrameType.ABORT: _decode_abort,
}
