"""Signature checks in worker processes answer exactly what the sequential check answers, in
order; the workers start with a big frame, stop when idle, and a killed one costs no answer."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.machine import child_pids
from node.verify import MIN_PARALLEL, ProcessVerifier
from store.hlc import Hlc
from store.records import MsgV1
from store.signing import key_from_seed
from sync.protocol import verify_each

KEY, OTHER = key_from_seed(bytes(range(32))), key_from_seed(bytes(32))
GOOD = [MsgV1.create(KEY, bytes(32), Hlc(1_700_000_000_000 + n), b"m%d" % n) for n in range(300)]


def _forge(msg: MsgV1, how: int) -> MsgV1:
    if how == 0:
        return replace(msg, payload=msg.payload + b"!")  # same signature, other content
    if how == 1:
        return replace(msg, sig=bytes(64))
    return replace(msg, author_key=bytes(OTHER.verify_key))  # a key that does not own sender


@pytest.fixture(scope="module")
def verifier() -> Iterator[ProcessVerifier]:
    workers = ProcessVerifier(processes=2)
    yield workers
    workers.close()


@settings(max_examples=30, deadline=None)
@given(
    st.integers(min_value=0, max_value=len(GOOD)),
    st.dictionaries(st.integers(min_value=0, max_value=len(GOOD) - 1), st.integers(0, 2)),
)
def test_workers_agree_with_the_sequential_check(
    verifier: ProcessVerifier, size: int, forged: dict[int, int]
) -> None:
    msgs = [_forge(m, forged[i]) if i in forged else m for i, m in enumerate(GOOD[:size])]
    answers = verifier(msgs)
    plain = verify_each(msgs)
    assert [str(e) if e else None for e in answers] == [str(e) if e else None for e in plain]
    assert [i for i, e in enumerate(answers) if e is not None] == sorted(
        i for i in forged if i < size
    )
    assert all(e.reason == "bad_signature" for e in answers if e is not None)


def _children() -> set[int]:
    return set(child_pids(os.getpid()))


def test_workers_start_with_a_big_frame_and_stop_when_idle() -> None:
    before = _children()
    workers = ProcessVerifier(processes=2, idle_s=0.5)
    try:
        assert workers(GOOD[: MIN_PARALLEL - 1]) == [None] * (MIN_PARALLEL - 1)
        assert not workers.running() and _children() == before  # small: checked here
        assert workers(GOOD) == [None] * len(GOOD)
        assert workers.running() and len(_children() - before) == 2
        deadline = time.monotonic() + 10
        while workers.running() or _children() - before:
            assert time.monotonic() < deadline, "workers still up long after idle_s"
            time.sleep(0.05)
        assert workers(GOOD) == [None] * len(GOOD)  # started again
        assert workers.running()
    finally:
        workers.close()
    assert not workers.running()
    assert workers(GOOD[:100]) == [None] * 100  # closed (stopping): checked in the caller


def test_a_killed_worker_costs_no_answer() -> None:
    before = _children()
    workers = ProcessVerifier(processes=2)
    try:
        assert workers(GOOD) == [None] * len(GOOD)
        for pid in _children() - before:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        forged = [_forge(m, 1) if i == 7 else m for i, m in enumerate(GOOD)]
        answers = workers(forged)  # the pool broke: this frame is checked in the caller
        assert [i for i, e in enumerate(answers) if e is not None] == [7]
        again = workers(forged)  # and the next one gets new workers
        assert [str(e) if e else None for e in again] == [str(e) if e else None for e in answers]
        assert workers.running()
    finally:
        workers.close()


def test_zero_processes_check_in_the_caller() -> None:
    before = _children()
    inline = ProcessVerifier(processes=0)
    forged = [_forge(m, 0) if i == 3 else m for i, m in enumerate(GOOD)]
    assert [i for i, e in enumerate(inline(forged)) if e is not None] == [3]
    assert not inline.running() and _children() <= before
