"""Anti-entropy over streams: drives ``sync.protocol`` sessions over framed streams.

Several sessions run at once, with different peers: one per peer, whichever side opened
it, and at most ``max_sessions`` in each direction (``node/sync_slots.py``), so a peer that
holds a silent stream, or opens one after another, holds its own slot and nobody else's.
The sessions share one ``BucketClaims`` (``sync/claims.py``): each reconciles differing
buckets no other one holds, so a node catching up from four peers at once receives and
verifies each missing record once, not four times. A frame is taken in three steps:
``session.check`` (decode, signatures: no replica) and ``session.receive_checked`` (reads
the replica, returns the records the frame brought — a session never writes), both in
worker threads; then the records go to the node's one writer (``store``: the DB writer's
queue, ``node/writer.py``), and ``session.answer`` builds the reply once they are written
(its roots must include them). So one session's records are checked on the verify threads
while another's are written; sessions interleave frame by frame, as they do with the writer.
Between frames the driver sleeps until the session's ``next_deadline()`` (its idle timeout,
``SyncConfig.idle_timeout_ms``, longer while a big frame is in flight) and then lets
``handle_timeout`` end it. A bad frame ends that session with a reason (sent to the peer as
ABORT, logged, counted, charged by ``PeerJudge``), never the process. Each peer's frames
and bytes are rate-limited across all its sessions. Every time here is the node's
``Clock`` (trio's).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import trio

from node.agreement import PeerAgreement, Roots
from node.clock import Clock
from node.framing import FrameStream, FrameTooLarge, StreamClosed
from node.limits import TokenBuckets
from node.metrics import Metrics
from node.sync_slots import BUSY, CROSSED, DUPLICATE, SessionSlots
from sync.claims import BucketClaims
from sync.entitled import PeerScoped
from sync.errors import RemoteProtocolError
from sync.frames import Abort, Domain, encode_frame
from sync.protocol import CheckedFrame, Received, SessionRole, SyncConfig, SyncSession
from sync.replica import Replica
from sync.scope import Scope

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 2.0
MAX_SESSIONS = 4  # per direction (the node's setting: sync_max_sessions)
REFUSALS = (BUSY, DUPLICATE)  # ABORT reasons of a session that never started

# Writes the records a session received, in order (a node: its DB writer); how many changed.
StoreReceived = Callable[[Received], Awaitable[int]]


class PeerAborted(RemoteProtocolError):
    """The peer ended the session with ABORT; ``peer_reason`` is the reason it sent (BUSY,
    DUPLICATE: it had no slot for us)."""

    reason = "peer_abort"

    def __init__(self, message: str, *, peer_reason: str) -> None:
        super().__init__(message)
        self.peer_reason = peer_reason


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
    records_sent: int = 0
    # records other sessions applied while this one ran: they may have been the ones this
    # peer sent (the same catch-up from several peers), so "nothing new" is no one's fault
    applied_by_others: int = 0
    # converged: what it reconciled (the intersection of both scopes), else None
    reconciled: Scope | None = None

    @property
    def result(self) -> str:
        """ "converged", "not_converged" or the reason it failed."""
        return self.error or ("converged" if self.converged else "not_converged")

    @property
    def ended_ms(self) -> int:
        return self.started_ms + round(self.duration_ms)

    def more_to_do(self, max_passes: int) -> bool:
        """Ended cleanly, moved records either way and used up its passes: a catch-up with
        more to come (the next session may start at once). Both ends of a catch-up say so:
        the node behind, and the peer feeding it, whose session the node's own is refused
        beside."""
        moved = self.records_applied > 0 or self.records_sent > 0
        return self.error is None and self.passes >= max_passes and moved

    @property
    def useless(self) -> bool:
        """The peer sent records and none of them was new: a stale replay, or a lying peer."""
        return (
            self.error is None
            and self.records_received > 0
            and self.records_applied == 0
            and self.applied_by_others == 0
        )


class SyncService:
    def __init__(
        self,
        replica: Replica,
        store: StoreReceived,
        metrics: Metrics,
        *,
        clock: Clock,
        config: SyncConfig | None = None,
        cutoff: Callable[[], int | None] | None = None,
        salt: Callable[[], bytes] | None = None,
        frames_per_s: float = float("inf"),
        bytes_per_s: float = float("inf"),
        max_sessions: int = MAX_SESSIONS,
        on_outcome: Callable[[SyncOutcome], None] | None = None,
        peer_bound: Callable[[str], Scope] | None = None,
        own_id: str | None = None,
        on_converged: Callable[[SyncOutcome], None] | None = None,
    ) -> None:
        self.replica = replica
        # scope authentication: what a peer may reconcile with us (sync/entitled.py)
        self.peer_bound = peer_bound
        self.store = store
        self.metrics = metrics
        self.config = config or SyncConfig()
        self.cutoff = cutoff  # the retention cutoff now (the GC's), read as a session starts
        self.clock = clock
        self._salt = salt or (lambda: os.urandom(16))
        self.last_sync: dict[str, SyncOutcome] = {}
        self.agreement = PeerAgreement()  # whose roots equalled ours, and when (web view)
        # One session per peer, a few at once. Running one at a time for the whole node let
        # one silent stream stop all anti-entropy. The price of concurrency: a node that was
        # down may verify the same records from two peers (bounded by max_sessions).
        # (our id breaks the tie when a peer's session crosses ours: node/sync_slots.py)
        self.slots = SessionSlots(max_sessions, own=own_id)
        # ...which split the buckets they find different: each missing record comes once
        # a session that brings no record for 3 idle timeouts loses them (not 1: at 1,000,000
        # missing, the id lists of a pass take a few record-less frames on a busy machine)
        self.claims = BucketClaims(stale_ms=3 * self.config.idle_timeout_ms)
        self._applied_total = 0  # records applied by every session since start
        self.on_outcome = on_outcome
        # a session that converged (``reconciled`` set): node/scopes.py hands over user shards
        self.on_converged = on_converged
        # per peer, across its sessions: a peer cannot flood us by opening many of them
        self._frames = TokenBuckets(frames_per_s, max(frames_per_s, 1.0) * 2)
        self._bytes = TokenBuckets(bytes_per_s, max(bytes_per_s, 1.0) * 2)

    def session_config(self) -> SyncConfig:
        """A new session's settings: ours, with the retention cutoff as it is now."""
        if self.cutoff is None:
            return self.config
        return replace(self.config, cutoff_ms=self.cutoff())

    def _replica_for(self, peer: str) -> Replica:
        """Our replica as a session with ``peer`` sees it: bounded by what the peer is
        entitled to when scopes are authenticated."""
        if self.peer_bound is None:
            return self.replica
        return PeerScoped(self.replica, self.peer_bound(peer))

    def may_initiate(self, peer: str) -> bool:
        """Whether a session we open with ``peer`` could start now (ask before opening a stream)."""
        role = SessionRole.INITIATOR.value
        return not self.slots.holds(peer) and self.slots.refusal(peer, role) is None

    async def initiate(self, peer: str, frames: FrameStream) -> SyncOutcome:
        session = SyncSession(
            SessionRole.INITIATOR, self._replica_for(peer), now_ms=self.clock.wall_ms(),
            salt_seed=self._salt(), config=self.session_config(), claims=self.claims,
        )  # fmt: skip
        refused = self.slots.claim(peer, session.role.value)
        if refused is not None:  # retried next interval
            await _close(frames)
            return self._refused(peer, session, CROSSED if refused == CROSSED else BUSY)
        try:
            return await self._drive(peer, session, frames)
        finally:
            self.slots.release(peer, session.role.value)

    async def respond(self, peer: str, frames: FrameStream) -> SyncOutcome:
        session = SyncSession(
            SessionRole.RESPONDER, self._replica_for(peer), now_ms=self.clock.wall_ms(),
            config=self.session_config(), claims=self.claims,
        )  # fmt: skip
        refused = self.slots.claim(peer, session.role.value)
        if refused is not None:  # (a crossing we win reads as DUPLICATE to the peer)
            await _try_send(frames, encode_frame(Abort(DUPLICATE if refused == CROSSED else refused)))  # fmt: skip
            await _close(frames)
            return self._refused(peer, session, refused)
        try:
            return await self._drive(peer, session, frames)
        finally:
            self.slots.release(peer, session.role.value)

    def _refused(self, peer: str, session: SyncSession, reason: str) -> SyncOutcome:
        """A session that never started: ``reason`` is BUSY, DUPLICATE or CROSSED
        (node/sync_slots.py)."""
        outcome = SyncOutcome(
            peer=peer, role=session.role.value, converged=False, error=reason,
            started_ms=self.clock.wall_ms(), duration_ms=0.0, frames=0, bytes_sent=0,
            bytes_received=0, records_received=0, records_applied=0,
        )  # fmt: skip
        self.metrics.inc("sync_sessions", role=outcome.role, result=reason)
        if self.on_outcome is not None:
            self.on_outcome(outcome)  # a peer that keeps probing a busy slot pays for it
        return outcome

    async def _drive(self, peer: str, session: SyncSession, frames: FrameStream) -> SyncOutcome:
        started, t0 = self.clock.wall_ms(), self.clock.now()
        applied_before = self._applied_total
        try:
            error = await self._exchange(peer, session, frames)
        finally:
            session.release_claims()  # however it ended: its buckets go to other sessions
            await _close(frames)
        outcome = _outcome(peer, session, error, started, (self.clock.now() - t0) * 1000)
        outcome.applied_by_others = self._applied_total - applied_before - outcome.records_applied
        self._record(outcome)
        if self.on_outcome is not None:
            self.on_outcome(outcome)
        if outcome.reconciled is not None and self.on_converged is not None:
            self.on_converged(outcome)
        return outcome

    async def _exchange(self, peer: str, session: SyncSession, frames: FrameStream) -> str | None:
        """Frames back and forth until the session is over; the reason it failed, or None."""
        out = None
        if session.role is SessionRole.INITIATOR:
            out = session.start(self.clock.wall_ms())
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
                out = await self._receive(session, data)
        except RemoteProtocolError as exc:
            # the peer had no slot for us: retried at the next interval
            busy = isinstance(exc, PeerAborted) and exc.peer_reason in REFUSALS
            (log.info if busy else log.warning)(
                "sync with %s ended: %s (%s)", peer, exc.reason, exc
            )
            await _try_send(frames, encode_frame(Abort(exc.reason)))
            return exc.reason
        except FrameTooLarge as exc:
            log.warning("sync with %s: %s", peer, exc)
            return "oversize_frame"
        except StreamClosed as exc:
            log.info("sync with %s: stream closed (%s)", peer, exc)
            return "stream_closed"

    async def _receive(self, session: SyncSession, data: bytes) -> bytes | None:
        """One step of the session: checked in a worker thread (signatures on the verify
        threads), taken in one (reads only), its records written by the node's writer, then
        answered; counts what it applied."""
        checked = await trio.to_thread.run_sync(session.check, data)
        try:
            received = await trio.to_thread.run_sync(
                session.receive_checked, checked, self.clock.wall_ms()
            )
        except RemoteProtocolError as exc:
            aborted = _peer_aborted(checked)
            if aborted is None:
                raise
            raise aborted from exc  # the peer's reason as a field, not in the message only
        applied = await self.store(received) if received.records else 0
        self._applied_total += applied  # a frame that ends the session applied these too
        return await trio.to_thread.run_sync(session.answer, applied)

    async def _next_frame(self, session: SyncSession, frames: FrameStream) -> bytes | None:
        """The peer's next frame; None once the session's idle deadline has passed (then
        ``handle_timeout`` has aborted the session). The deadline moves out once the peer
        announces the frame's length: a big frame gets the time it needs to arrive."""
        with trio.CancelScope(deadline=self._trio_deadline(session)) as scope:
            size = await frames.read_length()
            session.receiving(size, self.clock.wall_ms())
            scope.deadline = self._trio_deadline(session)
            return await frames.read_body(size)
        # trio's deadline passed: a rounded millisecond must not make the session's look early
        deadline_ms = session.next_deadline() or 0
        session.handle_timeout(max(self.clock.wall_ms(), deadline_ms))
        return None

    def _trio_deadline(self, session: SyncSession) -> float:
        deadline_ms = session.next_deadline()
        assert deadline_ms is not None  # the session is not finished
        return self.clock.now() + max(0.0, self.clock.seconds_until(deadline_ms))

    def _check_rate(self, peer: str, size: int) -> None:
        now = self.clock.now()
        if not (self._frames.take(peer, 1, now) and self._bytes.take(peer, size, now)):
            raise RemoteProtocolError(
                "peer over its sync frame or byte rate (dm3 -32005 Limit exceeded)",
                reason="rate_limited",
            )

    def roots(self) -> Roots:
        """Our Merkle root per domain (hex)."""
        return {d.name.lower(): self.replica.tree(d).root_digest().hex() for d in Domain}

    def _record(self, outcome: SyncOutcome) -> None:
        self.last_sync[outcome.peer] = outcome
        if outcome.converged:
            self.agreement.matched(outcome.peer, self.roots(), self.clock.wall_ms())
        self.metrics.inc(
            "sync_sessions", role=outcome.role, result=outcome.result,
            help="sync sessions by result",
        )  # fmt: skip
        self.metrics.inc("sync_bytes", outcome.bytes_sent, direction="sent", help="sync bytes")
        self.metrics.inc("sync_bytes", outcome.bytes_received, direction="received")
        self.metrics.inc(
            "sync_records_applied", outcome.records_applied, help="records applied by sync"
        )


def _outcome(
    peer: str, session: SyncSession, error: str | None, started_ms: int, duration_ms: float
) -> SyncOutcome:
    stats = session.stats
    converged = session.converged if error is None else False
    return SyncOutcome(
        peer=peer,
        role=session.role.value,
        converged=converged,
        error=error,
        started_ms=started_ms,
        duration_ms=duration_ms,
        frames=stats.frames_sent + stats.frames_received,
        bytes_sent=sum(stats.bytes_sent.values()),
        bytes_received=sum(stats.bytes_received.values()),
        records_received=stats.records_received,
        records_applied=stats.records_applied,
        passes=stats.passes,
        records_sent=stats.records_sent,
        reconciled=session.scope if converged else None,
    )


def _peer_aborted(checked: CheckedFrame) -> PeerAborted | None:
    """The session's error for the peer's ABORT, with the peer's reason kept as a field."""
    if not isinstance(checked.frame, Abort):
        return None
    return PeerAborted(f"peer aborted: {checked.frame.reason}", peer_reason=checked.frame.reason)


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
