"""One anti-entropy session between two simulated replicas: ``sync.protocol.SyncSession`` on both ends.

Like ``sync.loopback.run_session``, frames go one at a time in both directions,
but each side runs on its own clock and config (its own retention cutoff), the
connection can die after ``cut_after`` frames, and a peer's protocol error ends
the session the way it would on a real stream (the other side just stops).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sync.errors import RemoteProtocolError
from sync.protocol import KINDS, SessionRole, SyncConfig, SyncSession
from sync.replica import Replica

MAX_FRAMES = 10_000


@dataclass
class SessionOutcome:
    converged: bool
    frames: int
    cut: bool = False
    error: str | None = None
    records_applied: int = 0
    rejected_old: int = 0
    rejected_future: int = 0
    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))


def run_pair(
    initiator: Replica,
    responder: Replica,
    *,
    now_initiator: int,
    now_responder: int,
    config_initiator: SyncConfig,
    config_responder: SyncConfig,
    salt_seed: bytes,
    cut_after: int | None = None,
) -> SessionOutcome:
    a = SyncSession(
        SessionRole.INITIATOR,
        initiator,
        now_ms=now_initiator,
        salt_seed=salt_seed,
        config=config_initiator,
    )
    b = SyncSession(SessionRole.RESPONDER, responder, now_ms=now_responder, config=config_responder)
    frame: bytes | None = a.start(now_initiator)
    receiver, now = b, now_responder
    frames, cut, error = 0, False, None
    while frame is not None:
        frames += 1
        if (cut_after is not None and frames > cut_after) or frames > MAX_FRAMES:
            cut = True
            break
        try:
            frame = receiver.receive(frame, now)
        except RemoteProtocolError as exc:
            error = exc.reason
            break
        if receiver is b:
            receiver, now = a, now_initiator
        else:
            receiver, now = b, now_responder
    outcome = SessionOutcome(bool(a.converged), frames, cut, error)
    for session in (a, b):
        for kind in KINDS:
            outcome.bytes[kind] += session.stats.bytes_sent[kind]
        outcome.records_applied += session.stats.records_applied
        outcome.rejected_old += session.stats.rejected_old
        outcome.rejected_future += session.stats.rejected_future
    return outcome
