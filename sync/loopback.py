"""Drive two sessions against each other in memory: tests, benchmarks and the simulator use it.

Frames go one at a time in both directions; ``deliver`` can drop the session
by returning False (a peer vanishing), which the callers use to model loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sync.protocol import SessionRole, SyncConfig, SyncSession
from sync.replica import Replica


@dataclass
class LoopbackResult:
    initiator: SyncSession
    responder: SyncSession
    frames: int

    @property
    def converged(self) -> bool:
        return bool(self.initiator.converged)


def run_session(
    initiator: Replica,
    responder: Replica,
    *,
    now_ms: int = 0,
    salt_seed: bytes = b"loopback",
    config: SyncConfig | None = None,
    responder_config: SyncConfig | None = None,
    max_frames: int = 10_000,
    on_frame: Callable[[str, bytes], None] | None = None,
) -> LoopbackResult:
    """Run one session to its end; the initiator's ``converged`` says if roots matched."""
    a = SyncSession(
        SessionRole.INITIATOR, initiator, now_ms=now_ms, salt_seed=salt_seed, config=config
    )
    b = SyncSession(
        SessionRole.RESPONDER, responder, now_ms=now_ms, config=responder_config or config
    )
    frame: bytes | None = a.start(now_ms)
    sender, receiver = "initiator", b
    frames = 0
    while frame is not None:
        frames += 1
        if frames > max_frames:
            raise RuntimeError(f"session did not finish within {max_frames} frames")
        if on_frame is not None:
            on_frame(sender, frame)
        frame = receiver.receive(frame, now_ms)
        sender, receiver = ("responder", a) if receiver is b else ("initiator", b)
    return LoopbackResult(a, b, frames)
