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
ZERO_XOR = bytes(32)  # an empty tree's root: sent as b"" (d = 0 in under 100 bytes)
ROOT_DIGEST_LEN = 4  # bytes of a domain's salted root digest in HELLO
MIN_SHORT_ID_LEN, MAX_SHORT_ID_LEN = 3, 8  # bytes of a short id in a sketch (sync.sketch)
SKETCH_CHECK_LEN = 2  # bytes of a sketch cell's check sum (a cell: short id, check)


class Domain(IntEnum):
    MESSAGES = 0
    MEMBERS = 1
    IDENTITY = 2
    DELETES = 3  # DELETE messages: grow-only, never expired (MESSAGES.md)
    INDEX = 4  # the member ops again, placed by their subject's user shard (sync.scope)


class FrameType(IntEnum):
    HELLO = 1
    DONE = 2
    NODES = 3
    CELLS = 4
    TRANSFER = 5
    ABORT = 6
    SKETCH = 7


@dataclass(frozen=True, slots=True)
class Hello:
    """Starts a pass: the pass's salt and hash width, and the initiator's roots in two forms.

    ``digests``: per domain (``Domain`` order), ``ROOT_DIGEST_LEN`` bytes of a salted hash of
    its root (xor, count): which domains differ. ``cell``: the roots summed over the domains
    — the XOR of the root xors, the total count and the XOR of the roots' check sums — one
    full-width IBLT cell of every id the initiator holds: the roots are equal only when it
    is equal too, and when one domain differs by one id it names that id. So d = 0 costs one
    HELLO of ~85 bytes, however many domains hold ids (SYNC.md, "Frames").

    ``cutoff_ms``: the initiator's retention cutoff for messages (0: none). ``final``:
    compare roots and end — no descent (the last pass moved nothing it could move).
    ``records``: the initiator's last pushes of the pass this HELLO closes — the answer to
    the responder's last asks, so closing costs no extra round trip; the responder writes
    them before it compares the roots.
    ``scope``: what the initiator offers to reconcile (``sync.scope``); the digests and the
    cell of the scoped domains are over it. Full: not on the wire. Scoped: the last field,
    after ``records`` (sent as ``[]`` when there are none), so each field keeps its place.
    """

    pass_no: int
    salt: bytes
    width: int
    digests: bytes  # ROOT_DIGEST_LEN bytes per domain, in Domain order
    cell: tuple[bytes, int, int]  # (XOR of the root xors, total count, XOR of the root checks)
    cutoff_ms: int = 0
    final: bool = False
    records: dict[Domain, list[bytes]] = field(default_factory=dict)
    scope: Scope = EVERYTHING

    def digest(self, domain: Domain) -> bytes:
        return self.digests[domain * ROOT_DIGEST_LEN : (domain + 1) * ROOT_DIGEST_LEN]


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
    short_wants: bytes = b""  # concatenated salted short ids a sketch decoded (this pass's width)

    @property
    def empty(self) -> bool:
        return not (
            self.records or self.wants or self.id_lists or self.prefix_wants or self.short_wants
        )


@dataclass(frozen=True, slots=True)
class Transfer:
    """Records, and requests for records. ``idle``: the sender has nothing queued and asks nothing."""

    idle: bool
    sections: dict[Domain, TransferSection]
    drained: bool = False  # after this frame the sender has nothing queued to push (it may ask)
    # The responder's roots once it has nothing left to push or ask (a HELLO's digests and
    # summed cell, over this pass's salt and scope): the initiator compares them with its
    # own after writing this frame's records and may end the session with a one-way DONE.
    roots: tuple[bytes, tuple[bytes, int, int]] | None = None


@dataclass(frozen=True, slots=True)
class SketchSection:
    """One domain's sketch: ``flags`` over the peer's last node list (which differ: their
    buckets are the region; empty in a retry, which keeps the region), ``cells`` cells of
    ``width``-byte short ids, encoded by ``sync.sketch.Sketch.encode``. ``skip``: empty, or a
    bitmap over the region's buckets of those left out (another session reconciles them).

    A **listing** (``cells`` 0) carries the sender's short ids of the region themselves
    (``sync.sketch.encode_listing``): fewer bytes than a sketch where the region holds fewer
    ids than a sketch would have cells, and it always decodes. A **request** (``cells`` > 0,
    no ``blob``) asks for the peer's sketch of that size.
    """

    flags: bytes
    cells: int
    width: int
    blob: bytes
    skip: bytes = b""

    @property
    def is_listing(self) -> bool:
        return self.cells == 0

    @property
    def is_request(self) -> bool:
        return self.cells > 0 and not self.blob


@dataclass(frozen=True, slots=True)
class Sketches:
    """Per domain, a sketch of the sender's ids in the region, or (an empty ``blob``) a request
    for the peer's sketch of ``cells`` cells, so that we decode it. ``answer``: this sketch
    answers the peer's sketch that did not decode (larger) or its request; its receiver
    decodes it and never sketches back.

    ``cutoff_ms`` in a responder's answer to HELLO (a pass over small sets: its whole-domain
    listings, no descent) — the session's message cutoff, as in the first NODES; None in every
    other sketch, and not on the wire. ``scope`` there too, when the intersection of both
    scopes is narrower than the HELLO offered (as in the first NODES): after the cutoff."""

    sections: dict[Domain, SketchSection]
    answer: bool = False
    cutoff_ms: int | None = None
    scope: Scope | None = None


@dataclass(frozen=True, slots=True)
class Abort:
    reason: str


Frame = Hello | Done | Nodes | Cells | Transfer | Abort | Sketches


# --- encoding -----------------------------------------------------------------------------


def encode_frame(frame: Frame) -> bytes:
    match frame:
        case Hello(
            pass_no, salt, width, digests, (xor, count, check), cutoff_ms, final, records, scope
        ):
            body: list[Any] = [
                FrameType.HELLO, PROTOCOL_VERSION, pass_no, salt, width, digests,
                b"" if xor == ZERO_XOR else xor, count, check, cutoff_ms, final,
            ]  # fmt: skip
            if records or not scope.is_full:
                body.append([[int(d), r] for d, r in sorted(records.items())])
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
        case Transfer(idle, sections, drained, roots):
            body = [
                FrameType.TRANSFER,
                idle,
                [_encode_section(d, s) for d, s in sorted(sections.items())],
            ]
            if drained or roots is not None:
                body.append(drained)
            if roots is not None:
                digests, (xor, count, check) = roots
                body.append([digests, b"" if xor == ZERO_XOR else xor, count, check])
        case Sketches(sketch_sections, answer, cutoff_ms, scope):
            body = [
                FrameType.SKETCH,
                [[int(d), s.flags, s.cells, s.width, s.blob, s.skip] for d, s in sorted(sketch_sections.items())],
                answer,
            ]  # fmt: skip
            if cutoff_ms is not None or scope is not None:
                body.append(cutoff_ms or 0)
            if scope is not None and not scope.is_full:
                body.append(scope.to_wire())
        case Abort(reason):
            body = [FrameType.ABORT, reason[:200]]
    return cbor2.dumps(body)


def _tree_sections(sections: dict[Domain, tuple[bytes, bytes]]) -> list[Any]:
    return [[int(d), a, b] for d, (a, b) in sorted(sections.items())]


def _encode_section(domain: Domain, s: TransferSection) -> list[Any]:
    section = [
        int(domain),
        s.records,
        s.wants,
        [[i.bucket, i.complete, i.prefixes] for i in s.id_lists],
        [[w.bucket, w.prefixes] for w in s.prefix_wants],
    ]
    return [*section, s.short_wants] if s.short_wants else section


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


def _arity(items: list[Any], n: int, what: str, optional: int = 0) -> list[Any]:
    """``items`` with ``n`` fields, or up to ``optional`` more (None-padded when absent)."""
    if not n <= len(items) <= n + optional:
        raise _fail(f"{what} must have {n} fields, got {len(items)}")
    return items + [None] * (n + optional - len(items))


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
    """``[S, chat bitmap]`` or ``[S, chat bitmap, user bitmap]``: at most ``MAX_SHARDS``
    shards, each bitmap exactly ⌈S/8⌉ bytes (an empty user bitmap is sent as none)."""
    num_shards, bitmap, user_bitmap = _arity(_list(value, "scope", 3), 2, "scope", 1)
    num_shards = _uint(num_shards, "number of shards")
    if num_shards > MAX_SHARDS:
        raise _fail(f"a scope of {num_shards} shards, over {MAX_SHARDS}", "scope_too_large")
    users = b"" if user_bitmap is None else _bytes(user_bitmap, "user-shard bitmap")
    if user_bitmap is not None and not any(users):
        raise _fail("an empty user-shard bitmap is sent as none", "bad_scope")
    try:
        return Scope.from_bitmap(num_shards, _bytes(bitmap, "scope bitmap"), users)
    except ScopeError as exc:
        raise _fail(f"scope: {exc}", "bad_scope") from None


def _decode_hello(v: list[Any], max_ids: int) -> Hello:
    _arity(v, 10, "HELLO", 2)  # then records, then scope: each only when sent
    version, pass_no, salt, width, digests, xor, count, check, cutoff_ms, final = v[:10]
    scope = _scope(v[11]) if len(v) > 11 else EVERYTHING
    if _uint(version, "version") != PROTOCOL_VERSION:
        raise _fail(f"unsupported protocol version {version}", "unsupported_version")
    width = _uint(width, "hash width", 256)
    if not MIN_HASH_WIDTH <= width <= MAX_HASH_WIDTH:
        raise _fail(f"hash width {width} outside {MIN_HASH_WIDTH}..{MAX_HASH_WIDTH}", "bad_width")
    digests = _bytes(digests, "root digests", length=ROOT_DIGEST_LEN * len(Domain))
    cell = _root_cell(xor, count, check)
    records: dict[Domain, list[bytes]] = {}
    if len(v) > 10:
        for domain, rest in _sections(v[10], "HELLO records"):
            (blobs,) = _arity(rest, 1, "HELLO records")
            records[domain] = [_bytes(r, "record") for r in _list(blobs, "records", max_ids)]
    return Hello(
        _uint(pass_no, "pass", 1 << 16),
        _bytes(salt, "salt", length=SALT_LEN),
        width,
        digests,
        cell,
        _uint(cutoff_ms, "cutoff"),
        _bool(final, "final"),
        records,
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
    idle, sections, drained, roots = _arity(v, 2, "TRANSFER", 2)
    out: dict[Domain, TransferSection] = {}
    for domain, rest in _sections(sections, "TRANSFER"):
        records, wants, id_lists, prefix_wants, shorts = _arity(rest, 4, "TRANSFER section", 1)
        shorts = b"" if shorts is None else _bytes(shorts, "short wants")
        if len(shorts) > max_ids * MAX_SHORT_ID_LEN:
            raise _fail("too many short wants in one frame", "too_many_items")
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
        out[domain] = TransferSection(records, wants, lists, pwants, shorts)
    return Transfer(
        _bool(idle, "idle"),
        out,
        drained is not None and _bool(drained, "drained"),
        None if roots is None else _roots(roots),
    )


def _roots(value: Any) -> tuple[bytes, tuple[bytes, int, int]]:
    """``[digests, xor, count, check]``: a HELLO's root digests and summed cell."""
    digests, xor, count, check = _arity(_list(value, "roots", 4), 4, "roots")
    digests = _bytes(digests, "root digests", length=ROOT_DIGEST_LEN * len(Domain))
    return digests, _root_cell(xor, count, check)


def _root_cell(xor: Any, count: Any, check: Any) -> tuple[bytes, int, int]:
    xor = _bytes(xor, "root xor")
    if len(xor) not in (0, 32):
        raise _fail(f"root xor must be 32 bytes (or empty: zero), got {len(xor)}")
    return xor or ZERO_XOR, _uint(count, "root count"), _uint(check, "root check", 1 << 32)


def _decode_sketches(v: list[Any], max_ids: int) -> Sketches:
    sections, answer, cutoff, scope = _arity(v, 2, "SKETCH", optional=2)
    out: dict[Domain, SketchSection] = {}
    for domain, rest in _sections(sections, "SKETCH"):
        flags, cells, width, blob, skip = _arity(rest, 5, "SKETCH section")
        width = _uint(width, "short id width", MAX_SHORT_ID_LEN + 1)
        if width < MIN_SHORT_ID_LEN:
            raise _fail(f"short id width must be {MIN_SHORT_ID_LEN}..8", "bad_width")
        cells = _uint(cells, "cells", 1 << 32)
        blob = _bytes(blob, "sketch cells")
        if not cells:  # a listing: whole short ids
            if len(blob) % width or len(blob) // width > max_ids:
                raise _fail(f"a listing of {len(blob)} bytes in {width}-byte ids", "bad_cells")
        elif blob and len(blob) != cells * (width + SKETCH_CHECK_LEN):
            raise _fail(f"{len(blob)} bytes for {cells} cells of width {width}", "bad_cells")
        out[domain] = SketchSection(
            _bytes(flags, "flags"), cells, width, blob, _bytes(skip, "skipped buckets")
        )
    cutoff_ms = None if len(v) == 2 else _uint(cutoff, "cutoff")
    return Sketches(out, _bool(answer, "answer"), cutoff_ms, None if len(v) < 4 else _scope(scope))


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
    FrameType.SKETCH: _decode_sketches,
}
