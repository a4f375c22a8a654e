"""The frame codec: round trips, and hostile bytes that only ever raise RemoteProtocolError."""

from __future__ import annotations

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sync.errors import RemoteProtocolError
from sync.frames import (
    Abort,
    Cells,
    Domain,
    Done,
    Frame,
    Hello,
    IdList,
    Nodes,
    PrefixWant,
    Sketches,
    SketchSection,
    Transfer,
    TransferSection,
    decode_frame,
    encode_frame,
)
from sync.scope import Scope

LIMITS = {"max_frame": 1 << 20, "max_ids": 1000}
domains = st.sampled_from(list(Domain))
prefixes = st.lists(st.binary(min_size=8, max_size=8), max_size=4).map(b"".join)
buckets = st.integers(0, 65535)

sections = st.builds(
    TransferSection,
    records=st.lists(st.binary(max_size=40), max_size=3),
    wants=st.lists(st.binary(min_size=32, max_size=32), max_size=3).map(b"".join),
    id_lists=st.lists(st.builds(IdList, buckets, st.booleans(), prefixes), max_size=2),
    prefix_wants=st.lists(st.builds(PrefixWant, buckets, prefixes), max_size=2),
)


@st.composite
def sketch_sections(draw: st.DrawFn) -> SketchSection:
    """A sketch (cells of short id and check), a request (no blob) or a listing (cells 0)."""
    width = draw(st.integers(3, 8))
    kind = draw(st.sampled_from(["sketch", "request", "listing"]))
    cells = 0 if kind == "listing" else 4 * draw(st.integers(1, 5))
    size = {"sketch": cells * (width + 2), "request": 0}.get(kind, width * draw(st.integers(0, 5)))
    flags, skip = draw(st.binary(max_size=4)), draw(st.binary(max_size=4))
    return SketchSection(flags, cells, width, draw(st.binary(min_size=size, max_size=size)), skip)


frames: st.SearchStrategy[Frame] = st.one_of(
    st.builds(
        Hello,
        st.integers(0, 65535),
        st.binary(min_size=16, max_size=16),
        st.integers(2, 16),
        st.binary(min_size=4 * len(Domain), max_size=4 * len(Domain)),
        st.tuples(
            st.binary(min_size=32, max_size=32), st.integers(0, 2**40), st.integers(0, 2**32 - 1)
        ),
        cutoff_ms=st.integers(0, 2**48),
        final=st.booleans(),
    ),
    st.builds(Done, st.booleans()),
    st.builds(
        Nodes,
        st.dictionaries(domains, st.tuples(st.binary(max_size=40), st.binary(max_size=40))),
        cutoff_ms=st.integers(0, 2**48),
    ),
    st.builds(
        Cells,
        st.dictionaries(
            domains,
            st.tuples(
                st.binary(max_size=8),
                st.lists(st.binary(min_size=40, max_size=40), max_size=3).map(b"".join),
            ),
        ),
    ),
    st.builds(Transfer, st.booleans(), st.dictionaries(domains, sections)),
    st.builds(
        Sketches,
        st.dictionaries(domains, sketch_sections(), min_size=1),
        st.booleans(),
        st.none() | st.integers(0, 2**48),
    ),
    st.builds(Abort, st.text(max_size=50)),
)


@given(frames)
def test_round_trip(frame: Frame) -> None:
    assert decode_frame(encode_frame(frame), **LIMITS) == frame


@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_protocol_errors(data: bytes) -> None:
    try:
        decode_frame(data, **LIMITS)
    except RemoteProtocolError as exc:
        assert exc.reason


@given(frames, st.data())
def test_mutated_frames_raise_only_protocol_errors(frame: Frame, data: st.DataObject) -> None:
    raw = bytearray(encode_frame(frame))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "add"]))
        if op == "flip" and raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= data.draw(st.integers(1, 255))
        elif op == "cut" and raw:
            del raw[data.draw(st.integers(0, len(raw) - 1)) :]
        else:
            raw += data.draw(st.binary(min_size=1, max_size=4))
    try:
        decode_frame(bytes(raw), **LIMITS)
    except RemoteProtocolError as exc:
        assert exc.reason


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.binary(max_size=40) | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=5),
        max_leaves=30,
    )
)
def test_well_formed_cbor_of_the_wrong_shape(value: object) -> None:
    for head in (1, 2, 3, 4, 5, 6, 7):
        try:
            decode_frame(cbor2.dumps([head, value]), **LIMITS)
            decode_frame(cbor2.dumps([head, *value]) if isinstance(value, list) else b"", **LIMITS)
        except RemoteProtocolError:
            pass


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (cbor2.dumps([99]), "unknown_frame"),
        (
            cbor2.dumps([1, 2, 1, b"s" * 16, 4, bytes(16), b"", 0, 0, 0, False]),
            "unsupported_version",
        ),
        (cbor2.dumps([1, 1, 1, b"s" * 16, 40, bytes(16), b"", 0, 0, 0, False]), "bad_width"),
        (cbor2.dumps([1, 1, 1, b"s" * 16, 4, bytes(16), b"", 0, 0, -1, False]), "malformed_frame"),
        (cbor2.dumps([3, [[7, b"", b""]], 0]), "unknown_domain"),
        (cbor2.dumps([3, [[0, b"", b""], [0, b"", b""]], 0]), "duplicate_domain"),
        (cbor2.dumps([5, True, [[0, [], b"", [[70000, True, b""]], []]]]), "bad_bucket"),
        (cbor2.dumps([5, True, [[0, [b"r"] * 1001, b"", [], []]]]), "too_many_items"),
        (cbor2.dumps([4, [[0, b"", b"x" * 39]]]), "malformed_frame"),
        (b"\xff\xff", "malformed_frame"),
        (b"", "malformed_frame"),
    ],
)
def test_specific_reasons(raw: bytes, reason: str) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(raw, **LIMITS)
    assert info.value.reason == reason


def test_oversized_frame_is_refused_before_parsing() -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(b"\x00" * (LIMITS["max_frame"] + 1), **LIMITS)
    assert info.value.reason == "oversize_frame"


@pytest.mark.parametrize(
    ("listing", "why"),
    [
        (SketchSection(b"\x80", 0, 4, bytes(10)), "not a whole number of short ids"),
        (SketchSection(b"\x80", 0, 4, bytes(4 * 1001)), "more short ids than max_ids"),
        (SketchSection(b"\x80", 0, 2, bytes(4)), "short ids narrower than 3 bytes"),
    ],
)
def test_a_listing_of_the_wrong_size_is_refused(listing: SketchSection, why: str) -> None:
    data = encode_frame(Sketches({Domain.MESSAGES: listing}, cutoff_ms=0))
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(data, **LIMITS)
    assert info.value.reason in ("bad_cells", "bad_width"), why


def test_a_sketch_frame_names_a_cutoff_only_when_it_has_one() -> None:
    section = SketchSection(b"\x80", 0, 4, bytes(8))
    bare, named = (
        Sketches({Domain.MESSAGES: section}),
        Sketches({Domain.MESSAGES: section}, cutoff_ms=0),
    )
    assert len(encode_frame(named)) == len(encode_frame(bare)) + 1
    assert decode_frame(encode_frame(bare), **LIMITS).cutoff_ms is None  # type: ignore[union-attr]
    assert decode_frame(encode_frame(named), **LIMITS).cutoff_ms == 0  # type: ignore[union-attr]
    with pytest.raises(RemoteProtocolError):
        decode_frame(cbor2.dumps([7, [[0, b"\x80", 0, 4, b"", b""]], False, -1]), **LIMITS)


def test_whole_listings_name_their_scope_after_the_cutoff() -> None:
    section = SketchSection(b"\x80", 0, 4, bytes(8))
    scoped = Sketches({Domain.MESSAGES: section}, cutoff_ms=7, scope=Scope(frozenset({1}), 4))
    assert decode_frame(encode_frame(scoped), **LIMITS) == scoped
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(cbor2.dumps([7, [[0, b"\x80", 0, 4, b"", b""]], False, 0, [9, b""]]), **LIMITS)
    assert info.value.reason == "bad_scope"
