"""Listings (sync/protocol.py): a region's short ids sent as they are where that is fewer bytes
than its sketch, and small sets listed whole in answer to HELLO, no descent — with honest
peers (they converge, in fewer round trips and bytes) and hostile ones (a reason, nothing
invalid written, nothing valid lost).
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.records import MsgV1
from sync.claims import BucketClaims
from sync.errors import RemoteProtocolError
from sync.frames import (
    Domain,
    Done,
    Nodes,
    Sketches,
    SketchSection,
    decode_frame,
    encode_frame,
)
from sync.loopback import run_session
from sync.protocol import (
    ROOT_FLAGS,
    WHOLE_LISTING_MAX,
    SessionRole,
    State,
    SyncConfig,
    SyncSession,
)
from sync.replica import MemoryReplica
from sync.scope import Scope, shard_of
from sync.sketch import SketchKey, encode_listing, short_ids

from sync_support import (
    CHATS,
    Wire,
    advance,
    assert_trees_match_contents,
    contents,
    engine,
    fill,
    identity,
    member,
    message,
)

INIT, RESP = SessionRole.INITIATOR, SessionRole.RESPONDER
DESCENT = SyncConfig(listings=False)


def _small_pair() -> tuple[MemoryReplica, MemoryReplica]:
    a = fill(engine(), [message(n) for n in range(0, 40)] + [member(0, 1, 5)])
    b = fill(engine(), [message(n) for n in range(20, 60)] + [identity(2, 3, 1)])
    return a, b


def test_small_sets_are_listed_whole_and_converge_in_two_round_trips() -> None:
    a, b = _small_pair()
    wire = Wire()
    result = run_session(a, b, on_frame=wire)
    assert result.converged and contents(a) == contents(b)
    sender, listing = wire.frames[1]
    assert sender == "responder" and isinstance(listing, Sketches) and listing.cutoff_ms == 0
    assert set(listing.sections) == {Domain.MESSAGES, Domain.MEMBERS, Domain.IDENTITY, Domain.INDEX}
    assert all(s.is_listing and s.flags == ROOT_FLAGS for s in listing.sections.values())
    assert not any(isinstance(f, Nodes) for _, f in wire.frames)
    assert result.initiator.stats.round_trips == 2
    # beside the descent over the same sets: fewer bytes, fewer round trips
    c, d = _small_pair()
    descent = run_session(c, d, config=DESCENT)
    assert contents(c) == contents(a)
    assert descent.initiator.stats.round_trips > 2
    listed = result.initiator.stats.reconciliation_bytes()
    assert listed < descent.initiator.stats.reconciliation_bytes()


@pytest.mark.parametrize("side", ["responder", "initiator"])
def test_a_set_over_the_limit_descends(side: str) -> None:
    """The responder lists only when it holds at most WHOLE_LISTING_MAX ids in each differing
    domain and the initiator at most that many in all."""
    over = [message(n) for n in range(WHOLE_LISTING_MAX + 1)]
    big, small = fill(engine(), over), fill(engine(), over[:-2])  # (one id: the shortcut)
    initiator, responder = (small, big) if side == "responder" else (big, small)
    wire = Wire()
    result = run_session(initiator, responder, on_frame=wire)
    assert result.converged and set(small.messages) == set(big.messages)
    assert isinstance(wire.frames[1][1], Nodes)
    # at the limit: listed whole
    at = over[:-1]
    wire = Wire()
    run_session(fill(engine(), at), fill(engine(), at[:-2]), on_frame=wire)
    assert isinstance(wire.frames[1][1], Sketches)


def test_a_whole_listing_names_the_later_cutoff_and_neither_side_ships_older() -> None:
    old, new = message(1), message(200)  # physical ms 1_007 and 2_400
    cutoff = SyncConfig(cutoff_ms=2_000)
    a, b = fill(engine(), [old, new]), fill(engine(), [message(300)])
    wire = Wire()
    run_session(a, b, config=SyncConfig(), responder_config=cutoff, on_frame=wire)
    listing = wire.frames[1][1]
    assert isinstance(listing, Sketches) and listing.cutoff_ms == 2_000
    assert set(b.messages) == {new.msg_id, message(300).msg_id}  # not the old one
    assert set(a.messages) == {old.msg_id, new.msg_id, message(300).msg_id}


def test_a_responder_beside_another_session_holding_buckets_descends() -> None:
    """Its listing would claim nothing: beside a session that holds buckets, it descends and
    claims what it moves, as before."""
    a, b = _small_pair()
    claims = BucketClaims()
    other = object()
    claims.take(other, Domain.MESSAGES, [1], 1, now_ms=0)
    i = SyncSession(INIT, a, now_ms=0, salt_seed=b"c")
    r = SyncSession(RESP, b, now_ms=0, claims=claims)
    reply = r.receive(i.start(0), 0)
    assert reply is not None and isinstance(
        decode_frame(reply, max_frame=1 << 24, max_ids=1 << 20), Nodes
    )


SHARD = Scope(frozenset({shard_of(CHATS[0], 3)}), 3)  # one chat shard of three


def _scoped(records: list[MsgV1]) -> MemoryReplica:
    return fill(MemoryReplica(admit_all=True, scope=SHARD), records)


def test_listings_over_a_named_intersection_end_in_three_frames_when_equal() -> None:
    """A full initiator, a responder holding one shard: the roots differ (the initiator's
    cover more), the listings name the intersection, everything there is equal, and the
    initiator ends with a one-way DONE: HELLO, SKETCH, DONE."""
    held = [message(n) for n in range(30)]
    inside = [m for m in held if SHARD.holds_chat(m.chat_id)]
    assert 0 < len(inside) < len(held)
    wire = Wire()
    result = run_session(fill(engine(), held), _scoped(inside), on_frame=wire)
    assert result.converged and result.frames == 3
    listing = wire.frames[1][1]
    assert isinstance(listing, Sketches) and listing.scope == SHARD
    assert wire.frames[2] == ("initiator", Done(True))


def test_listings_over_a_named_intersection_move_what_differs_there_only() -> None:
    held = [message(n) for n in range(60)]
    inside = [m for m in held if SHARD.holds_chat(m.chat_id)]
    full, scoped = fill(engine(), held[::2]), _scoped(inside[1::2])
    wire = Wire()
    result = run_session(full, scoped, on_frame=wire)
    assert result.converged
    assert set(scoped.messages) == {m.msg_id for m in inside if m in held[::2] or m in inside[1::2]}
    assert {i for i in full.messages if i in scoped.messages} == set(scoped.messages)
    assert isinstance(wire.frames[1][1], Sketches) and wire.frames[1][1].scope == SHARD


def test_a_listing_naming_a_scope_wider_than_offered_is_refused() -> None:
    a = _scoped([message(n) for n in range(10)])
    b = fill(engine(), [message(n) for n in range(5, 20)])
    i = SyncSession(INIT, a, now_ms=0, salt_seed=b"wide")
    r = SyncSession(RESP, b, now_ms=0)
    session, frame = advance(i, r, State.AWAIT_TOP, INIT)
    honest = decode_frame(frame, max_frame=1 << 24, max_ids=1 << 20)
    assert isinstance(honest, Sketches)
    wider = Scope(frozenset({0, 1, 2}), 3)
    assert _refused(session, a, replace(honest, scope=wider)) == "scope_widened"


def test_a_done_after_unnarrowed_listings_is_refused() -> None:
    a, b = _small_pair()
    i = SyncSession(INIT, a, now_ms=0, salt_seed=b"early")
    r = SyncSession(RESP, b, now_ms=0)
    session, _ = advance(i, r, State.AWAIT_DECODE, RESP)
    with pytest.raises(RemoteProtocolError) as info:
        session.receive(encode_frame(Done(True)), 0)
    assert info.value.reason == "unexpected_frame"


def test_a_small_region_after_a_descent_is_listed_not_sketched() -> None:
    """Past the limit the responder descends; the initiator's region under the differing top
    nodes holds a few ids, and their listing is smaller than a sketch of them."""
    shared = [message(n) for n in range(300)]
    a = fill(engine(), [*shared, message(400)])
    b = fill(engine(), [*shared, message(401), message(402)])
    wire = Wire()
    result = run_session(a, b, on_frame=wire)
    assert result.converged and set(a.messages) == set(b.messages)
    sketches = [f for _, f in wire.frames if isinstance(f, Sketches)]
    assert sketches and all(s.is_listing for f in sketches for s in f.sections.values())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 400), max_size=120),
    st.lists(st.integers(0, 400), max_size=120),
    st.booleans(),
    st.booleans(),
)
def test_listing_and_sketching_peers_converge_on_any_small_sets(
    xs: list[int], ys: list[int], a_lists: bool, b_lists: bool
) -> None:
    """Either side may list or not; a peer accepts listings whatever it sends itself."""
    a, b = fill(engine(), [message(n) for n in xs]), fill(engine(), [message(n) for n in ys])
    config_a, config_b = SyncConfig(listings=a_lists), SyncConfig(listings=b_lists)
    result = run_session(a, b, config=config_a, responder_config=config_b)
    assert result.converged and set(a.messages) == set(b.messages)
    assert set(a.messages) == {message(n).msg_id for n in xs + ys}


# --- hostile listings -----------------------------------------------------------------------


def _initiator_facing_listing() -> tuple[SyncSession, MemoryReplica, Sketches]:
    """An initiator that sent HELLO, its replica, and the honest responder's whole listing."""
    a, b = _small_pair()
    i = SyncSession(INIT, a, now_ms=0, salt_seed=b"hostile")
    r = SyncSession(RESP, b, now_ms=0)
    session, frame = advance(i, r, State.AWAIT_TOP, INIT)
    listing = decode_frame(frame, max_frame=1 << 24, max_ids=1 << 20)
    assert isinstance(listing, Sketches)
    return session, a, listing


def _refused(session: SyncSession, replica: MemoryReplica, frame: Sketches) -> str:
    before = contents(replica)
    with pytest.raises(RemoteProtocolError) as info:
        session.receive(encode_frame(frame), 0)
    assert session.state is State.ABORTED
    assert contents(replica) == before
    assert_trees_match_contents(replica)
    return info.value.reason


def test_a_whole_listing_that_is_an_answer_or_names_no_cutoff_is_refused() -> None:
    session, replica, honest = _initiator_facing_listing()
    assert _refused(session, replica, replace(honest, answer=True)) == "unexpected_frame"
    session, replica, honest = _initiator_facing_listing()
    assert _refused(session, replica, replace(honest, cutoff_ms=None)) == "unexpected_frame"


def test_a_whole_listing_over_anything_but_the_root_or_a_sketch_instead_is_refused() -> None:
    session, replica, honest = _initiator_facing_listing()
    sections = {d: replace(s, flags=b"\x00") for d, s in honest.sections.items()}
    assert _refused(session, replica, replace(honest, sections=sections)) == "bad_flags"
    session, replica, honest = _initiator_facing_listing()
    sketch = {d: SketchSection(ROOT_FLAGS, 12, s.width, bytes(12 * (s.width + 2)))
              for d, s in honest.sections.items()}  # fmt: skip
    assert _refused(session, replica, replace(honest, sections=sketch)) == "bad_cells"


def test_whole_listings_to_an_initiator_holding_more_than_a_small_set_are_refused() -> None:
    """However few ids the responder lists, the initiator would list its whole domain: only
    when its HELLO offered at most WHOLE_LISTING_MAX ids."""
    a = fill(engine(), [message(n) for n in range(WHOLE_LISTING_MAX + 1)])
    session = SyncSession(INIT, a, now_ms=0, salt_seed=b"big")
    session.start(0)
    forged = Sketches({Domain.MESSAGES: SketchSection(ROOT_FLAGS, 0, 4, b"")}, cutoff_ms=0)
    assert _refused(session, a, forged) == "unexpected_frame"


def test_a_listing_that_names_a_bucket_outside_its_region_is_refused() -> None:
    """The initiator descends (listings off on its side) and lists the region under the top
    nodes that differ; a lying listing adds a short id of a bucket outside it."""
    shared = [message(n) for n in range(300)]
    a = fill(engine(), [*shared, message(400)])
    b = fill(engine(), [*shared, message(401)])
    i = SyncSession(INIT, a, now_ms=0, salt_seed=b"out")
    r = SyncSession(RESP, b, now_ms=0)
    session, frame = advance(i, r, State.AWAIT_MIDDLE, RESP)
    honest = decode_frame(frame, max_frame=1 << 24, max_ids=1 << 20)
    assert isinstance(honest, Sketches)
    section = honest.sections[Domain.MESSAGES]
    assert section.is_listing
    key = SketchKey.derive(session._salt, int(Domain.MESSAGES), section.width)
    differing = {m.msg_id[0] for m in (message(400), message(401))}  # depth-2 nodes: a byte
    outside = next(m for m in shared if m.msg_id[0] not in differing)
    forged = section.blob + encode_listing(short_ids(key, outside.msg_id), section.width)
    lie = replace(honest, sections={Domain.MESSAGES: replace(section, blob=forged)})
    assert _refused(session, b, lie) == "unsolicited"


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=40), st.integers(0, 10_000))
def test_a_mutated_whole_listing_is_taken_or_refused_with_a_reason(
    garbage: bytes, seed: int
) -> None:
    session, replica, honest = _initiator_facing_listing()
    raw = bytearray(encode_frame(honest))
    rng = random.Random(seed)
    for _ in range(rng.randint(1, 3)):
        raw[rng.randrange(len(raw))] ^= rng.randint(1, 255)
    before = contents(replica)
    try:
        session.receive(bytes(raw) + garbage[:3], 0)
    except RemoteProtocolError as exc:
        assert exc.reason and session.state is State.ABORTED
    assert_trees_match_contents(replica)
    assert set(contents(replica)[0]) >= set(before[0])  # nothing lost
