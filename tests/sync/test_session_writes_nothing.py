"""A session reads its replica and never writes it: the driver writes what it received.

The node's syncer takes each frame in three steps — ``receive_checked`` (the records the
frame brought), its writer, ``answer`` — so the session must not touch the store itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from sync.errors import LocalProtocolError
from sync.frames import Domain
from sync.protocol import SessionRole, SyncSession
from sync.replica import MemoryReplica, Record

from sync_support import engine, message


class ReadOnly(MemoryReplica):
    """A replica whose ``apply`` fails: only the driver may write, through ``written``."""

    def __init__(self) -> None:
        super().__init__(admit_all=True)
        self.written = 0

    def apply(self, domain: Domain, records: Sequence[Record]) -> int:
        raise AssertionError("a session wrote to its replica")

    def write(self, domain: Domain, records: Sequence[Record]) -> int:
        self.written += len(records)
        return MemoryReplica.apply(self, domain, records)


def test_two_sessions_converge_with_every_record_written_by_their_drivers() -> None:
    ours, theirs = ReadOnly(), ReadOnly()
    ours.write(Domain.MESSAGES, [message(n) for n in range(0, 40)])
    theirs.write(Domain.MESSAGES, [message(n) for n in range(20, 60)])
    before = ours.written + theirs.written
    initiator = SyncSession(SessionRole.INITIATOR, ours, now_ms=0)
    responder = SyncSession(SessionRole.RESPONDER, theirs, now_ms=0)
    frame: bytes | None = initiator.start(0)
    receiver, sender = responder, initiator
    while frame is not None:
        received = receiver.receive_checked(receiver.check(frame), 0)
        target = ours if receiver is initiator else theirs
        applied = sum(target.write(domain, records) for domain, records in received.records)
        frame = receiver.answer(applied)
        receiver, sender = sender, receiver
    assert initiator.converged and responder.converged
    assert ours.written + theirs.written - before == 40  # 20 each way, each written once
    assert set(ours.messages) == set(theirs.messages) == {message(n).msg_id for n in range(60)}
    assert initiator.stats.records_applied + responder.stats.records_applied == 40


def test_answer_comes_once_after_each_frame_taken() -> None:
    replica = engine()
    replica.apply(Domain.MESSAGES, [message(1)])
    initiator = SyncSession(SessionRole.INITIATOR, replica, now_ms=0)
    responder = SyncSession(SessionRole.RESPONDER, engine(), now_ms=0)
    hello = initiator.start(0)
    with pytest.raises(LocalProtocolError):
        responder.answer(0)  # no frame taken yet
    responder.receive_checked(responder.check(hello), 0)
    with pytest.raises(LocalProtocolError):
        responder.receive_checked(responder.check(hello), 0)  # the last one is unanswered
    assert responder.answer(0) is not None
