"""Regression: a CBOR bignum where a decoder names the value in its error message.

``repr`` of an integer over 4,300 digits raises ValueError in Python 3.11+, so a record or
op whose version (or op kind) was such a bignum (CBOR tag 2 over ~1,800 bytes) escaped every
decoder as a ValueError instead of DecodeError — through ``POST /ops`` a 500, through gossip
an "internal" rejection. Found while writing the fuzz targets (tests/fuzz/, docs/TESTING.md,
"Fuzzing").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cbor2
import pytest

from store.errors import DecodeError, shown
from store.ops import decode_identity_doc, decode_membership_op, decode_op, decode_ops
from store.records import (
    decode_chat_meta,
    decode_identity_record,
    decode_inbox_entry,
    decode_member_info,
    decode_member_record,
    decode_msg,
)

BIGNUM = cbor2.CBORTag(2, b"\x01" * 2000)  # a 15,993-bit integer once decoded

# Decoders whose size limit lets a ~2 KB record in (the others refuse it as oversize first).
DECODERS: list[Callable[[bytes], Any]] = [
    decode_msg,
    decode_chat_meta,
    lambda data: decode_ops(data, max_bytes=1 << 20, max_ops=10),
]
SMALL_DECODERS: list[Callable[[bytes], Any]] = [
    decode_member_info,
    decode_member_record,
    decode_identity_record,
    decode_inbox_entry,
    decode_membership_op,
    decode_identity_doc,
]


@pytest.mark.parametrize("decode", DECODERS)
def test_a_bignum_version_is_a_decode_error(decode: Callable[[bytes], Any]) -> None:
    with pytest.raises(DecodeError) as info:
        decode(cbor2.dumps([BIGNUM, 1, 2]))
    assert info.value.reason == "unknown_version"
    assert "15993-bit integer" in str(info.value)


@pytest.mark.parametrize("decode", SMALL_DECODERS)
def test_small_records_refuse_it_by_size(decode: Callable[[bytes], Any]) -> None:
    with pytest.raises(DecodeError) as info:
        decode(cbor2.dumps([BIGNUM, 1, 2]))
    assert info.value.reason == "oversize"


def test_a_bignum_op_kind_is_a_decode_error() -> None:
    with pytest.raises(DecodeError) as info:
        decode_ops(cbor2.dumps([1, [[BIGNUM, b""]]]), max_bytes=1 << 20, max_ops=10)
    assert info.value.reason == "unknown_kind"
    with pytest.raises(DecodeError):
        decode_op(cbor2.loads(cbor2.dumps(BIGNUM)), b"")


def test_shown_never_raises_and_stays_short() -> None:
    huge = cbor2.loads(cbor2.dumps(BIGNUM))
    assert shown(huge) == "<15993-bit integer>"
    assert shown(-huge) == "<15993-bit integer>"
    nested: list[Any] = []
    for _ in range(100_000):  # deeper than repr's recursion limit
        nested = [nested]
    assert shown(nested) == "<list>"
    assert len(shown(b"x" * 10_000)) == 60
    assert shown(7) == "7"
