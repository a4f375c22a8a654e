"""Anti-entropy over streams: drives ``sync.protocol`` sessions over framed streams.

A session step (``session.receive``) reads and writes RocksDB and the trees, so
it runs in a worker thread under the node's ``db_lock`` — the same lock the DB
writer holds — keeping one writer at a time. Between frames the driver sleeps until
the session's ``next_deadline()`` (its idle timeout, ``SyncConfig.idle_timeout_ms``,
from ``NodeConfig.sync_idle_timeout_s``) and then lets ``handle_timeout`` end it. A
bad frame ends that session with a reason (sent to the peer as ABORT, logged,
counted), never the process. Each peer's frames and bytes are rate-limited across all
its sessions. Every time here is the node's ``Clock`` (trio's).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import trio

from node.clock import Clock
from node.framing import FrameStream, StreamClosed
from node.limits import TokenBuckets
from node.metrics import Metrics
from sync.errors import RemoteProtocolError
from sync.frames import Abort, encode_frame
from sync.protocol import SessionRole, SyncConfig, SyncSession
from sync.replica import Replica

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 2.0
BUSY = "busy"  # outcome / ABORT reason: another session was running


@dataclass
class SyncOutcome:
    peer: str
    role: str
    converged: bool | None
    error: str | None
    started_ms: int
    duration_ms: float
    frames: int
    bytes_sent: int
    bytes_received: int
    records_received: int
    records_applied: int
    passes: int = 0  # reconciliation passes the session ran

    @property
    def useless(self) -> bool:
        """The peer sent records and none of them was new: a stale replay, or a lying peer."""
        return self.error is None and self.records_received > 0 and self.records_applied == 0


class SyncService:
    def __init__(
        self,
        replica: Replica,
        db_lock: trio.Lock,
        metrics: Metrics,
        *,
        clock: Clock,
        config: SyncConfig | None = None,
        salt: Callable[[], bytes] | None = None,
        frames_per_s: float = float("inf"),
        bytes_per_s: float = float("inf"),
        on_outcome: Callable[[SyncOutcome], None] | None = None,
    ) -> None:
        self.replica = replica
        self.db_lock = db_lock
        self.metrics = metrics
        self.config = config or SyncConfig()
        self.clock = clock
        self._salt = salt or (lambda: os.urandom(16))
        self.last_sync: dict[str, SyncOutcome] = {}
        # One session at a time. A node that was down is missing the same records from every
        # peer, and all of them start a session with it on reconnect: run concurrently, each
        # session would verify and apply the same records again (4x the work with 4 peers), and
        # sessions whose records another one applied first look like stale replays. A session
        # that finds another running ends at once ("busy") and is retried at the next interval.
        self._gate = trio.Lock()
        self.on_outcome = on_outcome
        # per peer, across its sessions: a peer cannot flood us by opening many of them
        self._frames = TokenBuckets(frames_per_s, max(frames_per_s, 1.0) * 2)
        self._bytes = TokenBuckets(bytes_per_s, max(bytes_per_s, 1.0) * 2)

    async def initiate(self, peer: str, frames: FrameStream) -> SyncOutcome:
        session = SyncSession(
            SessionRole.INITIATOR, self.replica, now_ms=self.clock.wall_ms(),
            salt_seed=self._salt(), config=self.config,
        )  # fmt: skip
        if self._gate.locked():  # another session is running: try again next interval
            await _close(frames)
            return self._busy(peer, session)
        async with self._gate:
            return await self._drive(peer, session, frames)

    async def respond(self, peer: str, frames: FrameStream) -> SyncOutcome:
        session = SyncSession(
            SessionRole.RESPONDER, self.replica, now_ms=self.clock.wall_ms(), config=self.config
        )
        if self._gate.locked():
            await _try_send(frames, encode_frame(Abort(BUSY)))
            await _close(frames)
            return self._busy(peer, session)
        async with self._gate:
            return await self._drive(peer, session, frames)

    def _busy(self, peer: str, session: SyncSession) -> SyncOutcome:
        outcome = SyncOutcome(
            peer=peer, role=session.role.value, converged=False, error=BUSY,
            started_ms=self.clock.wall_ms(), duration_ms=0.0, frames=0, bytes_sent=0,
            bytes_received=0, records_received=0, records_applied=0,
        )  # fmt: skip
        self.metrics.inc("sync_sessions", role=outcome.role, result=BUSY)
        return outcome

    async def _drive(self, peer: str, session: SyncSession, frames: FrameStream) -> SyncOutcome:
        started, t0 = self.clock.wall_ms(), self.clock.now()
        try:
            error = await self._exchange(peer, session, frames)
        finally:
            await _close(frames)
        outcome = _outcome(peer, session, error, started, (self.clock.now() - t0) * 1000)
        self._record(outcome)
        if self.on_outcome is not None:
            self.on_outcome(outcome)
        return outcome

    async def _exchange(self, peer: str, session: SyncSession, frames: FrameStream) -> str | None:
        """Frames back and forth until the session is over; the reason it failed, or None."""
        initiator = session.role is SessionRole.INITIATOR
        out = session.start(self.clock.wall_ms()) if initiator else None
        try:
            while True:
                if out is not None:
                    await frames.write_frame(out)
                    session.sent(self.clock.wall_ms())  # the peer's silence counts from here
                if session.finished:
                    return None
                data = await self._next_frame(session, frames)
                if data is None:  # the peer was silent past the idle timeout
                    await _try_send(frames, session.abort_frame())
                    return "timeout"
                self._check_rate(peer, len(data))
                async with self.db_lock:
                    out = await trio.to_thread.run_sync(session.receive, data, self.clock.wall_ms())
        except RemoteProtocolError as exc:
            busy = str(exc).endswith(f": {BUSY}")  # the peer was in another session: retried
            (log.info if busy else log.warning)(
                "sync with %s ended: %s (%s)", peer, exc.reason, exc
            )
            await _try_send(frames, encode_frame(Abort(exc.reason)))
            return exc.reason
        except StreamClosed as exc:
            log.info("sync with %s: stream closed (%s)", peer, exc)
            return "stream_closed"

    async def _next_frame(self, session: SyncSession, frames: FrameStream) -> bytes | None:
        """The peer's next frame; None once the session's idle deadline has passed (then
        ``handle_timeout`` has aborted the session)."""
        while True:
            deadline_ms = session.next_deadline()
            assert deadline_ms is not None  # the session is not finished
            with trio.move_on_after(max(0.0, self.clock.seconds_until(deadline_ms))):
                return await frames.read_frame()
            if session.handle_timeout(self.clock.wall_ms()) is not None:
                return None

    def _check_rate(self, peer: str, size: int) -> None:
        now = self.clock.now()
        if not (self._frames.take(peer, 1, now) and self._bytes.take(peer, size, now)):
            raise RemoteProtocolError(
                "peer over its sync frame or byte rate (dm3 -32005 Limit exceeded)",
                reason="rate_limited",
            )

    def _record(self, outcome: SyncOutcome) -> None:
        self.last_sync[outcome.peer] = outcome
        result = outcome.error or ("converged" if outcome.converged else "not_converged")
        self.metrics.inc(
            "sync_sessions", role=outcome.role, result=result, help="sync sessions by result"
        )
        self.metrics.inc("sync_bytes", outcome.bytes_sent, direction="sent", help="sync bytes")
        self.metrics.inc("sync_bytes", outcome.bytes_received, direction="received")
        self.metrics.inc(
            "sync_records_applied", outcome.records_applied, help="records applied by sync"
        )


def _outcome(
    peer: str, session: SyncSession, error: str | None, started_ms: int, duration_ms: float
) -> SyncOutcome:
    stats = session.stats
    return SyncOutcome(
        peer=peer,
        role=session.role.value,
        converged=session.converged if error is None else False,
        error=error,
        started_ms=started_ms,
        duration_ms=duration_ms,
        frames=stats.frames_sent + stats.frames_received,
        bytes_sent=sum(stats.bytes_sent.values()),
        bytes_received=sum(stats.bytes_received.values()),
        records_received=stats.records_received,
        records_applied=stats.records_applied,
        passes=stats.passes,
    )


async def _close(frames: FrameStream) -> None:
    """Close the stream even when cancelled (shutdown) — but give up after CLOSE_TIMEOUT_S:
    a yamux stream whose connection is wedged can block its close forever, and a shielded
    wait without a deadline then keeps the whole node from stopping."""
    with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
        scope.shield = True
        await frames.aclose()


async def _try_send(frames: FrameStream, data: bytes) -> None:
    if not data:
        return
    try:
        with trio.move_on_after(1):
            await frames.write_frame(data)
    except StreamClosed:
        pass
