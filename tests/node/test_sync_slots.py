"""Session slots: one session per peer, several peers at once, refusals and stalls charged.

Memory streams on trio's ``MockClock``, moved by hand (no autojump: a session's worker
threads must not let the clock run past an honest peer's deadline)."""

from __future__ import annotations

import random
from pathlib import Path

import trio
import trio.testing

from node.clock import Clock
from node.framing import TrioFrames
from node.metrics import Metrics
from node.penalties import Blocklist, PeerJudge, PeerPenalties
from node.sync_slots import BUSY, CROSSED, DUPLICATE, SessionSlots, SlotStats
from node.syncer import SyncOutcome, SyncService
from store.ops import Op
from sync.frames import Abort, Domain, decode_frame
from sync.merkle import MerkleTree
from sync.protocol import SyncConfig
from sync.replica import DbReplica, MemoryReplica

from node_support import JOIN, add, messages, small_db, store_directly

MAX_FRAME = 1 << 22
IDLE = SyncConfig(idle_timeout_ms=5_000)


def test_slots_one_per_peer_and_a_cap_per_direction() -> None:
    slots = SessionSlots(per_direction=2)
    assert slots.claim("a", "responder") is None
    assert slots.claim("a", "responder") == DUPLICATE
    assert slots.claim("a", "initiator") == DUPLICATE  # inbound or outbound: one slot
    assert slots.claim("b", "responder") is None
    assert slots.claim("c", "responder") == BUSY  # the answering side is full ...
    assert slots.claim("c", "initiator") is None  # ... the sessions we open are not
    slots.release("a", "responder")
    assert slots.claim("a", "initiator") is None
    assert slots.statistics().active == 3


def test_a_crossing_is_broken_by_peer_id_the_same_way_at_both_ends() -> None:
    """Both open at once: the lower id's session runs, the higher id's is refused (counted
    as a crossing: not charged) at whichever end notices first. Without our id there is no
    tie-break. (Both ends claiming their own opening after answering the other's: the
    lockstep that kept two idle nodes from ever syncing at the same interval.)"""
    low, high = SessionSlots(per_direction=2, own="A"), SessionSlots(per_direction=2, own="B")
    assert low.claim("B", "initiator") is None and high.claim("A", "initiator") is None
    assert low.claim("B", "responder") == CROSSED  # ours (A's) wins
    assert high.claim("A", "responder") is None  # B answers A's beside its own opening
    assert high.statistics() == SlotStats(active=1, initiator=1, responder=1)
    assert high.claim("A", "responder") == DUPLICATE  # once: a second stream is a probe
    assert high.claim("C", "initiator") is None and high.claim("C", "initiator") == DUPLICATE
    high.release("A", "initiator")  # B's opening ended (A refused it)
    assert high.claim("A", "initiator") == CROSSED  # A's session runs: B opens none beside it
    # the other order: each answers the other's stream first, then claims its own opening
    low, high = SessionSlots(per_direction=2, own="A"), SessionSlots(per_direction=2, own="B")
    assert low.claim("B", "responder") is None and high.claim("A", "responder") is None
    assert high.claim("A", "initiator") == CROSSED  # B's opening yields ...
    assert low.claim("B", "initiator") is None  # ... A's runs beside the one B gives up
    plain = SessionSlots(per_direction=2)
    assert plain.claim("B", "initiator") is None
    assert plain.claim("B", "responder") == DUPLICATE


def _node(db_path: Path, judge: PeerJudge | None = None) -> tuple[SyncService, list[SyncOutcome]]:
    outcomes: list[SyncOutcome] = []

    def ended(outcome: SyncOutcome) -> None:
        outcomes.append(outcome)
        if judge is not None:
            judge.sync_ended(outcome)

    db = small_db(db_path)
    replica = DbReplica(db)
    service = SyncService(
        replica,
        store_directly(replica),
        Metrics(),
        clock=Clock(10_000),
        config=IDLE,
        on_outcome=ended,
    )
    return service, outcomes


def _honest_peer(ops: list[Op]) -> SyncService:
    replica = MemoryReplica()
    replica.apply_ops(ops)
    return SyncService(
        replica, store_directly(replica), Metrics(), clock=Clock(10_000), config=IDLE
    )


async def _sync(initiator: SyncService, responder: SyncService, names: tuple[str, str]) -> None:
    left, right = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(responder.respond, names[0], TrioFrames(right, MAX_FRAME))
        await initiator.initiate(names[1], TrioFrames(left, MAX_FRAME))


async def test_a_silent_peer_holds_its_own_slot_and_nobody_elses(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    ours, outcomes = _node(tmp_path / "a")
    try:
        silent, _ = trio.testing.memory_stream_pair()  # the peer's end: it never writes
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ours.respond, "evil", TrioFrames(silent, MAX_FRAME))
            await trio.testing.wait_all_tasks_blocked()
            # the same peer again: refused at once, and told why
            probe, mine = trio.testing.memory_stream_pair()
            refused = await ours.respond("evil", TrioFrames(mine, MAX_FRAME))
            assert refused.error == DUPLICATE
            abort = decode_frame(
                await TrioFrames(probe, MAX_FRAME).read_frame(), max_frame=1 << 10, max_ids=1
            )
            assert abort == Abort(DUPLICATE)
            assert not ours.may_initiate("evil")  # nor do we open one with it
            # an honest peer is served meanwhile, without the clock moving at all
            started = trio.current_time()
            await _sync(_honest_peer([JOIN, *messages(0, 30)]), ours, ("good", "node"))
            assert trio.current_time() == started
            assert ours.replica.tree(Domain.MESSAGES).count == 30
            mock_clock.jump(IDLE.idle_timeout_ms / 1000 + 0.1)  # the silent one times out
        by_peer = {(o.peer, o.error) for o in outcomes}
        assert by_peer == {("evil", DUPLICATE), ("good", None), ("evil", "timeout")}
        assert ours.slots.statistics().active == 0
    finally:
        ours.replica.db.close()  # type: ignore[attr-defined]


async def test_stalls_oversize_prefixes_and_duplicate_probes_add_up_to_a_ban(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    """Timeout 2 points, oversize prefix 3, duplicate session 1 (SECURITY.md): two stalls,
    one oversize prefix and three probes during a stall reach the threshold of 10."""
    penalties, blocklist = PeerPenalties(threshold=10, decay_per_s=0.0), Blocklist()
    metrics = Metrics()
    judge = PeerJudge(penalties, blocklist, metrics, Clock(10_000))
    ours, outcomes = _node(tmp_path / "a", judge)
    try:
        big, mine = trio.testing.memory_stream_pair()
        await big.send_all((MAX_FRAME + 1).to_bytes(4, "big"))
        await ours.respond("evil", TrioFrames(mine, MAX_FRAME))  # 3
        for stall in range(2):
            silent, _ = trio.testing.memory_stream_pair()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ours.respond, "evil", TrioFrames(silent, MAX_FRAME))
                await trio.testing.wait_all_tasks_blocked()
                for _ in range(3 if stall else 0):  # 3 x 1
                    _probe, mine = trio.testing.memory_stream_pair()
                    await ours.respond("evil", TrioFrames(mine, MAX_FRAME))
                assert "evil" not in blocklist
                mock_clock.jump(IDLE.idle_timeout_ms / 1000 + 0.1)  # 2 each
        errors = [o.error for o in outcomes]
        assert errors == ["oversize_frame", "timeout", DUPLICATE, DUPLICATE, DUPLICATE, "timeout"]
        assert "evil" in blocklist
        assert metrics.counter("peers_banned") == 1
    finally:
        ours.replica.db.close()  # type: ignore[attr-defined]


async def test_concurrent_sessions_with_several_peers_leave_trees_equal_to_a_rebuild(
    tmp_path: Path,
) -> None:
    """Four peers holding overlapping records sync with one node at once, in both
    directions; the node's trees then equal trees rebuilt from its RocksDB, and it holds
    the union. No session is charged for records another one applied first."""
    rnd = random.Random(19)
    pool: list[Op] = [*messages(0, 80), *messages(0, 40, author=1)]
    ours, outcomes = _node(tmp_path / "node")
    try:
        peers = [_honest_peer([JOIN, add(1, 2), *rnd.sample(pool, 60)]) for _ in range(4)]
        async with trio.open_nursery() as nursery:
            for n, peer in enumerate(peers):
                if n % 2:
                    nursery.start_soon(_sync, peer, ours, (f"p{n}", "node"))
                else:
                    nursery.start_soon(_sync, ours, peer, ("node", f"p{n}"))
        db = ours.replica.db  # type: ignore[attr-defined]
        rebuilt = {
            Domain.MESSAGES: MerkleTree.from_ids(i for i, _ in db.iter_msg_ids()),
            Domain.MEMBERS: MerkleTree.from_ids(db.iter_member_record_ids()),
            Domain.IDENTITY: MerkleTree.from_ids(db.iter_identity_record_ids()),
            Domain.DELETES: MerkleTree.from_ids(db.iter_delete_ids()),
        }
        for domain, tree in rebuilt.items():
            assert ours.replica.tree(domain).root() == tree.root(), domain
        union = {m.msg_id for peer in peers for m in peer.replica.messages.values()}  # type: ignore[attr-defined]
        assert {i for i, _ in db.iter_msg_ids()} == union
        assert all(o.error is None for o in outcomes)
        assert not any(o.useless for o in outcomes)
    finally:
        ours.replica.db.close()  # type: ignore[attr-defined]
