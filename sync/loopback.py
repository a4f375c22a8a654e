"""Drive two sessions against each other in memory: tests, benchmarks and the simulator use it.

Frames go one at a time in both directions. Each side may run on its own clock
and config (``responder_now_ms``, ``responder_config``: its own retention
cutoff); by default the responder shares the initiator's. ``cut_after`` kills
the connection after that many frames (the result is ``cut``), as a lossy
network does; ``on_frame`` sees every frame before its receiver does.

By default a peer's protocol error raises ``RemoteProtocolError`` and a session
that runs past ``max_frames`` raises ``RuntimeError``. With
``raise_errors=False`` (the simulator) both end the session as on a real
stream instead: the other side just stops, the result keeps the error's reason
in ``error``, and running past ``max_frames`` counts as ``cut``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sync.errors import RemoteProtocolError
from sync.protocol import KINDS, SessionRole, SyncConfig, SyncSession
from sync.replica import Replica


@dataclass
class LoopbackResult:
    initiator: SyncSession
    responder: SyncSession
    frames: int = 0
    cut: bool = False  # the connection died (``cut_after``, or ``max_frames`` not raising)
    error: str | None = None  # the reason of the protocol error that ended it

    @property
    def converged(self) -> bool:
        return bool(self.initiator.converged)

    @property
    def records_applied(self) -> int:
        return self.initiator.stats.records_applied + self.responder.stats.records_applied

    @property
    def rejected_old(self) -> int:
        return self.initiator.stats.rejected_old + self.responder.stats.rejected_old

    @property
    def rejected_future(self) -> int:
        return self.initiator.stats.rejected_future + self.responder.stats.rejected_future

    @property
    def bytes_sent(self) -> dict[str, int]:
        """Bytes both sides sent, by kind of frame content (``sync.protocol.KINDS``)."""
        a, b = self.initiator.stats.bytes_sent, self.responder.stats.bytes_sent
        return {kind: a[kind] + b[kind] for kind in KINDS}


def run_session(
    initiator: Replica,
    responder: Replica,
    *,
    now_ms: int = 0,
    responder_now_ms: int | None = None,
    salt_seed: bytes = b"loopback",
    config: SyncConfig | None = None,
    responder_config: SyncConfig | None = None,
    max_frames: int = 10_000,
    cut_after: int | None = None,
    raise_errors: bool = True,
    on_frame: Callable[[str, bytes], None] | None = None,
) -> LoopbackResult:
    """Run one session to its end; the initiator's ``converged`` says if roots matched."""
    link = _Link(cut_after, max_frames, raise_errors, on_frame)
    b_now = now_ms if responder_now_ms is None else responder_now_ms
    a = SyncSession(
        SessionRole.INITIATOR, initiator, now_ms=now_ms, salt_seed=salt_seed, config=config
    )
    b = SyncSession(
        SessionRole.RESPONDER, responder, now_ms=b_now, config=responder_config or config
    )
    result = LoopbackResult(a, b)
    turns = (("initiator", b, b_now), ("responder", a, now_ms))  # who sends, who receives
    frame: bytes | None = a.start(now_ms)
    while frame is not None:
        sender, receiver, now = turns[result.frames % 2]
        frame = link.carry(result, sender, receiver, frame, now)
    return result


@dataclass(frozen=True)
class _Link:
    """The in-memory connection between the two sessions."""

    cut_after: int | None
    max_frames: int
    raise_errors: bool
    on_frame: Callable[[str, bytes], None] | None

    def carry(
        self, result: LoopbackResult, sender: str, receiver: SyncSession, frame: bytes, now_ms: int
    ) -> bytes | None:
        """The next frame to ``receiver``: its answer, or None when the session is over."""
        result.frames += 1
        result.cut = self._dies_before(result.frames)
        if result.cut:
            return None
        if self.on_frame is not None:
            self.on_frame(sender, frame)
        try:
            return receiver.receive(frame, now_ms)
        except RemoteProtocolError as exc:
            if self.raise_errors:
                raise
            result.error = exc.reason
            return None

    def _dies_before(self, number: int) -> bool:
        """Does the connection die before frame ``number`` (from 1) gets through?"""
        if self.cut_after is not None and number > self.cut_after:
            return True
        if number <= self.max_frames:
            return False
        if self.raise_errors:
            raise RuntimeError(f"session did not finish within {self.max_frames} frames")
        return True
