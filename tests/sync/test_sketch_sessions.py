"""Sessions that reconcile with sketches (sync/protocol.py, sync/sketch.py), against hostile
data and hostile peers: ids ground into one bucket, short ids forced to collide, a peer that
lies in its sketch. Each converges, or ends the session with a reason, within bounded frames.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

import blake3
import numpy as np
import pytest

from store.keys import RECORD_ID_LEN, bucket_of
from sync.errors import RemoteProtocolError
from sync.frames import (
    SALT_LEN,
    Domain,
    Done,
    Frame,
    Nodes,
    Sketches,
    SketchSection,
    Transfer,
    TransferSection,
    decode_frame,
    encode_frame,
)
from sync.loopback import run_session
from sync.merkle import MerkleTree, children
from sync.protocol import (
    MIN_DESCENT_BITS,
    SessionRole,
    State,
    SyncConfig,
    SyncSession,
    descent_bits,
)
from sync.replica import MemoryReplica
from sync.scope import EVERYTHING, Scope
from sync.sketch import SketchKey, cell_len, short_id

from sync_support import Wire, advance, engine, fill, message

INIT, RESP = SessionRole.INITIATOR, SessionRole.RESPONDER
SKETCHES = SyncConfig(listings=False)  # sketches as such: no listing stands in for a small one
PAIR = (235, 247)  # two messages of sync_support's universe in one bucket (44481)
GROUND = bucket_of(message(PAIR[0]).msg_id)


class GroundReplica(MemoryReplica):
    """A replica that also lists ``phantoms``: ids ground into one bucket by an attacker who
    can author records (their bodies do not matter here: both sides hold them)."""

    def __init__(self, phantoms: list[bytes]) -> None:
        super().__init__(admit_all=True)
        self.phantoms = phantoms
        self.trees[Domain.MESSAGES] = MerkleTree.from_ids(phantoms)

    def bucket_ids(
        self, domain: Domain, bucket: int, cutoff_ms: int | None, scope: Scope = EVERYTHING
    ) -> list[bytes]:
        ids = super().bucket_ids(domain, bucket, cutoff_ms, scope)
        if domain is Domain.MESSAGES:
            ids = sorted(ids + [p for p in self.phantoms if bucket_of(p) == bucket])
        return ids

    def ids_in_range(
        self, domain: Domain, start: int, end: int, cutoff_ms: int | None, scope: Scope = EVERYTHING
    ) -> bytes:
        ids = super().ids_in_range(domain, start, end, cutoff_ms, scope)
        if domain is Domain.MESSAGES:
            ids += b"".join(p for p in self.phantoms if start <= bucket_of(p) < end)
        return ids


def phantoms(count: int, bucket: int = GROUND, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [bucket.to_bytes(2, "big") + rng.randbytes(RECORD_ID_LEN - 2) for _ in range(count)]


def pair_of_ground_replicas(count: int) -> tuple[GroundReplica, GroundReplica]:
    ground = phantoms(count)
    a = fill(GroundReplica(ground), [message(PAIR[0]), *(message(n) for n in range(0, 20))])
    b = fill(GroundReplica(ground), [message(PAIR[1]), *(message(n) for n in range(10, 30))])
    assert isinstance(a, GroundReplica) and isinstance(b, GroundReplica)
    return a, b


def test_ids_ground_into_one_bucket_cost_their_bucket_nothing_per_id() -> None:
    """3,000 ids in one bucket: the cells path lists (a sample of) them; a sketch's cost does
    not depend on how full a bucket is, only on the difference."""
    a, b = pair_of_ground_replicas(3_000)
    wire = Wire()
    result = run_session(a, b, on_frame=wire)
    assert result.converged and set(a.messages) == set(b.messages)
    assert message(PAIR[1]).msg_id in a.messages and message(PAIR[0]).msg_id in b.messages
    stats = result.initiator.stats
    assert stats.reconciliation_bytes() < 2_500  # d = 22; 3,000 8-byte prefixes would be 24 kB
    assert stats.round_trips <= 3


def test_short_ids_forced_to_collide_with_ground_ids_still_move_every_record() -> None:
    """Three-byte short ids leave 8 salted bits in a bucket: 3,000 ids there take every value,
    so the differing records' short ids collide with ground ones. The side holding both pushes
    every id with the asked short id; a ground id has no record to push (the store has none)."""
    a, b = pair_of_ground_replicas(3_000)
    tiny = SyncConfig(short_id_bytes=3)
    key = SketchKey.derive(bytes(SALT_LEN), int(Domain.MESSAGES), 3)
    assert len({short_id(key, p) for p in a.phantoms}) == 256  # every value taken
    result = run_session(a, b, config=tiny)
    assert result.converged and set(a.messages) == set(b.messages)


def _colliding_seed(x: bytes, y: bytes, width: int) -> bytes:
    """A session salt seed whose first pass gives ``x`` and ``y`` the same short id."""
    for n in range(100_000):
        seed = b"collide:%d" % n
        salt = blake3.blake3(seed + (1).to_bytes(2, "big")).digest(SALT_LEN)
        key = SketchKey.derive(salt, int(Domain.MESSAGES), width)
        if short_id(key, x) == short_id(key, y):
            return seed
    raise AssertionError("no colliding salt found")


def test_a_collision_across_sides_hides_the_difference_for_one_pass_only() -> None:
    """I holds x, R holds y, and the pass's short ids of x and y are equal: the sketches cancel,
    the pass moves nothing, and the next pass's fresh salt separates them."""
    x, y = message(PAIR[0]), message(PAIR[1])
    a, b = fill(engine(), [x, message(1), message(2)]), fill(engine(), [y, message(1), message(2)])
    tiny = SyncConfig(short_id_bytes=3, max_passes=4, listings=False)
    seed = _colliding_seed(x.msg_id, y.msg_id, 3)
    wire = Wire()
    result = run_session(a, b, config=tiny, salt_seed=seed, on_frame=wire)
    assert result.converged and set(a.messages) == set(b.messages) == {
        x.msg_id,
        y.msg_id,
        message(1).msg_id,
        message(2).msg_id,
    }
    assert result.initiator.stats.passes >= 3  # the hidden pass, the one that moves, the close


# --- a peer that lies ---------------------------------------------------------------------------


def _drive(
    initiator: SyncSession, responder: SyncSession, lie: Callable[[Frame], Frame]
) -> tuple[int, int, str | None]:
    """Run a session whose initiator's frames pass through ``lie``: (frames, largest frame,
    the honest side's error reason or None)."""
    frame: bytes | None = encode_frame(lie(decoded(initiator.start(0))))
    frames, largest = 1, len(frame)
    while frame is not None:
        try:
            reply = responder.receive(frame, 0)
        except RemoteProtocolError as exc:
            return frames, largest, exc.reason
        frames += 1
        if reply is None:
            return frames, largest, None
        largest = max(largest, len(reply))
        try:
            mine = initiator.receive(reply, 0)
        except RemoteProtocolError as exc:
            return frames, largest, "liar:" + exc.reason
        frame = None if mine is None else encode_frame(lie(decoded(mine)))
        frames += frame is not None
    return frames, largest, None


def decoded(data: bytes) -> Frame:
    return decode_frame(data, max_frame=1 << 26, max_ids=1 << 20)


def _garbled(rng: random.Random) -> Callable[[Frame], Frame]:
    """A liar: every sketch it sends is random bytes of the announced size."""

    def lie(frame: Frame) -> Frame:
        if not isinstance(frame, Sketches):
            return frame
        sections = {
            d: replace(s, blob=rng.randbytes(len(s.blob))) for d, s in frame.sections.items()
        }
        return Sketches(sections, frame.answer)

    return lie


@pytest.mark.parametrize("seed", range(4))
def test_a_peer_that_lies_in_its_sketch_ends_within_bounded_frames(seed: int) -> None:
    a = fill(engine(), [message(n) for n in range(0, 60)])
    b = fill(engine(), [message(n) for n in range(30, 90)])
    config = SyncConfig()
    liar = SyncSession(INIT, a, now_ms=0, salt_seed=b"liar%d" % seed, config=config)
    honest = SyncSession(RESP, b, now_ms=0, config=config)
    frames, largest, error = _drive(liar, honest, _garbled(random.Random(seed)))
    # per pass at most: HELLO, NODES, SKETCH, an answer, then transfer frames; 3 passes
    assert frames <= 40
    assert largest <= config.max_frame
    assert honest.finished or error is not None
    if honest.converged:  # the honest side's answer let the liar decode: converged for real
        assert set(a.messages) == set(b.messages)


def test_a_sketch_over_max_sketch_cells_is_refused() -> None:
    a = fill(engine(), [message(n) for n in range(0, 30)])
    b = fill(engine(), [message(n) for n in range(20, 50)])
    i = SyncSession(INIT, a, now_ms=0, salt_seed=b"big", config=SKETCHES)
    r = SyncSession(RESP, b, now_ms=0, config=SyncConfig(max_sketch_cells=30, listings=False))
    session, frame = advance(i, r, State.AWAIT_MIDDLE, RESP)
    sketch = decoded(frame)
    assert isinstance(sketch, Sketches)
    assert sketch.sections[Domain.MESSAGES].cells > 30  # the initiator's own limit is larger
    with pytest.raises(RemoteProtocolError) as info:
        session.receive(frame, 0)
    assert info.value.reason == "bad_cells"


def test_an_answer_nobody_asked_for_and_short_wants_outside_a_sketch_are_refused() -> None:
    a = fill(engine(), [message(n) for n in range(0, 30)])
    b = fill(engine(), [message(n) for n in range(20, 50)])
    i = SyncSession(INIT, a, now_ms=0, salt_seed=b"x", config=SKETCHES)
    r = SyncSession(RESP, b, now_ms=0, config=SKETCHES)
    session, frame = advance(i, r, State.AWAIT_MIDDLE, RESP)
    honest = decoded(frame)
    assert isinstance(honest, Sketches)
    with pytest.raises(RemoteProtocolError) as info:
        session.receive(encode_frame(Sketches(honest.sections, answer=True)), 0)
    assert info.value.reason == "unexpected_frame"
    cells = SyncConfig(sketch=False)  # a cells pass: no region, so no short wants
    i = SyncSession(INIT, a, now_ms=0, salt_seed=b"y", config=cells)
    r = SyncSession(RESP, b, now_ms=0, config=cells)
    session, _ = advance(i, r, State.TRANSFER, INIT)
    asks = Transfer(False, {Domain.MESSAGES: TransferSection(short_wants=bytes(6))})
    with pytest.raises(RemoteProtocolError) as info:
        session.receive(encode_frame(asks), 0)
    assert info.value.reason == "unsolicited"


def test_an_undersized_sketch_is_answered_once_with_a_larger_one() -> None:
    """The initiator's sketch is capped below the difference: the responder cannot decode it
    and answers with its own, twice as large; the initiator decodes that and both converge."""
    a = fill(engine(), [message(n) for n in range(0, 10)])
    b = fill(engine(), [message(n) for n in range(4, 12)])  # d = 6
    small = SyncConfig(max_sketch_cells=8, listings=False)
    wire = Wire()
    result = run_session(a, b, config=small, responder_config=SKETCHES, on_frame=wire)
    assert result.converged and set(a.messages) == set(b.messages)
    sketches = [(s, f) for s, f in wire.frames if isinstance(f, Sketches)]
    assert [(s, f.answer) for s, f in sketches][:2] == [("initiator", False), ("responder", True)]
    first, answer = sketches[0][1], sketches[1][1]
    assert answer.sections[Domain.MESSAGES].cells == 2 * first.sections[Domain.MESSAGES].cells


def test_a_difference_in_one_id_range_converges_after_the_sketch_fails() -> None:
    """The responder lacks the 500 lowest ids of 3,000 (what a waiting room that evicted the
    first of a catch-up leaves: a session moves buckets in id order). The share of equal
    top nodes sizes a sketch for ~60 ids; it and the answer twice its size fail — before,
    every pass and every session alike, and the two never converged (a real node stalled at
    8,332 of 10,000). After a failed sketch the session descends to the leaves' cells."""
    held = [message(n) for n in range(3_000)]
    lowest = set(sorted(m.msg_id for m in held)[:500])
    a = fill(engine(), held)
    b = fill(engine(), [m for m in held if m.msg_id not in lowest])
    wire = Wire()
    # with a retention cutoff, as a node has: a sketch pass that moved nothing was final
    cutoff = SyncConfig(cutoff_ms=1, listings=False)
    result = run_session(a, b, config=cutoff, responder_config=cutoff, on_frame=wire)
    assert result.converged and set(a.messages) == set(b.messages)
    kinds = [type(f).__name__ for _, f in wire.frames]
    assert "Sketches" in kinds and "Cells" in kinds[kinds.index("Sketches") :]
    assert len(wire.frames) <= 20


def test_a_cap_that_is_no_whole_number_of_cells_a_hash_is_rounded_down() -> None:
    """``max_sketch_cells`` = 30 with four cells an id: sketches of at most 28 cells, never a
    local error for a size no sketch can have."""
    a = fill(engine(), [message(n) for n in range(0, 16)])
    b = fill(engine(), [message(n) for n in range(10, 20)])  # d = 14: 32 cells, capped
    capped = SyncConfig(max_sketch_cells=30)
    wire = Wire()
    result = run_session(a, b, config=capped, on_frame=wire)
    assert result.converged and set(a.messages) == set(b.messages)
    cells = [
        s.cells for _, f in wire.frames if isinstance(f, Sketches) for s in f.sections.values()
    ]
    assert cells and all(c <= 28 and c % 4 == 0 for c in cells)


def test_a_request_for_the_peers_sketch_is_answered_at_the_size_asked() -> None:
    """A sender whose buckets another session holds asks for the peer's sketch (an empty
    blob) and decodes it itself; the answer keeps the region and the size."""
    a = fill(engine(), [message(n) for n in range(0, 30)])
    b = fill(engine(), [message(n) for n in range(20, 50)])
    i = SyncSession(INIT, a, now_ms=0, salt_seed=b"req", config=SKETCHES)
    r = SyncSession(RESP, b, now_ms=0, config=SKETCHES)
    session, frame = advance(i, r, State.AWAIT_MIDDLE, RESP)
    sketch = decoded(frame)
    assert isinstance(sketch, Sketches)
    section = sketch.sections[Domain.MESSAGES]
    request = Sketches({Domain.MESSAGES: SketchSection(section.flags, 32, section.width, b"")})
    answer = decoded(session.receive(encode_frame(request), 0) or b"")
    assert isinstance(answer, Sketches) and answer.answer
    got = answer.sections[Domain.MESSAGES]
    assert got.cells == 32 and len(got.blob) == 32 * cell_len(section.width) and not got.flags
    assert session.state is State.AWAIT_DECODE


@pytest.mark.parametrize("seed", range(6))
def test_a_descent_to_depth_3_sketches_less_and_closes_in_three_round_trips(seed: int) -> None:
    """The initiator descends from depth 2 (as at n = 10^6, where each depth-3 node holds
    ~244 ids: here ``descend_above`` is scaled down to ~320 ids) with depth-3 hashes cut to
    ``descent_bits`` (16 bits a child of each differing node here); the responder sketches the
    differing depth-3 nodes, the initiator decodes, the responder's last TRANSFER carries its
    roots and the initiator ends with a one-way DONE: 3 round trips."""
    rng = random.Random(seed)
    universe = list(range(400))
    a = fill(engine(), [message(n) for n in universe if rng.random() < 0.8])
    b = fill(engine(), [message(n) for n in universe if rng.random() < 0.8])
    config = SyncConfig(descend_above=0.02)  # 320 ids: 0.08 a depth-3 node, 0.005 a leaf
    wire = Wire()
    result = run_session(a, b, config=config, salt_seed=b"descent%d" % seed, on_frame=wire)
    assert result.converged and set(a.messages) == set(b.messages)
    if result.initiator.stats.passes == 1:  # no hash or short-id collision hid a difference
        assert wire.frames[-1] == ("initiator", Done(True))
        assert result.initiator.stats.round_trips <= 4  # 3 unless an answer sketch was needed
    sender, depth3 = wire.frames[2]
    assert sender == "initiator" and isinstance(depth3, Nodes)
    flags, hashes = depth3.sections[Domain.MESSAGES]
    differing = sum(bin(byte).count("1") for byte in flags)  # of the 256 depth-2 nodes
    bits = descent_bits(256, differing)
    assert MIN_DESCENT_BITS <= bits < 32
    assert len(hashes) == 16 * differing * bits // 8  # 16 children each, packed
    again = run_session(a, b, config=config, salt_seed=b"again%d" % seed)
    assert again.converged and again.initiator.stats.round_trips == 1


DESCENDS = SyncConfig(descend_above=0.02)  # the initiator sends narrowed depth-3 hashes


def _depth3(seed: bytes) -> tuple[SyncSession, Nodes]:
    """The responder, about to read the initiator's narrowed depth-3 hashes, and that frame."""
    a = fill(engine(), [message(n) for n in range(0, 300)])
    b = fill(engine(), [message(n) for n in range(20, 320)])
    i = SyncSession(INIT, a, now_ms=0, salt_seed=seed, config=DESCENDS)
    r = SyncSession(RESP, b, now_ms=0, config=DESCENDS)
    session, frame = advance(i, r, State.AWAIT_MIDDLE, RESP)
    nodes = decoded(frame)
    assert isinstance(nodes, Nodes)
    return session, nodes


@pytest.mark.parametrize(
    "cut",
    [
        lambda h, k: h[: k // 2],  # 8 bits a hash: below MIN_DESCENT_BITS
        lambda h, k: h + b"\0",  # no whole number of bits a hash
        lambda h, k: h[:-1],
        lambda h, k: bytes(5 * k),  # wider than the pass's 4-byte hashes
        lambda h, k: b"",
    ],
    ids=["8-bits", "one-more-byte", "one-less-byte", "40-bits", "empty"],
)
def test_narrowed_depth3_hashes_of_no_allowed_width_are_refused(
    cut: Callable[[bytes, int], bytes],
) -> None:
    """The receiver tells the width by the length (16 children a flagged node, so a whole
    number of bits each): anything from 16 bits to the pass's width, nothing else."""
    session, nodes = _depth3(b"narrow")
    flags, hashes = nodes.sections[Domain.MESSAGES]
    count = 16 * sum(bin(byte).count("1") for byte in flags)
    lied = Nodes({Domain.MESSAGES: (flags, cut(hashes, count))})
    with pytest.raises(RemoteProtocolError) as info:
        session.receive(encode_frame(lied), 0)
    assert info.value.reason == "bad_hashes"


def test_depth3_hashes_that_collide_on_purpose_hide_nothing_for_good() -> None:
    """A liar whose depth-3 hashes copy the responder's (every node looks equal): its
    sketch region is empty, the roots still differ at every close, and the honest side ends
    after ``max_passes`` with DONE(False) — bounded frames, never a false convergence."""
    a = fill(engine(), [message(n) for n in range(0, 300)])
    b = fill(engine(), [message(n) for n in range(20, 320)])
    liar = SyncSession(INIT, a, now_ms=0, salt_seed=b"copycat", config=DESCENDS)
    honest = SyncSession(RESP, b, now_ms=0, config=DESCENDS)
    copied = 0

    def lie(frame: Frame) -> Frame:
        nonlocal copied
        if not isinstance(frame, Nodes) or liar.state is not State.AWAIT_LEAVES:
            return frame
        flags, hashes = frame.sections[Domain.MESSAGES]
        nodes = children(2, [n for n in range(256) if flags[n >> 3] & (0x80 >> (n & 7))])
        bits = 8 * len(hashes) // len(nodes)
        theirs = b.tree(Domain.MESSAGES).hashes(3, nodes, liar._salt, 4)
        rows = np.unpackbits(np.frombuffer(theirs, dtype=np.uint8).reshape(-1, 4), axis=1)
        copied += 1
        return Nodes({Domain.MESSAGES: (flags, np.packbits(rows[:, :bits]).tobytes())})

    frames, largest, error = _drive(liar, honest, lie)
    assert copied == DESCENDS.max_passes
    assert error is None and honest.finished and honest.converged is False
    assert frames <= 8 * DESCENDS.max_passes + 2 and largest <= DESCENDS.max_frame
    assert set(a.messages) != set(b.messages)


def test_a_done_from_the_initiator_is_refused_before_the_responder_sent_its_roots() -> None:
    a = fill(engine(), [message(n) for n in range(0, 30)])
    b = fill(engine(), [message(n) for n in range(20, 50)])
    i = SyncSession(INIT, a, now_ms=0, salt_seed=b"early", config=SKETCHES)
    r = SyncSession(RESP, b, now_ms=0, config=SKETCHES)
    session, _ = advance(i, r, State.AWAIT_MIDDLE, RESP)
    with pytest.raises(RemoteProtocolError) as info:
        session.receive(encode_frame(Done(True)), 0)
    assert info.value.reason == "unexpected_frame"


def test_roots_that_differ_from_ours_open_the_closing_pass() -> None:
    """A responder whose roots (lying, or a write that raced) are not ours: no one-way DONE,
    the initiator closes with HELLO as before and the roots are compared there."""
    a = fill(engine(), [message(n) for n in range(0, 40)])
    b = fill(engine(), [message(n) for n in range(20, 60)])

    # the initiator descends from depth 2, the responder sketches at depth 3: its last
    # frame carries its roots
    config = SyncConfig(descend_above=0.001)
    i = SyncSession(INIT, a, now_ms=0, salt_seed=b"lie", config=config)
    r = SyncSession(RESP, b, now_ms=0, config=config)
    frame: bytes | None = i.start(0)
    lied = 0
    while frame is not None:
        reply = r.receive(frame, 0)
        if reply is None:
            break
        theirs = decoded(reply)
        if isinstance(theirs, Transfer) and theirs.roots is not None:
            digests, (xor, count, check) = theirs.roots
            reply = encode_frame(replace(theirs, roots=(digests, (xor, count + 1, check))))
            lied += 1
        frame = i.receive(reply, 0)
    assert lied and i.converged and r.converged
    assert set(a.messages) == set(b.messages)
    assert i.stats.passes == 2  # the closing HELLO compared the roots
