"""Every bound decode_frame enforces, at its exact edge: the last value in, the first one out.

Random garbage (test_frames, the fuzzer) rarely lands on an edge; an off-by-one there lets a
peer send one item more than we budget for, or refuses an honest frame.
"""

from __future__ import annotations

from typing import Any

import cbor2
import pytest

from sync.errors import RemoteProtocolError
from sync.frames import (
    Abort,
    Cells,
    Domain,
    FrameType,
    Hello,
    IdList,
    Nodes,
    PrefixWant,
    Transfer,
    TransferSection,
    decode_frame,
    encode_frame,
)
from sync.protocol import hello_for

ROOTS = {d: (bytes(32), 0) for d in Domain}
ID = bytes(range(32))


def decode(body: list[Any], *, max_frame: int = 1 << 20, max_ids: int = 100) -> Any:
    return decode_frame(cbor2.dumps(body), max_frame=max_frame, max_ids=max_ids)


def reason(body: list[Any], **limits: int) -> str:
    with pytest.raises(RemoteProtocolError) as info:
        decode(body, **limits)
    return info.value.reason


def hello(width: int = 4, pass_no: int = 1, version: int = 1) -> list[Any]:
    digests = bytes(4 * len(Domain))
    return [FrameType.HELLO, version, pass_no, bytes(16), width, digests, b"", 0, 0, 0, False]


def nodes(sections: list[Any]) -> list[Any]:
    return [FrameType.NODES, sections, 0]


def transfer(**section: Any) -> list[Any]:
    fields = {"records": [], "wants": b"", "id_lists": [], "prefix_wants": []} | section
    return [FrameType.TRANSFER, False, [[0, *fields.values()]]]


def test_the_wire_numbers() -> None:
    # both ends of a session must agree on these: a renumbering is a new protocol version
    assert [(t.name, int(t)) for t in FrameType] == [
        ("HELLO", 1),
        ("DONE", 2),
        ("NODES", 3),
        ("CELLS", 4),
        ("TRANSFER", 5),
        ("ABORT", 6),
        ("SKETCH", 7),
    ]
    assert [(d.name, int(d)) for d in Domain] == [
        ("MESSAGES", 0),
        ("MEMBERS", 1),
        ("IDENTITY", 2),
        ("DELETES", 3),
        ("INDEX", 4),
    ]


def test_a_frame_of_exactly_max_frame_bytes_is_read() -> None:
    data = encode_frame(Abort("x" * 50))
    assert decode_frame(data, max_frame=len(data), max_ids=1) == Abort("x" * 50)
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(data, max_frame=len(data) - 1, max_ids=1)
    assert info.value.reason == "oversize_frame"


@pytest.mark.parametrize("width", [2, 16])
def test_hash_widths_2_to_16_are_accepted(width: int) -> None:
    assert decode(hello(width=width)).width == width


@pytest.mark.parametrize("width", [0, 1, 17, 255])
def test_other_hash_widths_are_refused(width: int) -> None:
    assert reason(hello(width=width)) == "bad_width"
    assert reason(hello(width=256)) == "malformed_frame"  # not even a byte


def test_pass_numbers_are_16_bit_and_the_version_is_1() -> None:
    assert decode(hello(pass_no=(1 << 16) - 1)).pass_no == (1 << 16) - 1
    assert reason(hello(pass_no=1 << 16)) == "malformed_frame"
    assert reason(hello(version=2)) == "unsupported_version"
    assert reason(hello(version=0)) == "unsupported_version"


def test_sections_name_each_known_domain_at_most_once() -> None:
    assert reason(nodes([[0, b"", b""], [0, b"", b""]])) == "duplicate_domain"
    assert reason(nodes([[len(Domain), b"", b""]])) == "unknown_domain"
    assert reason(nodes([[255, b"", b""]])) == "unknown_domain"
    assert reason(nodes([[256, b"", b""]])) == "malformed_frame"
    assert reason(nodes([[]])) == "malformed_frame"
    more = [[d, b"", b""] for d in (*Domain, 0)]  # one more section than there are domains
    assert reason(nodes(more)) == "too_many_items"
    section = [0, [], b"", [], []]
    assert decode([FrameType.TRANSFER, True, [section]]).sections[Domain.MESSAGES].empty
    long_section = [0, *[b""] * 8]  # nine items: over the eight any section may have
    assert reason([FrameType.TRANSFER, True, [long_section]]) == "too_many_items"


def test_roots_and_salts_have_their_exact_lengths() -> None:
    for index, bad in [(5, bytes(15)), (6, bytes(31)), (7, 1 << 64), (8, 1 << 32)]:
        body = hello()  # digests, root xor, count, check
        body[index] = bad
        assert reason(body) == "malformed_frame", index
    assert decode(hello()).cell == (bytes(32), 0, 0)  # an empty xor is zero
    body = hello()
    body[3] = bytes(15)
    assert reason(body) == "malformed_frame"


@pytest.mark.parametrize("bucket", [0, 65_535])
def test_buckets_0_to_65535_are_accepted(bucket: int) -> None:
    frame = decode(transfer(id_lists=[[bucket, True, bytes(8)]], prefix_wants=[[bucket, b""]]))
    section = frame.sections[Domain.MESSAGES]
    assert section.id_lists == [IdList(bucket, True, bytes(8))]
    assert section.prefix_wants == [PrefixWant(bucket, b"")]


@pytest.mark.parametrize("bucket", [-1, 65_536, True, "0"])
def test_other_buckets_are_refused(bucket: Any) -> None:
    assert reason(transfer(id_lists=[[bucket, True, b""]])) == "bad_bucket"
    assert reason(transfer(prefix_wants=[[bucket, b""]])) == "bad_bucket"


# (section field, a value carrying n ids): every way a TRANSFER carries ids, with max_ids = 4
CARRIERS = [
    ("records", lambda n: [b"r"] * n),
    ("wants", lambda n: ID * n),
    ("id_lists", lambda n: [[7, True, b""]] * n),
    ("prefix_wants", lambda n: [[7, b""]] * n),
    ("id_lists", lambda n: [[7, False, bytes(8 * n)]]),
    ("prefix_wants", lambda n: [[7, bytes(8 * n)]]),
]


@pytest.mark.parametrize(("field", "carry"), CARRIERS)
def test_a_transfer_carries_at_most_max_ids(field: str, carry: Any) -> None:
    assert not decode(transfer(**{field: carry(4)}), max_ids=4).sections[Domain.MESSAGES].empty
    assert reason(transfer(**{field: carry(5)}), max_ids=4) == "too_many_items"


def test_id_prefixes_count_across_lists_and_wants() -> None:
    half = {"id_lists": [[7, True, bytes(16)]], "prefix_wants": [[7, bytes(16)]]}
    assert decode(transfer(**half), max_ids=4).sections[Domain.MESSAGES].id_lists
    half["prefix_wants"] = [[7, bytes(24)]]
    assert reason(transfer(**half), max_ids=4) == "too_many_items"


def test_ids_and_cells_come_in_whole_units() -> None:
    assert reason(transfer(wants=ID + b"\x00")) == "malformed_frame"
    assert reason(transfer(prefix_wants=[[7, bytes(9)]])) == "malformed_frame"
    assert reason(transfer(id_lists=[[7, True, bytes(7)]])) == "malformed_frame"
    assert reason(transfer(id_lists=[[7, 1, bytes(8)]])) == "malformed_frame"  # not a bool
    assert reason(transfer(id_lists=[[7, True]])) == "malformed_frame"
    cells = decode([FrameType.CELLS, [[0, b"\x80", bytes(80)]]])
    assert cells == Cells({Domain.MESSAGES: (b"\x80", bytes(80))})
    assert reason([FrameType.CELLS, [[0, b"\x80", bytes(81)]]]) == "malformed_frame"
    nodes = decode([FrameType.NODES, [[1, b"", bytes(5)]], 9])
    assert nodes == Nodes({Domain.MEMBERS: (b"", bytes(5))}, 9)


def test_abort_reasons_are_cut_to_200_characters() -> None:
    long = "r" * 300
    assert decode_frame(encode_frame(Abort(long)), max_frame=1000, max_ids=1) == Abort("r" * 200)
    assert decode([FrameType.ABORT, "r" * 200]) == Abort("r" * 200)
    assert reason([FrameType.ABORT, "r" * 201]) == "malformed_frame"
    assert reason([FrameType.ABORT, b"bytes"]) == "malformed_frame"


@pytest.mark.parametrize("body", [[], [0], [8], [True], ["1"], {"a": 1}, 5])
def test_what_is_not_a_known_frame(body: Any) -> None:
    data = cbor2.dumps(body)
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(data, max_frame=100, max_ids=1)
    known_type = type(body) is list and body and body[0] in (0, 8, True, "1")
    assert info.value.reason == ("unknown_frame" if known_type else "malformed_frame")


def test_every_frame_round_trips() -> None:
    frames = [
        hello_for(3, bytes(range(16)), 8, ROOTS, {Domain.MEMBERS: 5}, 77, True),
        Nodes({Domain.IDENTITY: (b"\x01", bytes(8))}, 5),
        Transfer(
            True,
            {
                Domain.MEMBERS: TransferSection(
                    [b"rec"], ID, [IdList(1, False, bytes(8))], [PrefixWant(2, bytes(16))]
                )
            },
        ),
    ]
    for frame in frames:
        assert decode_frame(encode_frame(frame), max_frame=1 << 16, max_ids=10) == frame


def test_an_id_list_or_prefix_want_with_an_extra_item_is_too_long() -> None:
    assert reason(transfer(id_lists=[[7, True, b"", b""]])) == "too_many_items"
    assert reason(transfer(prefix_wants=[[7, b"", b""]])) == "too_many_items"


def test_errors_name_the_bound_that_was_crossed() -> None:
    with pytest.raises(RemoteProtocolError, match=r"0\.\.65535"):
        decode(transfer(id_lists=[[65_536, True, b""]]))
    with pytest.raises(RemoteProtocolError, match=r"^5 wanted ids, over 4$"):
        decode(transfer(wants=ID * 5), max_ids=4)


def test_a_hello_or_nodes_without_a_cutoff_means_none_and_not_final() -> None:
    # the protocol reads 0 as "no cutoff": a default of anything else would expire messages
    hello = hello_for(1, bytes(16), 4, ROOTS)
    assert hello == Hello(1, bytes(16), 4, hello.digests, hello.cell, 0, False)
    assert Hello(1, bytes(16), 4, hello.digests, hello.cell) == hello  # the defaults
    assert Nodes({}).cutoff_ms == 0


# --- the sketch path's fields: SKETCH sections, short wants, drained ---


def sketch(flags: Any = b"", cells: Any = 3, width: Any = 6, blob: Any = None) -> list[Any]:
    blob = bytes(3 * (6 + 2)) if blob is None else blob
    return [FrameType.SKETCH, [[0, flags, cells, width, blob, b""]], False]


@pytest.mark.parametrize("width", [3, 8])
def test_short_id_widths_3_to_8_are_accepted(width: int) -> None:
    frame = decode(sketch(width=width, blob=bytes(3 * (width + 2))))
    assert frame.sections[Domain.MESSAGES].width == width


@pytest.mark.parametrize("width", [0, 2, 9, 255])
def test_other_short_id_widths_are_refused(width: int) -> None:
    assert reason(sketch(width=width, blob=b"")) == (
        "bad_width" if width < 9 else "malformed_frame"
    )


def test_a_sketch_blob_is_exactly_its_cells_or_empty() -> None:
    """A cell is a short id and a 2-byte check: 8 bytes at width 6."""
    assert decode(sketch(cells=6, blob=bytes(6 * 8))).sections[Domain.MESSAGES].cells == 6
    assert decode(sketch(cells=6, blob=b"")).sections[Domain.MESSAGES].blob == b""  # a request
    assert reason(sketch(cells=6, blob=bytes(6 * 8 + 1))) == "bad_cells"
    assert reason(sketch(cells=6, blob=bytes(6 * 8 - 1))) == "bad_cells"
    assert reason(sketch(cells=6, blob=bytes(6 * 9))) == "bad_cells"  # the old cell, with a count
    assert decode(sketch(cells=(1 << 32) - 1, blob=b"")).sections[Domain.MESSAGES].blob == b""
    assert reason(sketch(cells=1 << 32, blob=b"")) == "malformed_frame"
    assert reason([FrameType.SKETCH, [[0, b"", 3, 6, bytes(33)]], False]) == "malformed_frame"


def test_short_wants_are_at_most_max_ids_of_the_widest_short_id() -> None:
    """The decoder knows no width (the pass does): it bounds the bytes by 8 a short id."""
    full = transfer(short_wants=bytes(8 * 4))
    assert decode(full, max_ids=4).sections[Domain.MESSAGES].short_wants == bytes(32)
    assert reason(transfer(short_wants=bytes(8 * 4 + 1)), max_ids=4) == "too_many_items"
    assert reason(transfer(short_wants="s")) == "malformed_frame"


def test_a_transfer_says_drained_only_when_sent_and_true() -> None:
    drained = Transfer(False, {Domain.MESSAGES: TransferSection(short_wants=bytes(6))}, True)
    assert encode_frame(drained) == cbor2.dumps(
        [FrameType.TRANSFER, False, [[0, [], b"", [], [], bytes(6)]], True]
    )
    assert decode_frame(encode_frame(drained), max_frame=1 << 16, max_ids=10) == drained
    assert not decode([FrameType.TRANSFER, False, []]).drained
    assert Transfer(False, {}).drained is False  # a frame built without it: not drained
    assert reason([FrameType.TRANSFER, False, [], 1]) == "malformed_frame"  # not a bool
    assert reason([FrameType.TRANSFER, False, [], True, True]) == "malformed_frame"


def test_a_transfer_carries_roots_after_drained_and_checks_them() -> None:
    """The responder's roots (issue 35's one-way close): a HELLO's digests and summed cell."""
    digests = bytes(4 * len(Domain))  # 4 bytes a domain
    roots = (digests, (bytes(range(32)), 7, 9))
    frame = Transfer(True, {}, False, roots)
    assert encode_frame(frame) == cbor2.dumps(
        [FrameType.TRANSFER, True, [], False, [digests, bytes(range(32)), 7, 9]]
    )
    assert decode_frame(encode_frame(frame), max_frame=1 << 16, max_ids=10) == frame
    zero = Transfer(True, {}, False, (digests, (bytes(32), 0, 0)))
    assert decode_frame(encode_frame(zero), max_frame=1 << 16, max_ids=10) == zero
    assert decode([FrameType.TRANSFER, True, [], False]).roots is None
    for bad in (
        [digests[1:], b"", 0, 0],  # digests one byte short
        [digests, bytes(31), 0, 0],  # a xor neither 32 bytes nor empty
        [digests, b"", -1, 0],  # a negative count
        [digests, b"", 0, 1 << 32],  # a check over 32 bits
        [digests, b"", 0],  # a field missing
        b"roots",  # not an array
    ):
        assert reason([FrameType.TRANSFER, True, [], False, bad]) == "malformed_frame", bad
    assert reason([FrameType.TRANSFER, True, [], False, [digests, b"", 0, 0, 0]]) == (
        "too_many_items"
    )
    assert reason([FrameType.TRANSFER, True, [], False, [digests, b"", 0, 0], 1]) == (
        "malformed_frame"
    )
