"""Sync sessions over in-memory streams: convergence, timeouts, garbage, a peer that vanishes."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from node.clock import Clock
from node.framing import TrioFrames
from node.metrics import Metrics
from node.syncer import SyncOutcome, SyncService
from store import Hlc
from sync.errors import RemoteProtocolError
from sync.frames import Domain
from sync.protocol import SessionRole, SyncConfig, SyncSession
from sync.replica import DbReplica, MemoryReplica, Replica

from node_support import JOIN, add, identity, messages, seed, small_db, store_directly

MAX_FRAME = 1 << 22


def service(
    replica: Replica, metrics: Metrics, *, timeout_s: float = 3600, **limits: float
) -> SyncService:
    return SyncService(
        replica, store_directly(replica), metrics, clock=Clock(10_000),
        config=SyncConfig(idle_timeout_ms=round(timeout_s * 1000)), **limits,
    )  # fmt: skip


async def test_two_nodes_converge_over_a_stream(tmp_path: Path) -> None:
    a_db, b_db = small_db(tmp_path / "a"), small_db(tmp_path / "b")
    try:
        seed(a_db, messages(0, 60), add(1, 5))
        seed(b_db, messages(30, 60))
        b_db.put_identities([identity(2, 9)])
        a, b = DbReplica(a_db), DbReplica(b_db)
        left, right = trio.testing.memory_stream_pair()
        metrics = Metrics()
        outcomes = []

        async def respond() -> None:
            outcomes.append(await service(b, metrics).respond("a", TrioFrames(right, MAX_FRAME)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(respond)
            outcomes.append(await service(a, metrics).initiate("b", TrioFrames(left, MAX_FRAME)))
        assert all(o.converged and o.error is None for o in outcomes)
        for domain in Domain:
            assert a.tree(domain).root() == b.tree(domain).root()
        assert a.tree(Domain.MESSAGES).count == 90
        assert a.tree(Domain.MEMBERS).count == 2  # JOIN and add(1, 5)
        assert not a.waiting and not b.waiting
        assert metrics.counter("sync_sessions", role="initiator", result="converged") == 1
    finally:
        a_db.close()
        b_db.close()


async def test_a_silent_peer_times_out(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    db = small_db(tmp_path / "a")
    try:
        left, _right = trio.testing.memory_stream_pair()  # nobody answers on the right
        outcome = await service(DbReplica(db), Metrics(), timeout_s=10).initiate(
            "x", TrioFrames(left, MAX_FRAME)
        )
        assert outcome.error == "timeout" and outcome.converged is False
    finally:
        db.close()


async def test_garbage_ends_the_session_and_the_next_one_works(tmp_path: Path) -> None:
    db = small_db(tmp_path / "a")
    try:
        seed(db, messages(0, 5))  # the honest peer gets the messages and the op admitting them
        replica, metrics = DbReplica(db), Metrics()
        left, right = trio.testing.memory_stream_pair()
        peer = TrioFrames(left, MAX_FRAME)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer.write_frame, b"\xff\x00garbage")
            outcome = await service(replica, metrics).respond("evil", TrioFrames(right, MAX_FRAME))
            abort = await peer.read_frame()  # the responder told the peer why
        assert outcome.error == "malformed_frame"
        assert b"malformed" in abort or len(abort) > 0
        assert metrics.counter("sync_sessions", role="responder", result="malformed_frame") == 1
        # the same service still serves an honest peer afterwards
        other = small_db(tmp_path / "b")
        try:
            left, right = trio.testing.memory_stream_pair()
            results = []

            async def respond() -> None:
                results.append(
                    await service(replica, metrics).respond("ok", TrioFrames(right, MAX_FRAME))
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(respond)
                results.append(
                    await service(DbReplica(other), metrics).initiate(
                        "s", TrioFrames(left, MAX_FRAME)
                    )
                )
            assert all(r.converged for r in results)
            assert sum(1 for _ in other.iter_msg_ids()) == 5
        finally:
            other.close()
    finally:
        db.close()


async def test_a_peer_that_vanishes_mid_session(tmp_path: Path) -> None:
    db = small_db(tmp_path / "a")
    try:
        db.put_messages(messages(0, 5))
        left, right = trio.testing.memory_stream_pair()
        peer = TrioFrames(left, MAX_FRAME)

        async def vanish() -> None:
            await peer.read_frame()  # take the HELLO, then hang up
            await left.aclose()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(vanish)
            outcome = await service(DbReplica(db), Metrics()).initiate(
                "gone", TrioFrames(right, MAX_FRAME)
            )
        assert outcome.error == "stream_closed"
    finally:
        db.close()


async def test_an_oversized_frame_is_refused_before_reading_it(tmp_path: Path) -> None:
    db = small_db(tmp_path / "a")
    try:
        left, right = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(left.send_all, (MAX_FRAME + 1).to_bytes(4, "big") + b"x" * 10)
            outcome = await service(DbReplica(db), Metrics()).respond(
                "big", TrioFrames(right, MAX_FRAME)
            )
        assert outcome.error == "oversize_frame"  # charged: an honest peer knows the limit
    finally:
        db.close()


async def test_a_peer_replaying_stale_versions_forever_is_penalized_to_a_ban(
    tmp_path: Path,
) -> None:
    """Member ops are a grow-only set (nothing in it goes stale); identities are
    last-writer-wins: a peer can hold a superseded identity document and offer it forever."""
    from node.penalties import SYNC_PENALTY, PeerPenalties
    from sync.replica import MemoryReplica

    from node_support import USERS

    class Stubborn(MemoryReplica):
        """A hostile peer: keeps its stale version and never takes ours."""

        def apply(self, domain, records):  # type: ignore[no-untyped-def]
            return 0

    db = small_db(tmp_path / "a")
    try:
        stale, current = identity(1, 5), identity(1, 9)  # the same user: 9 supersedes 5
        db.put_identities([stale, current])
        mine, peer = DbReplica(db), Stubborn()
        MemoryReplica.apply(peer, Domain.IDENTITY, [stale])
        penalties, banned = PeerPenalties(threshold=10), []

        def judge(outcome) -> None:  # type: ignore[no-untyped-def]
            if outcome.useless and penalties.penalize("stubborn", SYNC_PENALTY["useless"], 0.0):
                banned.append(outcome.peer)

        ours = SyncService(
            mine, store_directly(mine), Metrics(), clock=Clock(10_000), on_outcome=judge
        )
        for _ in range(10):
            left, right = trio.testing.memory_stream_pair()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    service(peer, Metrics()).respond, "us", TrioFrames(right, MAX_FRAME)
                )
                outcome = await ours.initiate("stubborn", TrioFrames(left, MAX_FRAME))
            assert outcome.records_received >= 1 and outcome.records_applied == 0
            assert db.get_identity(USERS[1]) == (Hlc(9), current.blob)  # never rolled back
        assert banned == ["stubborn"]  # ten useless sessions: 10 points, the threshold
    finally:
        db.close()


# --- time: the rate buckets and the idle timeout run on trio's clock ------------------------


async def _initiate_by_hand(
    frames: TrioFrames, replica: Replica, mock_clock: trio.testing.MockClock, pause_s: float
) -> tuple[int, str | None]:
    """Drive an initiator session by hand over ``frames``, moving trio's clock ``pause_s``
    before each frame it sends (no autojump: the node's worker threads stay out of it).
    Returns the frames sent, and the peer's ABORT (None: it did not abort)."""
    clock = Clock(10_000)
    session = SyncSession(SessionRole.INITIATOR, replica, now_ms=clock.wall_ms())
    out: bytes | None = session.start(clock.wall_ms())
    sent = 0
    try:
        while out is not None:
            mock_clock.jump(pause_s)
            await frames.write_frame(out)
            sent += 1
            if session.finished:
                break
            out = session.receive(await frames.read_frame(), clock.wall_ms())
    except RemoteProtocolError as exc:
        return sent, str(exc)
    return sent, None


async def _session_with_paced_peer(
    tmp_path: Path, mock_clock: trio.testing.MockClock, *, pause_s: float, frames_per_s: float
) -> tuple[SyncOutcome, int, str | None]:
    db = small_db(tmp_path / f"paced-{pause_s}")
    try:
        # more ids than a whole listing takes (WHOLE_LISTING_MAX): a descent, more frames
        seed(db, messages(0, 280))
        peer = MemoryReplica()
        assert peer.apply_ops([JOIN, *messages(20, 300)]).changed == 301
        left, right = trio.testing.memory_stream_pair()
        ours = service(DbReplica(db), Metrics(), timeout_s=10, frames_per_s=frames_per_s)
        async with trio.open_nursery() as nursery:
            outcomes: list[SyncOutcome] = []

            async def respond() -> None:
                outcomes.append(await ours.respond("peer", TrioFrames(right, MAX_FRAME)))

            nursery.start_soon(respond)
            sent, aborted = await _initiate_by_hand(
                TrioFrames(left, MAX_FRAME), peer, mock_clock, pause_s
            )
        return outcomes[0], sent, aborted
    finally:
        db.close()


async def test_a_peers_frame_rate_is_measured_on_trios_clock(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    """One frame per second (burst 2): a peer whose frames come 1.5 s apart on trio's clock
    is within its rate however fast the real machine runs them; sent at once, the third
    frame is over it. (The buckets once read ``time.monotonic`` and missed trio's clock.)"""
    paced, sent, aborted = await _session_with_paced_peer(
        tmp_path, mock_clock, pause_s=1.5, frames_per_s=1.0
    )
    assert paced.error is None and paced.converged and aborted is None
    assert sent > 2  # more frames than the burst allows at once
    hasty, sent, aborted = await _session_with_paced_peer(
        tmp_path, mock_clock, pause_s=0.0, frames_per_s=1.0
    )
    assert hasty.error == "rate_limited" and sent == 3
    assert aborted is not None and aborted.endswith(": rate_limited")  # the ABORT told us why


async def test_the_idle_timeout_is_measured_on_trios_clock(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    """The session's ``next_deadline()`` is when the syncer gives up: a peer that pauses 9 s
    between frames (idle timeout 10 s) is served to the end, though the session lasts longer
    than the timeout; a silent peer is dropped after exactly 10 s of trio's time."""
    slow, _, aborted = await _session_with_paced_peer(
        tmp_path, mock_clock, pause_s=9.0, frames_per_s=float("inf")
    )
    assert slow.error is None and slow.converged and aborted is None
    assert slow.duration_ms > 10_000
    mock_clock.autojump_threshold = 0  # nothing runs in a thread: the clock may jump
    db = small_db(tmp_path / "silent")
    try:
        left, _right = trio.testing.memory_stream_pair()  # nobody answers on the right
        started = trio.current_time()
        outcome = await service(DbReplica(db), Metrics(), timeout_s=10).initiate(
            "x", TrioFrames(left, MAX_FRAME)
        )
        assert outcome.error == "timeout"
        assert trio.current_time() - started == pytest.approx(10.0, abs=0.01)
    finally:
        db.close()


async def test_a_node_catching_up_from_three_peers_at_once_receives_each_record_once(
    tmp_path: Path,
) -> None:
    """Its sessions split the differing buckets (sync/claims.py): before, each of the three
    moved and verified every missing record."""
    dbs = [small_db(tmp_path / name) for name in ("behind", "p0", "p1", "p2")]
    try:
        seed(dbs[0], [])
        for db in dbs[1:]:
            seed(db, messages(0, 200))
        behind, *peers = [DbReplica(db) for db in dbs]
        metrics = Metrics()
        ours = service(behind, metrics)
        received = 0
        for _ in range(5):  # rounds of three concurrent sessions, until caught up
            outcomes: list[SyncOutcome] = []

            async def initiate(name: str, frames: TrioFrames, into: list[SyncOutcome]) -> None:
                into.append(await ours.initiate(name, frames))

            async with trio.open_nursery() as nursery:
                for i, peer in enumerate(peers):
                    left, right = trio.testing.memory_stream_pair()
                    theirs = service(peer, metrics)
                    nursery.start_soon(theirs.respond, "behind", TrioFrames(right, MAX_FRAME))
                    nursery.start_soon(initiate, f"p{i}", TrioFrames(left, MAX_FRAME), outcomes)
            assert all(o.error is None for o in outcomes)
            received += sum(o.records_received for o in outcomes)
            if behind.tree(Domain.MESSAGES) == peers[0].tree(Domain.MESSAGES):
                break
        assert behind.tree(Domain.MESSAGES).count == 200
        assert received == 200
        assert ours.claims.held() == 0
    finally:
        for db in dbs:
            db.close()


def test_a_session_that_moved_records_either_way_and_used_its_passes_has_more_to_do() -> None:
    def outcome(**fields: object) -> SyncOutcome:
        base: dict[str, object] = dict(
            peer="p", role="initiator", converged=False, error=None, started_ms=0,
            duration_ms=1.0, frames=10, bytes_sent=1, bytes_received=1, records_received=0,
            records_applied=0, passes=3, records_sent=0,
        )  # fmt: skip
        return SyncOutcome(**{**base, **fields})  # type: ignore[arg-type]

    assert outcome(records_received=5, records_applied=5).more_to_do(3)  # the node behind
    assert outcome(records_sent=5).more_to_do(3)  # the peer feeding it
    assert not outcome().more_to_do(3)  # nothing moved (records neither side accepts)
    assert not outcome(records_sent=5, passes=2).more_to_do(3)  # it ended on its own
    assert not outcome(records_sent=5, error="timeout").more_to_do(3)
