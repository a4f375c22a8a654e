"""Fuzz target ``frames``: ``sync.frames.decode_frame`` on a peer's bytes.

Property: ``decode_frame`` raises only ``RemoteProtocolError``; a frame it accepts encodes
to bytes it decodes again to the same frame (our own frames are always valid).
"""

from __future__ import annotations

import cbor2

from fuzz_support import instrumented, main

with instrumented(__name__ == "__main__"):
    from sync.errors import RemoteProtocolError
    from sync.frames import (
        Abort,
        Cells,
        Domain,
        Done,
        Frame,
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
    from sync.protocol import hello_for
    from sync.scope import Scope

TARGET = "frames"
MAX_FRAME = 4 * 1024 * 1024  # SyncConfig's defaults
MAX_IDS = 65_536


def one_input(data: bytes) -> None:
    try:
        frame = decode_frame(data, max_frame=MAX_FRAME, max_ids=MAX_IDS)
    except RemoteProtocolError:
        return
    again = decode_frame(encode_frame(frame), max_frame=MAX_FRAME, max_ids=MAX_IDS)
    if again != frame:
        raise AssertionError(f"frame changed in a round trip: {frame!r} -> {again!r}")


def seeds() -> dict[str, bytes]:
    roots = {d: (bytes([d]) * 32, 3 + d) for d in Domain}
    section = TransferSection(
        records=[b"\x89\x01" + b"r" * 20],
        wants=b"\xab" * 32,
        id_lists=[IdList(0xABCD, True, b"p" * 16)],
        prefix_wants=[PrefixWant(0x0102, b"q" * 8)],
    )
    frames: dict[str, Frame] = {
        "hello": hello_for(1, b"s" * 16, 4, roots, {Domain.MESSAGES: 7}),
        "hello-final": hello_for(2, b"t" * 16, 16, roots, None, 1_700_000_000_000, True),
        "hello-scoped": hello_for(
            1, b"u" * 16, 4, roots, None, 0, False, None, Scope(frozenset({0, 9}), 12)
        ),
        "hello-scoped-records": hello_for(
            2,
            b"v" * 16,
            4,
            roots,
            None,
            0,
            False,
            {Domain.MESSAGES: [b"r" * 9]},
            Scope(frozenset({3}), 4),
        ),
        "nodes-top-scoped": Nodes(
            {Domain.DELETES: (b"", b"h" * 4 * 256)}, 0, Scope(frozenset(), 3)
        ),
        "done": Done(True),
        "nodes-top": Nodes({Domain.MESSAGES: (b"", b"h" * 4 * 256)}, 5),
        "nodes": Nodes(
            {Domain.MEMBERS: (b"\x80\x00", b"h" * 4 * 16), Domain.IDENTITY: (b"\x01", b"")}
        ),
        "cells": Cells({Domain.MESSAGES: (b"\x40", b"c" * 40)}),
        "transfer": Transfer(False, {Domain.MESSAGES: section, Domain.IDENTITY: TransferSection()}),
        "transfer-idle": Transfer(True, {}),
        "transfer-drained": Transfer(
            False, {Domain.MESSAGES: TransferSection(short_wants=b"s" * 12)}, drained=True
        ),
        "sketch": Sketches({Domain.MESSAGES: SketchSection(b"\x80" + bytes(31), 3, 6, b"c" * 33)}),
        "sketch-answer": Sketches({Domain.DELETES: SketchSection(b"", 6, 3, b"a" * 48)}, True),
        "abort": Abort("bad_flags"),
    }
    seeds = {label: encode_frame(frame) for label, frame in frames.items()}
    # Regressions: bignums where an error message names the value (repr raised ValueError).
    big = cbor2.CBORTag(2, b"\x01" * 2000)
    seeds["regression-bignum-type"] = cbor2.dumps([big])
    seeds["regression-bignum-bucket"] = cbor2.dumps(
        [5, False, [[0, [], b"", [[big, True, b""]], []]]]
    )
    return seeds


if __name__ == "__main__":
    main(TARGET, one_input, seeds)
