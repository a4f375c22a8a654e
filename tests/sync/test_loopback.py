"""The session-pair driver: per-side clocks, a cut connection, errors raised or kept, summed counts."""

from __future__ import annotations

import pytest

from store import Hlc, MsgV1
from sync.errors import RemoteProtocolError
from sync.loopback import run_session
from sync.protocol import KINDS, SyncConfig

from sync_support import KEYS, contents, engine, fill, forged_member, message


def test_counts_are_summed_over_both_sides() -> None:
    a = fill(engine(), [message(i) for i in range(0, 20, 2)])
    b = fill(engine(), [message(i) for i in range(1, 20, 2)])
    result = run_session(a, b)
    ini, resp = result.initiator.stats, result.responder.stats
    assert result.converged and not result.cut and result.error is None
    assert result.records_applied == ini.records_applied + resp.records_applied == 20
    assert result.bytes_sent == {k: ini.bytes_sent[k] + resp.bytes_sent[k] for k in KINDS}
    assert result.rejected_old == result.rejected_future == 0


def test_each_side_runs_on_its_own_clock() -> None:
    """A message 200 s ahead of the initiator's clock: the responder, 200 s later, takes it."""
    now, ahead = 1_000_000, 200_000
    future = MsgV1.create(KEYS[0], message(1).chat_id, Hlc(now + ahead), b"later")
    config = SyncConfig(max_offset_ms=120_000)
    same = engine()
    run_session(fill(engine(), [future]), same, now_ms=now, config=config)
    assert future.msg_id not in same.messages
    later = engine()
    result = run_session(
        fill(engine(), [future]), later, now_ms=now, responder_now_ms=now + ahead,
        config=config,
    )  # fmt: skip
    assert result.converged and future.msg_id in later.messages


def test_a_cut_connection_ends_the_session() -> None:
    a, b = fill(engine(), [message(i) for i in range(10)]), engine()
    result = run_session(a, b, cut_after=1)
    assert result.cut and not result.converged and result.frames == 2  # the second is lost
    assert contents(b) == contents(engine())


def test_max_frames_raises_or_counts_as_a_cut() -> None:
    a, b = fill(engine(), [message(i) for i in range(10)]), engine()
    with pytest.raises(RuntimeError, match="did not finish within 1 frames"):
        run_session(a, b, max_frames=1)
    result = run_session(a, b, max_frames=1, raise_errors=False)
    assert result.cut and not result.converged


def test_a_protocol_error_raises_or_ends_the_session_with_its_reason() -> None:
    bare = forged_member(0, 2, 5)  # signed by a user without a say in the group
    strict = SyncConfig(authenticate=True)
    with pytest.raises(RemoteProtocolError):
        run_session(engine(), fill(engine(), [bare]), config=strict)
    d = engine()
    result = run_session(d, fill(engine(), [bare]), config=strict, raise_errors=False)
    assert result.error == "unauthorized" and not result.cut and not result.converged
    assert d.members == {}
