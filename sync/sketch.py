"""An invertible Bloom lookup table (IBLT) over salted short ids: the set-difference sketch.

Theory of operation
-------------------
Each id of a region (the buckets a Merkle descent found different) becomes a **short id** of
``width`` bytes: its two-byte bucket, then ``width - 2`` bytes of a keyed hash whose key comes
from the pass's salt, so nobody can choose ids that collide before the salt is drawn, and a
collision that happens by chance is not repeated in the next pass (SYNC.md, "Security"). The
bucket tells the decoder where a short id it lacks lives: it asks only in buckets it
reconciles (``sync.claims``), and ignores a decoded id outside the region. A sketch of ``m`` cells (``m`` a multiple of 3) puts
every short id into one cell of each third of the table. A cell holds three sums, each
invertible: ``count`` (mod 256), ``keys`` (XOR of the short ids) and ``check`` (XOR of a
32-bit keyed hash of each short id).

Subtracting the peer's sketch from ours, cell by cell, cancels every id both sides hold. A cell
left with ``count`` = ±1 whose ``check`` equals the hash of its ``keys`` is *pure*: it holds
exactly one id of the difference, and the sign says whose. Peeling a pure cell removes that id
from its other two cells, which may make them pure in turn. When every cell is zero the
difference is decoded completely; otherwise the sketch was too small for it, and ``peel`` says
so (``Peeled.complete`` is False) — never a silent partial answer. With ``m ≈ 1.5 d`` cells the
peeling succeeds with high probability (the threshold for three hashes is ``1.22 d``).

Short ids are computed in bulk with numpy (a region can hold a million ids); peeling walks
only the ``m`` cells in Python. The key hash is NH (Black et al., UMAC): an almost-universal
hash over the id's 32-bit words, then a 64-bit bijective mixer; two distinct ids of one bucket
collide for a random key with probability about ``2^-8(w-2)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import blake3
import numpy as np
import numpy.typing as npt

from store.keys import RECORD_ID_LEN

HASHES = 3  # cells per id, one in each third of the table
CHECK_LEN = 4  # bytes of a cell's check sum
DEFAULT_SHORT_ID_LEN = 6  # bytes of a short id on the wire: the bucket, 4 bytes of keyed hash
MIN_SHORT_ID_LEN, MAX_SHORT_ID_LEN = 3, 8
BUCKET_BITS = 16
MIN_CELLS = 12
_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1
_MUL1, _MUL2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53  # murmur3's finalizer
_STEP = 0x9E3779B97F4A7C15  # the golden-ratio step of splitmix64

U64 = npt.NDArray[np.uint64]


def cell_len(width: int) -> int:
    """Bytes per cell on the wire: count, short id, check."""
    return 1 + width + CHECK_LEN


def cells_for(estimate: float) -> int:
    """Cells for an estimated difference: 1.5x the estimate plus slack for small ones."""
    m = max(MIN_CELLS, int(1.5 * estimate) + 12)
    return m + (-m) % HASHES


@dataclass(frozen=True)
class SketchKey:
    """The per-pass keys, derived from the pass's salt and the domain: both sides agree."""

    nh: tuple[int, ...]  # 8 32-bit words: NH over the id's 8 words
    out: int  # mixed into the NH sum before truncation
    cells: int  # mixed into a short id to place it and to check it
    width: int  # bytes of a short id

    @classmethod
    def derive(cls, salt: bytes, domain: int, width: int = DEFAULT_SHORT_ID_LEN) -> SketchKey:
        if not MIN_SHORT_ID_LEN <= width <= MAX_SHORT_ID_LEN:
            raise ValueError(
                f"short id width {width} outside {MIN_SHORT_ID_LEN}..{MAX_SHORT_ID_LEN}"
            )
        raw = blake3.blake3(b"chatsync-sketch" + salt + bytes([domain])).digest(48)
        words = [int.from_bytes(raw[i : i + 4], "little") for i in range(0, 32, 4)]
        return cls(
            tuple(words),
            int.from_bytes(raw[32:40], "little"),
            int.from_bytes(raw[40:48], "little"),
            width,
        )


def _mix(x: int) -> int:
    x ^= x >> 33
    x = (x * _MUL1) & _M64
    x ^= x >> 33
    x = (x * _MUL2) & _M64
    return x ^ (x >> 33)


def _mix_np(x: U64) -> U64:
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(_MUL1)
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(_MUL2)
    return x ^ (x >> np.uint64(33))


def short_ids(key: SketchKey, ids: bytes) -> U64:
    """The short ids of concatenated 32-byte ids, in their order: bucket, then keyed hash."""
    if len(ids) % RECORD_ID_LEN:
        raise ValueError("ids must be concatenated 32-byte ids")
    words = np.frombuffer(ids, dtype="<u4").reshape(-1, 8)
    total = np.zeros(len(words), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(0, 8, 2):  # NH: 32-bit additions wrap, their products fill 64 bits
            a = (words[:, i] + np.uint32(key.nh[i])).astype(np.uint64)
            b = (words[:, i + 1] + np.uint32(key.nh[i + 1])).astype(np.uint64)
            total += a * b
        mixed = _mix_np(total ^ np.uint64(key.out))
    buckets = np.frombuffer(ids, dtype=">u2")[:: RECORD_ID_LEN // 2].astype(np.uint64)
    hashed = 8 * key.width - BUCKET_BITS
    return (buckets << np.uint64(hashed)) | (mixed >> np.uint64(64 - hashed))


def bucket_of_short(short: int, width: int) -> int:
    """The bucket a short id names (its first two bytes)."""
    return short >> (8 * width - BUCKET_BITS)


def short_id(key: SketchKey, record_id: bytes) -> int:
    """One id's short id (``short_ids`` for a single id)."""
    return int(short_ids(key, record_id)[0])


def _place(key: SketchKey, s: int, third: int) -> tuple[int, int, int, int]:
    """Cells (one per third of a table of ``3 * third`` cells) and check of short id ``s``."""
    h = _mix(s ^ key.cells)
    g = _mix((h + _STEP) & _M64)
    return h % third, third + (g & _M32) % third, 2 * third + (g >> 32) % third, h >> 32


def _place_np(key: SketchKey, s: U64, third: int) -> tuple[U64, U64, U64, U64]:
    with np.errstate(over="ignore"):
        h = _mix_np(s ^ np.uint64(key.cells))
        g = _mix_np(h + np.uint64(_STEP))
    t = np.uint64(third)
    mask = np.uint64(_M32)
    return (
        h % t,
        t + (g & mask) % t,
        np.uint64(2) * t + (g >> np.uint64(32)) % t,
        h >> np.uint64(32),
    )


@dataclass(frozen=True)
class Peeled:
    """A decoded difference: short ids only the sketch's owner holds (``mine``), only the
    other side holds (``theirs``), and whether every cell peeled to zero."""

    mine: list[int]
    theirs: list[int]
    complete: bool


class Sketch:
    """An IBLT of ``m`` cells over short ids of width ``key.width``."""

    __slots__ = ("checks", "counts", "key", "keys", "m")

    def __init__(self, key: SketchKey, m: int) -> None:
        if m < HASHES or m % HASHES:
            raise ValueError(f"a sketch needs a positive multiple of {HASHES} cells, got {m}")
        self.key, self.m = key, m
        self.counts = np.zeros(m, dtype=np.uint8)
        self.keys = np.zeros(m, dtype=np.uint64)
        self.checks = np.zeros(m, dtype=np.uint64)

    @classmethod
    def of(cls, key: SketchKey, m: int, shorts: U64) -> Sketch:
        sketch = cls(key, m)
        sketch.add(shorts)
        return sketch

    def add(self, shorts: U64) -> None:
        """Insert short ids (each once per call; a repeated short id is inserted twice)."""
        if not len(shorts):
            return
        *cells, check = _place_np(self.key, shorts, self.m // HASHES)
        for cell in cells:
            index = cell.astype(np.intp)
            np.add.at(self.counts, index, np.uint8(1))
            np.bitwise_xor.at(self.keys, index, shorts)
            np.bitwise_xor.at(self.checks, index, check)

    def subtract(self, other: Sketch) -> Sketch:
        """Cell by cell, ``self - other``: what remains is the symmetric difference."""
        if other.m != self.m or other.key != self.key:
            raise ValueError("sketches of different sizes or keys do not subtract")
        out = Sketch(self.key, self.m)
        out.counts = self.counts - other.counts  # uint8 wraps: counts mod 256
        out.keys = self.keys ^ other.keys
        out.checks = self.checks ^ other.checks
        return out

    # --- the wire ---

    def encode(self) -> bytes:
        """counts (1 B each), short ids (``width`` B each, big-endian), checks (4 B each)."""
        w = self.key.width
        keys = self.keys.astype(">u8").view(np.uint8).reshape(-1, 8)[:, 8 - w :]
        checks = self.checks.astype(">u4")
        return self.counts.tobytes() + keys.tobytes() + checks.tobytes()

    @classmethod
    def decode(cls, key: SketchKey, m: int, blob: bytes) -> Sketch:
        """The inverse of ``encode``; ValueError if ``blob`` is not ``m`` cells long."""
        w = key.width
        if len(blob) != m * cell_len(w):
            raise ValueError(f"{len(blob)} bytes for {m} cells of {cell_len(w)}")
        sketch = cls(key, m)
        sketch.counts = np.frombuffer(blob[:m], dtype=np.uint8).copy()
        padded = np.zeros((m, 8), dtype=np.uint8)
        padded[:, 8 - w :] = np.frombuffer(blob[m : m + m * w], dtype=np.uint8).reshape(m, w)
        sketch.keys = padded.view(">u8").reshape(m).astype(np.uint64)
        checks = np.frombuffer(blob[m + m * w :], dtype=">u4")
        sketch.checks = checks.astype(np.uint64)
        return sketch

    # --- decoding a difference ---

    def peel(self, max_items: int | None = None) -> Peeled:
        """Decode a subtracted sketch: +1 cells are ours, -1 (255) cells the peer's.

        Stops, incomplete, after ``max_items`` ids: a lying peer cannot make us peel more
        than the cells allow (each pure cell peeled empties at least itself)."""
        counts = [int(c) for c in self.counts]
        keys = [int(k) for k in self.keys]
        checks = [int(c) for c in self.checks]
        third = self.m // HASHES
        limit = self.m if max_items is None else min(max_items, self.m)
        mine: list[int] = []
        theirs: list[int] = []
        stack = [i for i in range(self.m) if counts[i] in (1, 255)]
        while stack and len(mine) + len(theirs) < limit:
            i = stack.pop()
            count, s = counts[i], keys[i]
            if count not in (1, 255):
                continue
            *cells, check = _place(self.key, s, third)
            if checks[i] != check or i not in cells:
                continue  # not pure (or not yet): several ids sum here
            (mine if count == 1 else theirs).append(s)
            for j in cells:
                counts[j] = (counts[j] - count) & 0xFF
                keys[j] ^= s
                checks[j] ^= check
                if counts[j] in (1, 255):
                    stack.append(j)
        complete = not any(counts) and not any(keys) and not any(checks)
        return Peeled(mine, theirs, complete)


def lookup(shorts: U64, ids: bytes, wanted: Sequence[int]) -> list[bytes]:
    """The ids (of concatenated ``ids``, whose short ids are ``shorts``) with a wanted short id;
    every id that shares one, so a collision among our own ids costs a record, never a miss."""
    if not wanted or not len(shorts):
        return []
    order = np.argsort(shorts, kind="stable")
    ordered = shorts[order]
    want = np.asarray(sorted(set(wanted)), dtype=np.uint64)
    lo = np.searchsorted(ordered, want, side="left")
    hi = np.searchsorted(ordered, want, side="right")
    out: list[bytes] = []
    for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
        for k in order[a:b].tolist():
            out.append(ids[k * RECORD_ID_LEN : (k + 1) * RECORD_ID_LEN])
    return out
