"""The paths of a session that converging alone does not pin down (sync/protocol.py).

Anti-entropy forgives a lot: a cell decoded wrong becomes an id list, a record not sent
this pass goes in the next one. So these tests assert how a session gets there — which
frames carry what, how many passes it takes — on data chosen for the path, and they drive
sessions with hand-made frames where the path is a hostile peer's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from store import Hlc, MessageKind, MsgV1
from store.errors import BadSignature, InvalidInput
from store.keys import bucket_of
from store.ops import make_identity
from store.records import decode_msg
from sync.errors import RemoteProtocolError
from sync.frames import (
    CELL_LEN,
    ID_PREFIX_LEN,
    Cells,
    Domain,
    Hello,
    IdList,
    Nodes,
    PrefixWant,
    Transfer,
    TransferSection,
    encode_frame,
)
from sync.loopback import LoopbackResult, run_session
from sync.protocol import (
    SessionRole,
    State,
    SyncConfig,
    SyncSession,
    hello_for,
    salted_prefix,
)
from sync.replica import MemoryReplica

from sync_support import (
    CHATS,
    KEYS,
    USERS,
    Wire,
    advance,
    contents,
    decoded,
    delete_of,
    engine,
    fill,
    identity,
    member,
    message,
    refers,
)

INIT, RESP = SessionRole.INITIATOR, SessionRole.RESPONDER
# These paths are the per-leaf cells and id lists' (SyncConfig(sketch=False)); the sketch's
# are in test_sketch_sessions.py.
CELLS = SyncConfig(sketch=False)


def cells(**overrides: Any) -> SyncConfig:
    return SyncConfig(sketch=False, **overrides)


def run_cells(
    *replicas: MemoryReplica,
    config: SyncConfig = CELLS,
    responder_config: SyncConfig | None = None,
    **options: Any,
) -> LoopbackResult:
    return run_session(*replicas, config=config, responder_config=responder_config, **options)


# Messages of sync_support's fixed universe whose ids share a bucket (found by a search).
PAIR = (235, 247)  # bucket 44481
TRIPLE = (1585, 2190, 2369)  # bucket 6026
# Stamped before and after CUTOFF, listed in the order of their buckets:
# 109 (bucket 1236) < 9 (7347) < 110 (13137) < 11 (17426).
CUTOFF = 1_500
NEW = (109, 110)
OLD = (9, 11)


def ids(*numbers: int) -> set[bytes]:
    return {message(n).msg_id for n in numbers}


def shipped_ids(wire: Wire, sender: str) -> list[bytes]:
    return [decode_msg(blob).msg_id for blob in wire.records(sender)]


def id_count(transfer: Transfer) -> int:
    """Records, wanted ids and prefixes in one frame: what ``max_ids_per_frame`` bounds."""
    count = 0
    for s in transfer.sections.values():
        count += len(s.records) + len(s.wants) // 32
        count += sum(len(x.prefixes) // ID_PREFIX_LEN for x in s.id_lists + s.prefix_wants)
    return count


def test_the_fixed_data_is_what_the_tests_assume() -> None:
    assert len({bucket_of(i) for i in ids(*PAIR)}) == 1
    assert len({bucket_of(i) for i in ids(*TRIPLE)}) == 1
    order = [bucket_of(message(n).msg_id) for n in (NEW[0], OLD[0], NEW[1], OLD[1])]
    assert order == sorted(order)
    assert all(message(n).hlc.physical_ms > CUTOFF for n in NEW)
    assert all(message(n).hlc.physical_ms <= CUTOFF for n in OLD)


# --- cells, id lists and prefix wants ---------------------------------------------------------


def test_a_leaf_one_record_apart_is_decoded_from_the_cells_not_listed() -> None:
    a = fill(engine(), [message(n) for n in range(0, 10)])
    b = fill(engine(), [message(n) for n in range(5, 15)])
    wire = Wire()
    result = run_cells(a, b, on_frame=wire)
    assert result.converged and result.initiator.stats.passes == 2
    first = wire.transfers("responder")[0].sections[Domain.MESSAGES]
    assert first.id_lists == []  # every differing leaf decoded
    assert sorted(_split_ids(first.wants)) == sorted(ids(*range(0, 5)))
    assert sorted(shipped_ids(wire, "responder")) == sorted(ids(*range(10, 15)))


def _split_ids(wants: bytes) -> list[bytes]:
    return [wants[i : i + 32] for i in range(0, len(wants), 32)]


def test_a_leaf_both_sides_fill_differently_is_listed_and_each_record_ships_once() -> None:
    mine, theirs = message(PAIR[0]), message(PAIR[1])  # one bucket, one record each
    a, b = fill(engine(), [mine]), fill(engine(), [theirs])
    wire = Wire()
    result = run_cells(a, b, on_frame=wire)
    assert result.converged and contents(a) == contents(b)
    assert result.initiator.stats.passes == 2  # the id list settles the leaf in one pass
    (id_list,) = wire.transfers("responder")[0].sections[Domain.MESSAGES].id_lists
    assert id_list.bucket == bucket_of(theirs.msg_id) and id_list.complete
    assert len(id_list.prefixes) == ID_PREFIX_LEN
    asked = [
        w for t in wire.transfers("initiator") for s in t.sections.values() for w in s.prefix_wants
    ]
    assert [w.bucket for w in asked] == [id_list.bucket]
    assert shipped_ids(wire, "initiator") == [mine.msg_id]  # pushed: not in a complete list
    assert shipped_ids(wire, "responder") == [theirs.msg_id]  # fetched by its prefix


@pytest.mark.parametrize(("max_bucket_ids", "passes"), [(2, 2), (3, 2)])
def test_a_bucket_of_exactly_max_bucket_ids_is_listed_whole(
    max_bucket_ids: int, passes: int
) -> None:
    held, listed = message(TRIPLE[0]), [message(n) for n in TRIPLE[1:]]
    a, b = fill(engine(), [held]), fill(engine(), listed)
    wire = Wire()
    result = run_cells(a, b, config=cells(max_bucket_ids=max_bucket_ids), on_frame=wire)
    (id_list,) = wire.transfers("responder")[0].sections[Domain.MESSAGES].id_lists
    assert id_list.complete and len(id_list.prefixes) == 2 * ID_PREFIX_LEN
    # complete: the initiator pushes what the list lacks in the same pass
    assert result.converged and result.initiator.stats.passes == passes
    assert shipped_ids(wire, "initiator") == [held.msg_id]


def test_a_bucket_over_max_bucket_ids_sends_a_sample_and_a_later_pass_the_rest() -> None:
    listed = [message(n) for n in PAIR]
    elsewhere = message(5)  # the initiator's, in a bucket of its own
    a, b = fill(engine(), [elsewhere]), fill(engine(), listed)
    wire = Wire()
    result = run_cells(a, b, config=cells(max_bucket_ids=1), on_frame=wire)
    (id_list,) = wire.transfers("responder")[0].sections[Domain.MESSAGES].id_lists
    assert not id_list.complete and len(id_list.prefixes) == ID_PREFIX_LEN
    # pass 1 moved a record each way in two leaves; the listed bucket still differs, and
    # pass 2 decodes it (one record apart now): no final HELLO before that
    assert result.converged and contents(a) == contents(b)
    assert result.initiator.stats.passes == 3


# --- hostile requests ---------------------------------------------------------------------


def _in_transfer(role: SessionRole) -> tuple[SyncSession, MsgV1, bytes]:
    """A session of ``role`` in TRANSFER: the initiator holds message(1), the responder
    message(2). Returns the session, the message its peer holds, and the peer's frame."""
    a, b = fill(engine(), [message(1)]), fill(engine(), [message(2)])
    i = SyncSession(INIT, a, now_ms=0, salt_seed=b"t", config=CELLS)
    r = SyncSession(RESP, b, now_ms=0, config=CELLS)
    session, frame = advance(i, r, State.TRANSFER, role)
    return session, message(2 if role is INIT else 1), frame


def _refused(session: SyncSession, frame: object) -> str:
    with pytest.raises(RemoteProtocolError) as info:
        session.receive(encode_frame(frame), 0)  # type: ignore[arg-type]
    return info.value.reason


def test_requests_for_buckets_the_pass_did_not_find_different_are_refused() -> None:
    stranger = message(500).msg_id
    prefix = salted_prefix(bytes(16), stranger)
    for section in (
        TransferSection(prefix_wants=[PrefixWant(bucket_of(stranger), prefix)]),
        TransferSection(id_lists=[IdList(bucket_of(stranger), True, prefix)]),
    ):
        session, _, _ = _in_transfer(INIT)
        assert _refused(session, Transfer(False, {Domain.MESSAGES: section})) == "unsolicited"


def test_only_the_responder_sends_id_lists() -> None:
    session, theirs, _ = _in_transfer(RESP)
    bucket = bucket_of(theirs.msg_id)  # under reconciliation
    listed = IdList(bucket, True, bytes(ID_PREFIX_LEN))
    frame = Transfer(False, {Domain.MESSAGES: TransferSection(id_lists=[listed])})
    assert _refused(session, frame) == "unexpected_frame"


def test_a_transfer_for_a_domain_outside_the_pass_is_refused() -> None:
    session, theirs, _ = _in_transfer(INIT)
    frame = Transfer(False, {Domain.IDENTITY: TransferSection(wants=theirs.msg_id)})
    assert _refused(session, frame) == "unexpected_domain"


def test_a_record_wanted_twice_ships_once() -> None:
    session, _, honest = _in_transfer(INIT)
    ours = message(1).msg_id
    assert decoded(honest).sections[Domain.MESSAGES].wants == ours  # type: ignore[union-attr]
    reply = session.receive(
        encode_frame(Transfer(False, {Domain.MESSAGES: TransferSection(wants=ours * 2)})), 0
    )
    sent = decoded(reply or b"")
    assert isinstance(sent, Transfer)
    assert [decode_msg(r).msg_id for r in sent.sections[Domain.MESSAGES].records] == [ours]


def test_prefix_wants_fetch_exactly_the_records_they_name() -> None:
    a, b = fill(engine(), [message(PAIR[0])]), fill(engine(), [message(PAIR[1])])
    i = SyncSession(INIT, a, now_ms=0, salt_seed=b"p", config=CELLS)
    r = SyncSession(RESP, b, now_ms=0, config=CELLS)
    responder, honest = advance(i, r, State.TRANSFER, RESP)
    section = decoded(honest).sections[Domain.MESSAGES]  # type: ignore[union-attr]
    (want,) = section.prefix_wants
    assert want.bucket == bucket_of(message(PAIR[1]).msg_id)
    reply = decoded(responder.receive(honest, 0) or b"")
    assert isinstance(reply, Transfer)
    shipped = [decode_msg(x).msg_id for x in reply.sections[Domain.MESSAGES].records]
    assert shipped == [message(PAIR[1]).msg_id]


def test_a_hello_while_the_responder_still_pushes_is_refused() -> None:
    """A HELLO closes a pass once the responder has pushed all it holds (it may still ask:
    the HELLO's records answer that); before, it is refused."""
    roots = {d: (bytes(32), 0) for d in Domain}
    hello = hello_for(2, bytes(16), 4, roots)
    records = [message(n) for n in range(0, 3)]
    one = max(len(r.encoded) for r in records)
    i = SyncSession(INIT, engine(), now_ms=0, salt_seed=b"t", config=CELLS)
    config = cells(max_record_bytes=one)  # one record a frame: two still queued
    r = SyncSession(RESP, fill(engine(), records), now_ms=0, config=config)
    session, _ = advance(i, r, State.TRANSFER, RESP)
    assert _refused(session, hello) == "unexpected_frame"
    session, _, _ = _in_transfer(RESP)  # pushed message(2), asked for message(1): drained
    assert isinstance(decoded(session.receive(encode_frame(hello), 0) or b""), Nodes)


# --- hostile descent ----------------------------------------------------------------------


def _differing_pair() -> tuple[SyncSession, SyncSession]:
    a, b = fill(engine(), [message(1)]), fill(engine(), [message(2)])
    return SyncSession(INIT, a, now_ms=0, salt_seed=b"d", config=CELLS), SyncSession(
        RESP, b, now_ms=0, config=CELLS
    )


def _honest_frame(state: State, role: SessionRole) -> tuple[SyncSession, object]:
    session, frame = advance(*_differing_pair(), state, role)
    return session, decoded(frame)


def test_the_top_nodes_carry_no_flags_and_every_hash_their_width_says() -> None:
    session, top = _honest_frame(State.AWAIT_TOP, INIT)
    assert isinstance(top, Nodes)
    flags, hashes = top.sections[Domain.MESSAGES]
    flagged = Nodes({Domain.MESSAGES: (b"\x80" + bytes(31), hashes)}, top.cutoff_ms)
    assert _refused(session, flagged) == "bad_flags"
    session, _ = _honest_frame(State.AWAIT_TOP, INIT)
    short = Nodes({Domain.MESSAGES: (flags, hashes[:-1])}, top.cutoff_ms)
    assert _refused(session, short) == "bad_hashes"
    session, _ = _honest_frame(State.AWAIT_TOP, INIT)
    assert _refused(session, Nodes({}, top.cutoff_ms)) == "unexpected_domain"


@pytest.mark.parametrize(
    ("state", "role"),
    [(State.AWAIT_MIDDLE, RESP), (State.AWAIT_LEAVES, INIT), (State.AWAIT_CELLS, RESP)],
)
def test_a_descent_frame_must_cover_the_domains_of_the_pass(
    state: State, role: SessionRole
) -> None:
    session, honest = _honest_frame(state, role)
    assert isinstance(honest, Nodes | Cells)
    extra = dict(honest.sections)
    extra[Domain.IDENTITY] = extra[Domain.MESSAGES]  # a domain whose roots were equal
    frame = Nodes(extra) if isinstance(honest, Nodes) else Cells(extra)
    assert _refused(session, frame) == "unexpected_domain"


def test_cells_must_match_the_leaves_they_flag_and_stay_within_max_cells() -> None:
    session, honest = _honest_frame(State.AWAIT_CELLS, RESP)
    assert isinstance(honest, Cells)
    flags, blob = honest.sections[Domain.MESSAGES]
    one_more = blob + blob[:CELL_LEN]  # a cell for a leaf the flags do not name
    assert _refused(session, Cells({Domain.MESSAGES: (flags, one_more)})) == "bad_cells"
    # well formed, but more leaves than the responder decodes in one pass
    a = fill(engine(), [message(n) for n in range(0, 3)])
    with pytest.raises(RemoteProtocolError) as info:
        run_cells(a, engine(), config=cells(), responder_config=cells(max_cells=2))
    assert info.value.reason == "bad_cells"


# --- records a peer should not have sent ----------------------------------------------------


def test_messages_the_cutoff_excludes_are_counted_and_dropped_the_rest_applied() -> None:
    old, new = message(OLD[0]), message(NEW[0])
    cutoff = cells(cutoff_ms=old.hlc.physical_ms)  # exactly at its stamp: old
    a, b = engine(), fill(engine(), [old, new])
    i = SyncSession(INIT, a, now_ms=0, salt_seed=b"c", config=cutoff)
    r = SyncSession(RESP, b, now_ms=0, config=CELLS)
    session, honest = advance(i, r, State.TRANSFER, INIT)
    section = decoded(honest).sections[Domain.MESSAGES]  # type: ignore[union-attr]
    assert section.records == [new.encoded]  # an honest peer does not ship the old one
    pushed = Transfer(True, {Domain.MESSAGES: replace(section, records=[old.encoded, new.encoded])})
    session.receive(encode_frame(pushed), 0)
    assert session.stats.rejected_old == 1 and session.stats.records_received == 2
    assert set(a.messages) == {new.msg_id}


def test_the_verifiers_verdict_is_per_message_and_its_first_error_ends_the_session() -> None:
    bad = message(2)

    def refuses_one(msgs: Sequence[MsgV1]) -> list[InvalidInput | None]:
        return [BadSignature("forged") if m == bad else None for m in msgs]

    a, b = fill(engine(), [message(1), bad, message(4)]), engine()
    with pytest.raises(RemoteProtocolError) as info:
        run_cells(b, a, config=cells(verify_messages=refuses_one))
    assert info.value.reason == "bad_signature"
    assert set(b.messages) == ids(1, 4)  # the frame's other records were applied


@pytest.mark.parametrize(
    "record",
    [
        delete_of(1, 0, 3),  # a DELETE belongs in the DELETES domain
        refers(MessageKind.REACTION, 1, 0, 3, b"\x02+"),  # flag byte neither 0 nor 1
    ],
    ids=["delete-as-message", "malformed-reaction"],
)
def test_a_message_in_the_wrong_domain_or_with_a_malformed_public_payload_is_invalid(
    record: MsgV1,
) -> None:
    session, _, honest = _in_transfer(INIT)
    section = decoded(honest).sections[Domain.MESSAGES]  # type: ignore[union-attr]
    frame = Transfer(True, {Domain.MESSAGES: replace(section, records=[record.encoded])})
    assert _refused(session, frame) == "invalid_record"  # judged before its bucket is


def test_a_verifier_answering_for_fewer_messages_than_it_was_given_is_a_bug() -> None:
    def drops_the_last(msgs):  # type: ignore[no-untyped-def]
        return [None] * (len(msgs) - 1)

    a = fill(engine(), [message(1), message(2)])
    with pytest.raises(ValueError):
        run_cells(engine(), a, config=cells(verify_messages=drops_the_last))


def test_authenticated_sessions_check_member_op_and_identity_signatures() -> None:
    strict = cells(authenticate=True)
    op = member(0, 1, 5)
    resigned = replace(op, sig=member(0, 2, 5).sig)  # authorized signer, wrong signature
    a = fill(engine(), [resigned])
    with pytest.raises(RemoteProtocolError) as info:
        run_cells(engine(), a, config=strict)
    assert info.value.reason == "bad_signature"

    signed = make_identity(KEYS[1], bytes(32), Hlc(5))
    assert signed.user_id == USERS[1]
    c = fill(engine(), [signed])
    d = engine()
    assert run_cells(d, c, config=strict).converged and USERS[1] in d.identities
    unsigned = identity(2, 5, 1)  # its blob is no identity document
    with pytest.raises(RemoteProtocolError):
        run_cells(engine(), fill(engine(), [unsigned]), config=strict)


# --- budgets ------------------------------------------------------------------------------


def test_every_frame_stays_within_max_ids_and_a_pass_moves_everything() -> None:
    """Records, wants, id lists and prefix wants share one budget, across domains."""
    a_side = [message(n) for n in range(0, 6)] + [message(PAIR[0]), member(0, 1, 5)]
    b_side = [message(n) for n in range(6, 12)] + [message(PAIR[1]), delete_of(1, 0, 3)]
    b_side += [identity(0, 3, 1), member(1, 2, 5)]
    a, b = fill(engine(), a_side), fill(engine(), b_side)
    wire = Wire()
    config = cells(max_ids_per_frame=3)
    result = run_cells(a, b, config=config, on_frame=wire)
    assert result.converged and contents(a) == contents(b)
    assert result.initiator.stats.passes == 2
    for transfer in wire.transfers():
        assert id_count(transfer) <= 3
        asks = any(s.wants or s.id_lists or s.prefix_wants for s in transfer.sections.values())
        assert not (asks and transfer.idle)  # idle: nothing queued, nothing asked
    full = [t for t in wire.transfers() if id_count(t) == 3]
    assert len(full) >= 4  # the budget is used, not just respected


def test_id_lists_and_prefix_wants_share_the_id_budget_with_the_next_domain() -> None:
    ops = [member(0, 1, 5), member(0, 2, 5)]
    a = fill(engine(), [message(PAIR[0]), *ops])
    b = fill(engine(), [message(PAIR[1])])
    wire = Wire()
    result = run_cells(a, b, config=cells(max_ids_per_frame=3), on_frame=wire)
    assert result.converged and contents(a) == contents(b)
    asked = wire.transfers("responder")[0].sections  # an id list, then both ops wanted
    assert [len(x.prefixes) for x in asked[Domain.MESSAGES].id_lists] == [ID_PREFIX_LEN]
    assert len(asked[Domain.MEMBERS].wants) == 2 * 32
    answer = wire.transfers("initiator")[0].sections  # its record, a prefix want, one op
    assert len(answer[Domain.MESSAGES].records) == 1
    assert [len(x.prefixes) for x in answer[Domain.MESSAGES].prefix_wants] == [ID_PREFIX_LEN]
    assert len(answer[Domain.MEMBERS].records) == 1


def test_a_record_that_exactly_fills_the_byte_budget_goes_in_the_frame() -> None:
    records = [message(n) for n in range(0, 4)]
    budget = len(records[0].encoded) + len(records[1].encoded)
    wire = Wire()
    b = engine()
    result = run_cells(
        b, fill(engine(), records), config=cells(max_record_bytes=budget), on_frame=wire
    )
    assert result.converged
    sizes = [
        sum(map(len, t.sections[Domain.MESSAGES].records))
        for t in wire.transfers("responder")
        if t.sections
    ]
    assert budget in sizes


def test_records_split_over_frames_by_the_byte_budget_still_move_in_one_pass() -> None:
    records = [message(n) for n in range(0, 3)]
    one = max(len(r.encoded) for r in records)
    a = fill(engine(), records)  # the initiator pushes, one record a frame
    wire = Wire()
    result = run_cells(a, engine(), config=cells(max_record_bytes=one), on_frame=wire)
    assert result.converged and result.initiator.stats.passes == 2
    pushed = [  # the last one rides on the HELLO that closes the pass
        len(f.sections[Domain.MESSAGES].records if isinstance(f, Transfer) else f.records[d])
        for s, f in wire.frames
        for d in (Domain.MESSAGES,)
        if s == "initiator"
        and ((isinstance(f, Transfer) and f.sections) or (isinstance(f, Hello) and f.records))
    ]
    assert pushed == [1, 1, 1]


def test_at_most_max_ids_records_go_in_a_frame() -> None:
    a = fill(engine(), [message(n) for n in range(0, 7)])
    wire = Wire()
    config = cells(max_ids_per_frame=3)
    result = run_cells(engine(), a, config=config, on_frame=wire)
    assert result.converged
    counts = [
        len(t.sections[Domain.MESSAGES].records) for t in wire.transfers("responder") if t.sections
    ]
    assert counts == [3, 3, 1]


# --- passes that cannot move everything -----------------------------------------------------


@pytest.mark.parametrize(
    ("held", "max_cells", "passes"),
    [
        # one pass compares every leaf; the old one's never moves: one final HELLO ends it
        ((NEW[0], OLD[0], NEW[1]), 3, 2),
        # max_cells leaves a new record for pass 2: the old leaf of pass 1 does not end it
        ((NEW[0], OLD[0], NEW[1]), 2, 3),
        # pass 2 moves nothing (only old leaves left): the final HELLO comes at once
        ((NEW[0], OLD[0], OLD[1]), 1, 3),
    ],
)
def test_leaves_of_messages_the_cutoff_keeps_back_end_the_session_without_spare_passes(
    held: tuple[int, ...], max_cells: int, passes: int
) -> None:
    a, b = engine(), fill(engine(), [message(n) for n in held])
    config = cells(cutoff_ms=CUTOFF, max_cells=max_cells)
    result = run_cells(a, b, config=config)
    assert set(a.messages) == ids(*(n for n in held if n in NEW))
    assert not result.converged  # the responder's tree keeps the old ones until its GC
    assert result.initiator.stats.passes == passes


def test_messages_at_the_first_milliseconds_sync_when_no_side_has_a_cutoff() -> None:
    early = [MsgV1.create(KEYS[0], CHATS[0], Hlc(ms), b"early %d" % ms) for ms in (0, 1, 2)]
    a, b = fill(engine(), early[:2]), fill(engine(), early[1:])
    result = run_cells(a, b)
    assert result.converged and set(a.messages) == set(b.messages) == {m.msg_id for m in early}
    assert result.rejected_old == 0


def test_the_drift_check_uses_the_clock_of_each_frame() -> None:
    later = 10_000_000
    msg = MsgV1.create(KEYS[0], CHATS[0], Hlc(later), b"now")
    a, b = engine(), fill(engine(), [msg])
    config = cells(max_offset_ms=120_000)
    i = SyncSession(INIT, a, now_ms=0, salt_seed=b"clock", config=config)  # made long ago
    r = SyncSession(RESP, b, now_ms=0, config=config)
    frame: bytes | None = i.start(later)
    receiver = r
    while frame is not None:
        frame = receiver.receive(frame, later)
        receiver = i if receiver is r else r
    assert msg.msg_id in a.messages and i.stats.rejected_future == 0
    assert i.finished and r.finished
