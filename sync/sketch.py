"""An invertible Bloom lookup table (IBLT) over salted short ids: the set-difference sketch.

Theory of operation
-------------------
Each id of a region (the buckets a Merkle descent found different) becomes a **short id** of
``width`` bytes: its two-byte bucket, then ``width - 2`` bytes of a keyed hash whose key comes
from the pass's salt, so nobody can choose ids that collide before the salt is drawn, and a
collision that happens by chance is not repeated in the next pass (SYNC.md, "Security"). The
bucket tells the decoder where a short id it lacks lives: it asks only in buckets it
reconciles (``sync.claims``), and ignores a decoded id outside the region. A sketch of ``m``
cells (``m`` a multiple of 4) puts every short id into one cell of each quarter of the table.
A cell holds two sums, each invertible: ``keys`` (the sum of the short ids, mod
``2^(8 width)``) and ``check`` (the sum of a 16-bit keyed hash of each short id, mod
``2^16``): ``width + 2`` bytes on the wire. Sums rather than XORs: numpy adds into cells with
a fast indexed loop (``np.add.at``), and XOR has none (10x slower); a peeled id is subtracted
with its sign.

Subtracting the peer's sketch from ours, cell by cell, cancels every id both sides hold. A cell
whose ``check`` equals the hash of its ``keys``, and which is one of the cells that key is
placed in, is *pure* with sign +1; one whose negated sums pass the same test, with sign -1. A
pure cell holds exactly one id of the difference, and the sign says whose. No count is sent:
a cell of several ids passes either test by chance with probability ``2^-16`` times the chance
that the sum lands in that very cell (``4/m``), ~4·10^-8 a test at d = 1,000. Peeling a pure
cell removes that id from its other three cells, which may make them pure in turn. When every
cell is zero the difference is decoded completely; otherwise the sketch was too small for it,
and ``peel`` says so (``Peeled.complete`` is False) — never a silent partial answer. With
``m ≈ 1.4 d`` cells the peeling succeeds with high probability (the threshold for four hashes
is ``1.30 d``).

Short ids are computed in bulk with numpy (a region can hold a million ids); peeling tests
and peels the pure cells in numpy rounds while a round peels many, then the last few one by
one in Python. The keyed hash is multilinear over the id's four 64-bit words,
``sum k_i x_i mod 2^64`` with four 64-bit keys from the salt, then a 64-bit bijective mixer
whose top bits are kept. Two distinct ids whose four words all differ in their lowest ``t``
bits at most collide before the truncation with probability ``2^-(64-t)`` for a random key, so
two ids of one bucket collide with probability about ``2^-8(w-2) + 2^-(64-t)``; making ``t``
large takes agreeing ids in ``4t`` bits, a ``2^(2t)`` search (SYNC.md, "Security").

A region of a few ids is cheaper sent as its short ids themselves, a **listing**
(``encode_listing``): its receiver takes the set difference (``listed_difference``), which
always decodes (SYNC.md, "Listings").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import blake3
import numpy as np
import numpy.typing as npt

from store.keys import RECORD_ID_LEN

# Cells per id, one in each quarter of the table. Four, not three: with three, two ids of a
# difference placed in the same three cells never peel — (d^2/2)(3/m)^3, ~0.4 % of decodes at
# d = 10^3 whatever the size — and each such failure cost an answer sketch and a round trip.
HASHES = 4
CHECK_LEN = 2  # bytes of a cell's check sum
MIN_SHORT_ID_LEN, MAX_SHORT_ID_LEN = 3, 8
SIZED_SHORT_ID_LEN = 4  # the narrowest width ``short_id_width`` picks: the bucket, 2 bytes
# The chance a pass may take that a differing id shares its short id with another id of its
# bucket on the same side: that side then pushes (or is sent) one record too many.
SPARE_RECORD_CHANCE = 2.0**-8
BUCKET_BITS = 16
MIN_CELLS = 12
# Peeling in numpy rounds (``Sketch.peel``): at most this many, each while it peels at least
# ``ROUND_MIN_IDS`` ids (a round costs ~0.1 ms of numpy calls, an id peeled in Python ~5 us)
PEEL_ROUNDS, ROUND_MIN_IDS = 32, 32
_FILTER_BITS = 20  # lookup's candidate table (1 MiB): a short id passes it by chance at k/2^20
_SEARCHED_DIRECTLY = 1_024  # short ids lookup searches one by one (a bisect each), no table
_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1
_MUL1, _MUL2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53  # murmur3's finalizer
_STEP = 0x9E3779B97F4A7C15  # the golden-ratio step of splitmix64

U64 = npt.NDArray[np.uint64]


def cell_len(width: int) -> int:
    """Bytes per cell on the wire: short id, check."""
    return width + CHECK_LEN


def short_id_width(estimate: float, per_bucket: float) -> int:
    """The narrowest short id (bytes) with which ~``estimate`` differing ids, in buckets of
    ~``per_bucket`` ids, share a short id with another id of their side's bucket less than
    ``SPARE_RECORD_CHANCE`` of the passes: the bucket, then ``8 width - 16`` salted bits. (Two
    differing ids of opposite sides sharing one cancel and cost a pass; that takes two of
    them in one bucket, ``d^2 / 2^18`` pairs, far rarer.)"""
    for width in range(SIZED_SHORT_ID_LEN, MAX_SHORT_ID_LEN):
        if estimate * max(1.0, per_bucket) * 2.0 ** (16 - 8 * width) <= SPARE_RECORD_CHANCE:
            return width
    return MAX_SHORT_ID_LEN


def cells_for(estimate: float) -> int:
    """Cells for an estimated difference: 1.4x the estimate plus slack for small ones (the
    peeling threshold of four hashes is 1.30x; SYNC.md, "Sketches", has the failure rates)."""
    m = max(MIN_CELLS, int(1.4 * estimate) + 12)
    return m + (-m) % HASHES


@dataclass(frozen=True)
class SketchKey:
    """The per-pass keys, derived from the pass's salt and the domain: both sides agree."""

    mult: tuple[int, ...]  # 4 64-bit keys: multilinear over the id's 4 words
    out: int  # mixed into the NH sum before truncation
    cells: int  # mixed into a short id to place it and to check it
    width: int  # bytes of a short id

    @classmethod
    def derive(cls, salt: bytes, domain: int, width: int) -> SketchKey:
        if not MIN_SHORT_ID_LEN <= width <= MAX_SHORT_ID_LEN:
            raise ValueError(
                f"short id width {width} outside {MIN_SHORT_ID_LEN}..{MAX_SHORT_ID_LEN}"
            )
        raw = blake3.blake3(b"chatsync-sketch" + salt + bytes([domain])).digest(48)
        words = [int.from_bytes(raw[i : i + 8], "little") for i in range(0, 32, 8)]
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


def _mix_np(x: U64, scratch: U64) -> U64:
    """``_mix`` of every element, in place (``scratch``: an array of the same shape).

    In place because a region is up to a million ids: each fresh 8 MB temporary costs page
    faults that, in a session, took more CPU than the arithmetic (SYNC.md, "CPU")."""
    shift = np.uint64(33)
    with np.errstate(over="ignore"):
        for mul in (_MUL1, _MUL2):
            np.right_shift(x, shift, out=scratch)
            x ^= scratch
            x *= np.uint64(mul)
        np.right_shift(x, shift, out=scratch)
        x ^= scratch
    return x


def short_ids(key: SketchKey, ids: bytes) -> U64:
    """The short ids of concatenated 32-byte ids, in their order: bucket, then keyed hash."""
    if len(ids) % RECORD_ID_LEN:
        raise ValueError("ids must be concatenated 32-byte ids")
    words = np.frombuffer(ids, dtype="<u8").reshape(-1, 4)
    with np.errstate(over="ignore"):  # products and sums wrap mod 2^64
        out = words @ np.asarray(key.mult, dtype=np.uint64)  # one pass over the rows
    out ^= np.uint64(key.out)
    scratch = np.empty_like(out)
    _mix_np(out, scratch)
    hashed = 8 * key.width - BUCKET_BITS
    out >>= np.uint64(64 - hashed)
    np.copyto(scratch, np.frombuffer(ids, dtype=">u2")[:: RECORD_ID_LEN // 2])  # the buckets
    scratch <<= np.uint64(hashed)
    out |= scratch
    return out


def bucket_of_short(short: int, width: int) -> int:
    """The bucket a short id names (its first two bytes)."""
    return short >> (8 * width - BUCKET_BITS)


def short_id(key: SketchKey, record_id: bytes) -> int:
    """One id's short id (``short_ids`` for a single id)."""
    return int(short_ids(key, record_id)[0])


def _first(key: SketchKey, s: int) -> int:
    """The first mixed hash of short id ``s``: its check is the top ``CHECK_LEN`` bytes."""
    return _mix(s ^ key.cells)


def _cells(h: int, part: int) -> tuple[int, ...]:
    """The cells (one per part of a table of ``HASHES * part``) of the short id whose first
    hash is ``h``: each a 32-bit slice of a mixed hash scaled to ``part`` (multiply-shift)."""
    g = _mix((h + _STEP) & _M64)
    f = _mix((g + _STEP) & _M64)
    return (
        ((h & _M32) * part) >> 32,
        part + (((g & _M32) * part) >> 32),
        2 * part + (((g >> 32) * part) >> 32),
        3 * part + (((f & _M32) * part) >> 32),
    )


def _place_np(key: SketchKey, s: U64, part: int) -> tuple[U64, ...]:
    """``_cells`` and the check of every short id, with as few fresh arrays as it can (see
    ``_mix_np``)."""
    scratch = np.empty_like(s)
    h = np.bitwise_xor(s, np.uint64(key.cells))
    _mix_np(h, scratch)
    with np.errstate(over="ignore"):
        g = h + np.uint64(_STEP)
        _mix_np(g, scratch)
        f = g + np.uint64(_STEP)
    _mix_np(f, scratch)
    mask, shift = np.uint64(_M32), np.uint64(32)
    # each cell written into an array its hash no longer needs (g's high half first, into
    # the scratch): five fresh arrays in all, where one a cell made eight
    np.right_shift(g, shift, out=scratch)
    first = np.bitwise_and(h, mask)
    for j, cell in enumerate((first, g, scratch, f)):
        if j in (1, 3):
            cell &= mask
        cell *= np.uint64(part)
        cell >>= shift
        cell += np.uint64(j * part)
    h >>= np.uint64(64 - 8 * CHECK_LEN)  # the check
    return first, g, scratch, f, h


@dataclass(frozen=True)
class Peeled:
    """A decoded difference: short ids only the sketch's owner holds (``mine``), only the
    other side holds (``theirs``), and whether every cell peeled to zero."""

    mine: list[int]
    theirs: list[int]
    complete: bool


class Sketch:
    """An IBLT of ``m`` cells over short ids of width ``key.width``."""

    __slots__ = ("checks", "key", "keys", "m")

    def __init__(self, key: SketchKey, m: int) -> None:
        if m < HASHES or m % HASHES:
            raise ValueError(f"a sketch needs a positive multiple of {HASHES} cells, got {m}")
        self.key, self.m = key, m
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
            index = cell.view(np.int64)  # cell indexes < m: the same bits, no copy
            np.add.at(self.keys, index, shorts)  # sums wrap mod 2^64: the wire keeps the low bits
            np.add.at(self.checks, index, check)

    def subtract(self, other: Sketch) -> Sketch:
        """Cell by cell, ``self - other``: what remains is the symmetric difference."""
        if other.m != self.m or other.key != self.key:
            raise ValueError("sketches of different sizes or keys do not subtract")
        out = Sketch(self.key, self.m)
        out.keys = (self.keys - other.keys) & np.uint64(_key_mask(self.key.width))
        out.checks = (self.checks - other.checks) & np.uint64(_CHECK_MASK)
        return out

    # --- the wire ---

    def encode(self) -> bytes:
        """short ids (``width`` B each, big-endian), then checks (2 B each)."""
        w = self.key.width
        keys = self.keys.astype(">u8").view(np.uint8).reshape(-1, 8)[:, 8 - w :]
        checks = (self.checks & np.uint64(_CHECK_MASK)).astype(">u2")
        return keys.tobytes() + checks.tobytes()

    @classmethod
    def decode(cls, key: SketchKey, m: int, blob: bytes) -> Sketch:
        """The inverse of ``encode``; ValueError if ``blob`` is not ``m`` cells long."""
        w = key.width
        if len(blob) != m * cell_len(w):
            raise ValueError(f"{len(blob)} bytes for {m} cells of {cell_len(w)}")
        sketch = cls(key, m)
        padded = np.zeros((m, 8), dtype=np.uint8)
        padded[:, 8 - w :] = np.frombuffer(blob[: m * w], dtype=np.uint8).reshape(m, w)
        sketch.keys = padded.view(">u8").reshape(m).astype(np.uint64)
        sketch.checks = np.frombuffer(blob[m * w :], dtype=">u2").astype(np.uint64)
        return sketch

    # --- decoding a difference ---

    def peel(self, max_items: int | None = None) -> Peeled:
        """Decode a subtracted sketch: cells pure with sign +1 hold ours, -1 the peer's.

        Stops, incomplete, after ``max_items`` ids: a lying peer cannot make us peel more
        than the cells allow (each pure cell peeled empties at least itself). Peels first in
        rounds, in numpy (every pure cell of a round at once, then only the cells it touched
        are tested again), at most ``PEEL_ROUNDS`` of them, then one cell at a time in Python
        for whatever is left: a liar can make a round peel one id, never make the rounds
        more than ``PEEL_ROUNDS`` passes over the cells."""
        keys, checks = self.keys.copy(), self.checks.copy()
        limit = self.m if max_items is None else min(max_items, self.m)
        mine: list[int] = []
        theirs: list[int] = []
        touched = np.flatnonzero(keys | checks)
        hit = np.zeros(self.m, dtype=bool)
        for _ in range(PEEL_ROUNDS):
            if len(touched) < ROUND_MIN_IDS or len(mine) + len(theirs) >= limit:
                break
            shorts, signs, cells, check = self._pure(keys, checks, touched)
            take = limit - len(mine) - len(theirs)
            shorts, signs, cells, check = shorts[:take], signs[:take], cells[:, :take], check[:take]
            if not len(shorts):
                touched = touched[:0]  # every cell tested is impure, and none changed
                break
            mine.extend(shorts[signs].tolist())
            theirs.extend(shorts[~signs].tolist())
            zero = np.uint64(0)
            delta_keys = np.where(signs, shorts, zero - shorts)  # wraps: + ours, - theirs
            delta_checks = np.where(signs, check, zero - check)
            for row in cells:
                index = row.view(np.int64)
                np.subtract.at(keys, index, delta_keys)
                np.subtract.at(checks, index, delta_checks)
            keys &= np.uint64(_key_mask(self.key.width))
            checks &= np.uint64(_CHECK_MASK)
            hit[cells] = True  # the cells this round changed, sorted and once each:
            touched = np.flatnonzero(hit)  # np.unique's answer, without its sort or hash
            hit[touched] = False
            touched = touched[(keys[touched] | checks[touched]) != 0]
            if len(shorts) < ROUND_MIN_IDS:
                break
        rest = self._peel_one_by_one(keys, checks, touched, limit - len(mine) - len(theirs))
        mine.extend(rest.mine)
        theirs.extend(rest.theirs)
        return Peeled(mine, theirs, rest.complete)

    def _pure(
        self, keys: U64, checks: U64, at: npt.NDArray[Any]
    ) -> tuple[U64, npt.NDArray[np.bool_], U64, U64]:
        """Of cells ``at``, the pure ones, each id once (two of its cells may be pure in one
        round): its short id, its sign (True: ours), its ``HASHES`` cells (rows) and check."""
        zero = np.uint64(0)
        s = np.concatenate([keys[at], (zero - keys[at]) & np.uint64(_key_mask(self.key.width))])
        c = np.concatenate([checks[at], (zero - checks[at]) & np.uint64(_CHECK_MASK)])
        *cells, check = _place_np(self.key, s, self.m // HASHES)
        home = np.concatenate([at, at]).astype(np.uint64)
        pure = check == c
        pure &= (cells[0] == home) | (cells[1] == home) | (cells[2] == home) | (cells[3] == home)
        found = np.flatnonzero(pure)
        signs = found < len(at)
        order = np.lexsort((s[found], ~signs))  # ours first, then by short id
        found, signs = found[order], signs[order]
        shorts = s[found]
        first = np.ones(len(found), dtype=bool)
        first[1:] = (shorts[1:] != shorts[:-1]) | (signs[1:] != signs[:-1])
        found, signs, shorts = found[first], signs[first], shorts[first]
        return shorts, signs, np.stack([row[found] for row in cells]), check[found]

    def _peel_one_by_one(
        self, keys_np: U64, checks_np: U64, touched: npt.NDArray[Any], limit: int
    ) -> Peeled:
        """Peel what the rounds left, one pure cell at a time, at most ``limit`` ids, starting
        from the cells the rounds changed last (``touched``; every other cell was found impure
        and has not changed since); ``complete`` when every cell ends empty."""
        keys = keys_np.tolist()
        checks = checks_np.tolist()
        part = self.m // HASHES
        mask = _key_mask(self.key.width)
        mine: list[int] = []
        theirs: list[int] = []
        stack = touched.tolist()
        while stack and len(mine) + len(theirs) < limit:
            i = stack.pop()
            for sign in (1, -1):  # one id of ours, or (its sums negated) one of the peer's
                s = sign * keys[i] & mask
                h = _first(self.key, s)
                check = h >> (64 - 8 * CHECK_LEN)
                if sign * checks[i] & _CHECK_MASK == check:
                    cells = _cells(h, part)  # only now: most cells fail the check
                    if i in cells:
                        break
            else:
                continue  # empty, or not pure (or not yet): several ids sum here
            (mine if sign == 1 else theirs).append(s)
            for j in cells:
                keys[j] = (keys[j] - sign * s) & mask
                checks[j] = (checks[j] - sign * check) & _CHECK_MASK
                if keys[j] or checks[j]:
                    stack.append(j)
        complete = not any(keys) and not any(checks)
        return Peeled(mine, theirs, complete)


_CHECK_MASK = (1 << (8 * CHECK_LEN)) - 1


def _key_mask(width: int) -> int:
    return (1 << (8 * width)) - 1


def members(values: npt.NDArray[Any], ascending: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    """Which of ``values`` are in ``ascending`` (sorted, distinct): a bisect each."""
    if not len(ascending):
        return np.zeros(len(values), dtype=bool)
    at = np.minimum(np.searchsorted(ascending, values), len(ascending) - 1)
    return np.asarray(ascending[at] == values)


def encode_listing(shorts: U64, width: int) -> bytes:
    """A listing: distinct short ids of ``width`` bytes, big-endian, ascending."""
    return np.unique(shorts).astype(">u8").view(np.uint8).reshape(-1, 8)[:, 8 - width :].tobytes()


def decode_listing(blob: bytes, width: int) -> U64:
    """The inverse of ``encode_listing``; ValueError if ``blob`` is no whole number of ids."""
    if len(blob) % width:
        raise ValueError(f"{len(blob)} bytes of {width}-byte short ids")
    padded = np.zeros((len(blob) // width, 8), dtype=np.uint8)
    padded[:, 8 - width :] = np.frombuffer(blob, dtype=np.uint8).reshape(-1, width)
    return padded.view(">u8").reshape(-1).astype(np.uint64)


def listed_difference(mine: U64, listed: U64) -> Peeled:
    """A listing decoded: the short ids only we hold and those only its sender holds
    (``listed``, the sender's short ids of the region), ascending — always complete."""
    ours, theirs = set(mine.tolist()), set(listed.tolist())  # a few ids: sets beat numpy's
    return Peeled(sorted(ours - theirs), sorted(theirs - ours), True)


def lookup(shorts: U64, ids: bytes, wanted: Sequence[int]) -> list[bytes]:
    """The ids (of concatenated ``ids``, whose short ids are ``shorts``) with a wanted short id;
    every id that shares one, so a collision among our own ids costs a record, never a miss.

    A table over the short ids' low ``_FILTER_BITS`` bits keeps the few candidates (one gather
    over the region), which are then searched among the wanted ones; sorting the region's
    short ids took 250 ms a million, searching each of them 11-45 ms, the table ~2 ms."""
    if not wanted or not len(shorts):
        return []
    want = np.asarray(sorted(set(wanted)), dtype=np.uint64)
    if len(shorts) <= _SEARCHED_DIRECTLY:  # clearing the table would cost more
        found = np.flatnonzero(members(shorts, want))
    else:
        low = np.uint64((1 << _FILTER_BITS) - 1)
        table = np.zeros(1 << _FILTER_BITS, dtype=bool)
        table[(want & low).astype(np.intp)] = True
        candidates = np.flatnonzero(table[(shorts & low).view(np.intp)])  # < 2^20: same bits
        found = candidates[members(shorts[candidates], want)]
    pairs = sorted(  # by short id, then id: not the listing's order, which may vary by process
        (int(shorts[k]), ids[k * RECORD_ID_LEN : (k + 1) * RECORD_ID_LEN]) for k in found.tolist()
    )
    return [record_id for _, record_id in pairs]
