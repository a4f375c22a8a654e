"""Signature checks over threads answer exactly what the sequential check answers, in order."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from node.verify import ParallelVerifier
from store.hlc import Hlc
from store.records import MsgV1
from store.signing import key_from_seed
from sync.protocol import verify_each

KEY = key_from_seed(bytes(range(32)))
GOOD = [MsgV1.create(KEY, bytes(32), Hlc(1_700_000_000_000 + n), b"m%d" % n) for n in range(300)]
VERIFIER = ParallelVerifier(threads=3)


def _forge(msg: MsgV1) -> MsgV1:
    return replace(msg, payload=msg.payload + b"!")  # same signature, other content


@settings(max_examples=40, deadline=None)
@given(
    st.integers(min_value=0, max_value=len(GOOD)),
    st.sets(st.integers(min_value=0, max_value=len(GOOD) - 1)),
)
def test_threads_agree_with_the_sequential_check(size: int, forged: set[int]) -> None:
    msgs = [_forge(m) if i in forged else m for i, m in enumerate(GOOD[:size])]
    threaded = VERIFIER(msgs)
    plain = verify_each(msgs)
    assert [e is None for e in threaded] == [e is None for e in plain]
    assert [i for i, e in enumerate(threaded) if e is not None] == sorted(
        i for i in forged if i < size
    )
    assert all(e.reason == "bad_signature" for e in threaded if e is not None)
