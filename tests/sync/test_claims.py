"""Sessions a replica runs at once split the differing buckets (sync/claims.py), and a side
that asks for many records paces its asks to the peer's outbox (sync/protocol.py).

A node that was down misses the same records at every peer and syncs with several at once:
without claims each session moved every missing record (4x the work with 4 peers).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from store.keys import bucket_of
from sync.claims import BucketClaims
from sync.frames import Domain
from sync.loopback import run_session
from sync.merkle import NUM_BUCKETS
from sync.protocol import SessionRole, SyncConfig, SyncSession
from sync.replica import MemoryReplica

from sync_support import engine, fill, message

MISSED = [message(n) for n in range(300)]


def test_a_bucket_is_taken_by_one_owner_until_it_releases_it() -> None:
    claims, a, b = BucketClaims(), object(), object()
    assert claims.take(a, Domain.MESSAGES, [1, 2, 3], 2, now_ms=0) == [1, 2]
    assert claims.take(b, Domain.MESSAGES, [1, 2, 3, 4], 10, now_ms=0) == [3, 4]
    assert claims.take(b, Domain.DELETES, [1], 10, now_ms=0) == [1]  # per domain
    assert claims.take(a, Domain.MESSAGES, [2, 4], 10, now_ms=0) == [2]  # its own stay its own
    assert claims.held() == 5
    claims.release(a)
    assert claims.take(b, Domain.MESSAGES, [1, 2, 3], 10, now_ms=0) == [1, 2, 3]
    claims.release(b)
    claims.release(b)  # twice: nothing left
    assert claims.held() == 0


def test_keeping_some_buckets_never_lets_another_owner_take_them_in_between() -> None:
    """A session whose sketch the peer decoded keeps the buckets the answer names and frees
    the rest of its region in one step. (It used to release all and take the named ones
    again: a session taking in between got them, and both moved their records — a node
    catching up from three peers received every record twice, now and then under load.)"""
    claims, a, b = BucketClaims(), object(), object()
    assert claims.take(a, Domain.MESSAGES, range(8), 8, now_ms=0) == list(range(8))
    assert claims.take(a, Domain.DELETES, [1, 2], 2, now_ms=0) == [1, 2]
    claims.keep_only(a, {Domain.MESSAGES: {2, 5}}, now_ms=10)
    assert claims.take(b, Domain.MESSAGES, range(8), 8, now_ms=10) == [0, 1, 3, 4, 6, 7]
    assert claims.take(b, Domain.DELETES, [1, 2], 2, now_ms=10) == [1, 2]  # not kept: freed
    assert claims.held() == 10
    claims.keep_only(a, {}, now_ms=10)  # nothing kept: a holds nothing
    assert claims.held() == 8 and not claims.others_hold(b)
    claims.release(a)  # after keep_only: nothing left to free, nothing of b's freed
    assert claims.held() == 8


def test_buckets_of_a_session_that_brings_nothing_for_stale_ms_go_to_the_next() -> None:
    """A stalled (or hostile) peer's session cannot keep a catch-up's buckets from others."""
    claims, stalled, honest = BucketClaims(stale_ms=5_000), object(), object()
    assert claims.take(stalled, Domain.MESSAGES, [1, 2], 10, now_ms=0) == [1, 2]
    claims.progress(stalled, now_ms=4_000)  # it brought records at 4 s
    assert claims.take(honest, Domain.MESSAGES, [1, 2, 3], 10, now_ms=9_000) == [3]
    assert claims.take(honest, Domain.MESSAGES, [1, 2, 3], 10, now_ms=9_001) == [1, 2, 3]
    claims.release(stalled)  # what it held is the honest one's now: untouched
    assert claims.take(stalled, Domain.MESSAGES, [1], 10, now_ms=9_002) == []
    claims.release(honest)
    assert claims.held() == 0


def _exchange(initiator: SyncSession, responder: SyncSession) -> Iterator[None]:
    """One session, a frame per step (so that several can interleave)."""
    frame: bytes | None = initiator.start(0)
    receiver, other = responder, initiator
    while frame is not None:
        yield
        frame = receiver.receive(frame, 0)
        receiver, other = other, receiver


def _interleaved(*exchanges: Iterator[None]) -> None:
    live = list(exchanges)
    while live:
        for exchange in list(live):
            if next(exchange, StopIteration) is StopIteration:
                live.remove(exchange)


def _catch_up(behind: MemoryReplica, peers: list[MemoryReplica], *, we_open: list[bool],
              claims: BucketClaims | None, ours: SyncConfig | None = None,
              theirs: SyncConfig | None = None) -> tuple[list[int], int]:  # fmt: skip
    """Rounds of concurrent sessions, ``behind`` with every peer, until it holds what they
    hold: (records ``behind`` received from each peer, rounds)."""
    received = [0] * len(peers)
    for rounds in range(1, 20):
        sessions = []
        exchanges = []
        for i, (peer, opens) in enumerate(zip(peers, we_open, strict=True)):
            role = SessionRole.INITIATOR if opens else SessionRole.RESPONDER
            mine = SyncSession(role, behind, now_ms=0, salt_seed=bytes([rounds, i]),
                               config=ours, claims=claims)  # fmt: skip
            other_role = SessionRole.RESPONDER if opens else SessionRole.INITIATOR
            peers_side = SyncSession(other_role, peer, now_ms=0, config=theirs,
                                     salt_seed=bytes([rounds, i, 1]),
                                     claims=BucketClaims())  # a node: its own  # fmt: skip
            pair = (mine, peers_side) if opens else (peers_side, mine)
            exchanges.append(_exchange(*pair))
            sessions.append(mine)
        _interleaved(*exchanges)
        received = [n + s.stats.records_received for n, s in zip(received, sessions, strict=True)]
        if set(behind.messages) == set(peers[0].messages):
            assert claims is None or claims.held() == 0  # every session gave its buckets back
            return received, rounds
    raise AssertionError("no catch-up in 20 rounds")


@pytest.mark.parametrize(
    "we_open", [[True, True, True], [False, False, False], [True, False, True]],
    ids=["we-open", "they-open", "mixed"],
)  # fmt: skip
def test_concurrent_sessions_move_each_missing_record_once(we_open: list[bool]) -> None:
    peers = [fill(engine(), MISSED) for _ in we_open]
    behind = engine()
    received, _ = _catch_up(behind, peers, we_open=we_open, claims=BucketClaims())
    assert sum(received) == len(MISSED)
    assert behind.tree(Domain.MESSAGES) == peers[0].tree(Domain.MESSAGES)


@pytest.mark.parametrize(
    "we_open", [[True, True, True], [True, False, True]], ids=["we-open", "mixed"]
)
def test_a_sketch_whose_records_take_several_frames_keeps_its_buckets_until_they_came(
    we_open: list[bool],
) -> None:
    """The peer that decoded our sketch pushes what we lack over several frames. Its first
    TRANSFER named only the buckets of its first frame's records, and the sketch's sender
    narrowed its claims to those: the rest of its region went to the other sessions, which
    then moved the same records the peer was still pushing (a catch-up of 200,000 received
    397,490 records). Narrowed once the peer has nothing left to push, each record comes once."""
    peers = [fill(engine(), MISSED) for _ in we_open]
    behind = engine()
    theirs = SyncConfig(max_record_bytes=4_000)  # 300 records: ~13 frames
    received, _ = _catch_up(behind, peers, we_open=we_open, claims=BucketClaims(), theirs=theirs)
    assert sum(received) == len(MISSED)
    assert behind.tree(Domain.MESSAGES) == peers[0].tree(Domain.MESSAGES)


def test_a_catch_up_over_more_leaves_than_a_pass_reconciles_is_split_by_cells() -> None:
    """A catch-up (more differing leaves than ``max_cells``) takes the cells path, whose
    passes the sessions split by ``max_cells`` leaves at a time: each peer moves a share.
    One sketch of the whole region would be moved by its sender's session alone."""
    peers = [fill(engine(), MISSED) for _ in range(3)]
    behind = engine()
    config = SyncConfig(max_cells=64)  # 300 records in ~300 leaves
    received, _ = _catch_up(behind, peers, we_open=[True] * 3, claims=BucketClaims(),
                            ours=config, theirs=config)  # fmt: skip
    assert sum(received) == len(MISSED)
    assert all(received), received  # every peer moved a share
    assert behind.tree(Domain.MESSAGES) == peers[0].tree(Domain.MESSAGES)


def test_peers_opening_sessions_with_a_node_that_catches_up_name_different_leaves() -> None:
    """Each peer's session sends cells for ``max_cells`` of the differing leaves. All named
    the lowest ones, so the node's responder sides found them held by its first session
    and moved nothing until the peers' next sessions; from where each pass's salt points,
    every peer moves a share at once."""
    peers = [fill(engine(), MISSED) for _ in range(3)]
    behind = engine()
    config = SyncConfig(max_cells=64)
    received, _ = _catch_up(behind, peers, we_open=[False] * 3, claims=BucketClaims(),
                            ours=config, theirs=config)  # fmt: skip
    assert sum(received) == len(MISSED)
    assert all(received), received


@pytest.mark.parametrize("we_open", [True, False], ids=["we-open", "they-open"])
def test_a_session_whose_differences_other_sessions_hold_stops_above_them(we_open: bool) -> None:
    """Another session of ours holds every bucket that differs: this one would leave them
    all to it at the leaves. It descended the whole tree to find that (in a catch-up of
    200,000, 263-675 kB of leaf hashes and ~1.3 s a session, three or four passes); it now
    stops where every bucket under a differing node is held, and ends after that pass.
    Once the buckets are free again, a session moves every record: nothing was lost."""
    claims = BucketClaims()
    busy = object()  # the session that catches up, live (not stale at now_ms=0)
    claims.take(busy, Domain.MESSAGES, range(NUM_BUCKETS), NUM_BUCKETS, now_ms=0)
    behind, peer = engine(), fill(engine(), MISSED)
    config = SyncConfig(max_cells=64)  # a catch-up: the cells path
    mine = _one_session(behind, peer, we_open, claims, config)
    assert mine.stats.records_received == 0
    assert mine.stats.passes == 2  # the pass, then its closing HELLO (we open: 4 before)
    assert mine.stats.bytes_sent["tree"] < 2_000  # 21,906 (we open), 19,762 (they open) before
    claims.release(busy)
    received = 0
    for _ in range(5):
        if behind.tree(Domain.MESSAGES) == peer.tree(Domain.MESSAGES):
            break
        received += _one_session(behind, peer, we_open, claims, config).stats.records_received
    assert received == len(MISSED)  # each once, in 2 sessions of 3 passes of 64 leaves
    assert behind.tree(Domain.MESSAGES) == peer.tree(Domain.MESSAGES)


@pytest.mark.parametrize("we_open", [True, False], ids=["we-open", "they-open"])
def test_a_session_stops_above_only_the_nodes_whose_every_bucket_another_session_holds(
    we_open: bool,
) -> None:
    """Another session holds the lower half of the buckets: this one leaves exactly the nodes
    under that half (where one bucket in them is free, it descends) — it moves every missing
    record of the upper half and none of the lower, and hashes only the upper half's
    subtrees (the pruning above, ``_not_held_elsewhere``, decides by each node's buckets)."""
    half = NUM_BUCKETS // 2
    upper = [m for m in MISSED if bucket_of(m.msg_id) >= half]
    config = SyncConfig(max_cells=64, sketch=False)  # the descent to the leaves, every level
    lone = max(b for b in map(bucket_of, (m.msg_id for m in MISSED)) if b < half)
    but_one = [b for b in range(half) if b != lone]  # a missed record's bucket left free
    tree_bytes = {}
    for held in (range(0), range(half), but_one):  # none, the lower half, all of it but one
        claims = BucketClaims()
        busy = object()  # a live session of ours (not stale at now_ms=0)
        claims.take(busy, Domain.MESSAGES, held, NUM_BUCKETS, now_ms=0)
        behind, peer = engine(), fill(engine(), MISSED)
        first = _one_session(behind, peer, we_open, claims, config)
        tree_bytes[len(held)] = first.stats.bytes_sent["tree"]
        received = first.stats.records_received
        for _ in range(5):  # the free buckets' records, 64 leaves a pass
            more = _one_session(behind, peer, we_open, claims, config).stats.records_received
            received += more
            if not more:
                break
        got = set(behind.record_ids(Domain.MESSAGES))
        free = [m for m in MISSED if bucket_of(m.msg_id) not in held]
        assert got == {m.msg_id for m in free}, len(held)  # all the free ones, none held
        assert received == len(free)
    assert 0 < len(upper) < len(MISSED)  # (both halves hold some missed records)
    # the lower half's nodes left above the leaves: about half the tree's hashes
    assert tree_bytes[half] < 0.7 * tree_bytes[0], tree_bytes
    # one free, differing bucket under the lower half: the nodes above it are descended
    assert tree_bytes[half - 1] > tree_bytes[half], tree_bytes


def _one_session(behind: MemoryReplica, peer: MemoryReplica, we_open: bool,
                 claims: BucketClaims, config: SyncConfig) -> SyncSession:  # fmt: skip
    """One whole session of ``behind`` (with ``claims``) and ``peer``: ``behind``'s side."""
    ours, theirs = (SessionRole.INITIATOR, SessionRole.RESPONDER)[:: 1 if we_open else -1]
    mine = SyncSession(ours, behind, now_ms=0, salt_seed=b"a", config=config, claims=claims)
    other = SyncSession(theirs, peer, now_ms=0, salt_seed=b"b", config=config,
                        claims=BucketClaims())  # fmt: skip
    _interleaved(_exchange(*((mine, other) if we_open else (other, mine))))
    return mine


def test_without_claims_concurrent_sessions_move_the_same_records_again() -> None:
    """The cost the claims remove (and what makes the test above able to fail)."""
    peers = [fill(engine(), MISSED) for _ in range(3)]
    received, _ = _catch_up(engine(), peers, we_open=[True] * 3, claims=None)
    assert received == [len(MISSED)] * 3


def test_a_session_that_dies_gives_its_buckets_back() -> None:
    claims = BucketClaims()
    behind, peer = engine(), fill(engine(), MISSED)
    mine = SyncSession(SessionRole.INITIATOR, behind, now_ms=0, salt_seed=b"x", claims=claims)
    theirs = SyncSession(SessionRole.RESPONDER, peer, now_ms=0)
    frame = mine.start(0)
    for _ in range(3):  # until we claim: our SKETCH (or, with cells, our CELLS)
        frame = mine.receive(theirs.receive(frame, 0) or b"", 0)
        if claims.held():
            break
    assert claims.held() > 0
    assert mine.handle_timeout(10**9) is not None  # the peer went silent
    assert claims.held() == 0


def test_a_catch_up_larger_than_the_peers_outbox_paces_its_asks() -> None:
    """The empty responder names every missing id (pure cells) and used to ask for them all
    in one frame: over the peer's max_outbox, the peer ended the session (too_many_items),
    as a 1,000,000-record catch-up did with the default limits. Now it keeps at most
    max_outbox / 2 asks unanswered."""
    full = fill(engine(), MISSED)
    behind = engine()
    config = SyncConfig(max_outbox=40)
    result = run_session(full, behind, config=config)
    assert result.converged and set(behind.messages) == set(full.messages)
    assert result.responder.stats.records_received == len(MISSED)
