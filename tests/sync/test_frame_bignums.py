"""Regression: CBOR bignums where ``decode_frame`` names the value in its error message.

An unknown frame type or an out-of-range bucket that was an integer over 4,300 digits made
the error message itself raise ValueError (``repr`` of such an int), so ``decode_frame`` and
``SyncSession.receive`` raised ValueError instead of ``RemoteProtocolError``. Found while
writing the fuzz targets (tests/fuzz/, docs/TESTING.md "Fuzzing").
"""

from __future__ import annotations

from typing import Any

import cbor2
import pytest

from sync.errors import RemoteProtocolError
from sync.frames import decode_frame
from sync.protocol import SessionRole, State, SyncSession
from sync.replica import MemoryReplica

BIGNUM = cbor2.CBORTag(2, b"\x01" * 2000)
LIMITS = {"max_frame": 1 << 22, "max_ids": 65_536}


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        ([BIGNUM], "unknown_frame"),
        ([5, False, [[0, [], b"", [[BIGNUM, True, b""]], []]]], "bad_bucket"),
        ([5, False, [[0, [], b"", [], [[BIGNUM, b""]]]]], "bad_bucket"),
    ],
)
def test_bignums_are_protocol_errors(frame: list[Any], reason: str) -> None:
    data = cbor2.dumps(frame)
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(data, **LIMITS)
    assert info.value.reason == reason
    session = SyncSession(SessionRole.RESPONDER, MemoryReplica(), now_ms=0)
    with pytest.raises(RemoteProtocolError):
        session.receive(data, 0)
    assert session.state is State.ABORTED and session.error == reason
