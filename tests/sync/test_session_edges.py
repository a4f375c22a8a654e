"""The session's small parts and its bounds, each at its exact edge (sync/protocol.py).

test_protocol runs whole sessions; a session that converges can still hide an off-by-one in
a bitmap's padding, a budget, or which of two cutoffs wins. These tests pin those down.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store import Hlc, MsgV1
from sync.errors import LocalProtocolError, RemoteProtocolError
from sync.frames import (
    ID_PREFIX_LEN,
    Abort,
    Cells,
    Domain,
    Done,
    Hello,
    IdList,
    Nodes,
    PrefixWant,
    Sketches,
    Transfer,
    decode_frame,
    encode_frame,
)
from sync.loopback import run_session
from sync.merkle import check_hash
from sync.protocol import (
    SessionRole,
    SessionStats,
    SyncConfig,
    SyncSession,
    _decode_cell,
    _encode_cell,
    _later,
    _split,
    _take_within,
    decode_pure_cell,
    hello_for,
    read_flags,
    salted_prefix,
    verify_each,
    write_flags,
)

from sync_support import CHATS, KEYS, engine, fill, identity, member, message


@given(st.lists(st.integers(0, 1000), unique=True, max_size=40), st.data())
def test_flags_mark_exactly_the_chosen_items_msb_first(items: list[int], data) -> None:  # type: ignore[no-untyped-def]
    chosen = data.draw(st.sets(st.sampled_from(items)) if items else st.just(set()))
    flags = write_flags(items, chosen)
    assert len(flags) == (len(items) + 7) // 8
    assert read_flags(items, flags) == [i for i in items if i in chosen]
    for position, item in enumerate(items):  # bit 7 of byte 0 is the first item
        assert bool(flags[position // 8] >> (7 - position % 8) & 1) == (item in chosen)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 15])
def test_flags_of_the_wrong_length_or_past_the_end_are_refused(n: int) -> None:
    items = list(range(n))
    for flags in (bytes((n + 7) // 8 + 1), bytes((n + 7) // 8 - 1)):
        with pytest.raises(RemoteProtocolError) as info:
            read_flags(items, flags)
        assert info.value.reason == "bad_flags"
    padding = (8 - n % 8) % 8
    last = bytearray(write_flags(items, set(items)))
    assert read_flags(items, bytes(last)) == items  # every item set, no padding bit
    if padding:
        last[-1] |= 1  # the last padding bit
        with pytest.raises(RemoteProtocolError) as info:
            read_flags(items, bytes(last))
        assert info.value.reason == "bad_flags"


@given(st.none() | st.integers(-5, 50), st.integers(0, 50))
def test_the_session_cutoff_is_the_later_of_two_and_zero_means_none(
    own: int | None, peer: int
) -> None:
    present = [c for c in (own, peer) if c is not None and c > 0]
    assert _later(own, peer) == (max(present) if present else None)


@given(st.lists(st.integers(0, 5), max_size=8), st.integers(0, 12))
def test_id_lists_are_taken_from_the_front_while_they_fit(sizes: list[int], budget: int) -> None:
    items = [IdList(i, True, bytes(ID_PREFIX_LEN * n)) for i, n in enumerate(sizes)]
    pending = list(items)
    taken = _take_within(pending, budget)
    assert taken + pending == items  # in order, nothing lost
    assert sum(sizes[: len(taken)]) <= budget
    if pending:  # the next one would not have fit
        assert sum(sizes[: len(taken) + 1]) > budget
    wants = [PrefixWant(1, bytes(ID_PREFIX_LEN))]
    assert _take_within(wants, 1) == [PrefixWant(1, bytes(ID_PREFIX_LEN))] and wants == []


@given(st.integers(0, 1 << 40), st.integers(0, (1 << 256) - 1), st.integers(0, (1 << 32) - 1))
def test_cells_round_trip_and_counts_saturate_at_u32(count: int, xor: int, check: int) -> None:
    blob = _encode_cell(count, xor, check)
    assert len(blob) == 40
    assert _decode_cell(blob) == (min(count, (1 << 32) - 1), xor, check)


def test_a_pure_cell_must_name_an_id_of_its_own_bucket() -> None:
    record_id = bytes([0, 7]) + bytes(range(30))
    mine, theirs = (0, 0, 0), (1, int.from_bytes(record_id, "big"), check_hash(record_id))
    assert decode_pure_cell(7, mine, theirs) == (1, record_id)
    assert decode_pure_cell(8, mine, theirs) is None  # the XOR names an id of bucket 7
    assert decode_pure_cell(7, theirs, mine) == (-1, record_id)
    assert decode_pure_cell(7, mine, (2, theirs[1], theirs[2])) is None


def test_salted_prefixes_and_splits() -> None:
    record_id = bytes(range(32))
    prefix = salted_prefix(b"a" * 16, record_id)
    assert len(prefix) == ID_PREFIX_LEN and prefix != salted_prefix(b"b" * 16, record_id)
    assert _split(b"abcdefg", 3) == [b"abc", b"def", b"g"] and _split(b"", 3) == []


def test_reconciliation_bytes_count_both_ways_but_not_the_records() -> None:
    stats = SessionStats()
    stats.bytes_sent.update(tree=1, ids=2, records=1000, control=4)
    stats.bytes_received.update(tree=10, ids=20, records=5000, control=40)
    assert stats.reconciliation_bytes() == 77


def test_verify_each_answers_per_message() -> None:
    good = message(1)
    bad = message(2)
    forged = type(good)(*(getattr(good, f) for f in good.__dataclass_fields__))
    object.__setattr__(forged, "sig", bad.sig)  # another message's signature
    errors = verify_each([good, forged, bad])
    assert errors[0] is None and errors[2] is None
    assert errors[1] is not None and errors[1].reason == "bad_signature"


# --- whole sessions at their bounds ---------------------------------------------------------


def responder_with_data() -> SyncSession:
    return SyncSession(
        SessionRole.RESPONDER, fill(engine(), [message(1)]), now_ms=0, config=SyncConfig()
    )


def hello(pass_no: int = 1, *, final: bool = False, roots: dict | None = None) -> bytes:  # type: ignore[type-arg]
    zero = {d: (bytes(32), 0) for d in Domain}
    return encode_frame(
        hello_for(pass_no, bytes(16), 4, zero if roots is None else roots, None, 0, final)
    )


def test_a_hello_must_be_the_next_pass_with_every_domain() -> None:
    for frame, why in [
        (hello(pass_no=2), "bad_pass"),
        (hello(pass_no=0), "bad_pass"),
    ]:
        with pytest.raises(RemoteProtocolError) as info:
            responder_with_data().receive(frame, 0)
        assert info.value.reason == why


@pytest.mark.parametrize(("max_passes", "descends"), [(1, True), (0, False)])
def test_the_last_allowed_pass_still_descends(max_passes: int, descends: bool) -> None:
    session = SyncSession(
        SessionRole.RESPONDER,
        fill(engine(), [message(1)]),
        now_ms=0,
        config=SyncConfig(max_passes=max_passes),
    )
    reply = decode_frame(session.receive(hello(), 0) or b"", max_frame=1 << 20, max_ids=1 << 16)
    # one id apart: the shortcut pushes it (a descent by the roots' one-id cell)
    assert isinstance(reply, Transfer) == descends
    if not descends:  # out of passes, and the roots differ
        assert reply == Done(False) and session.converged is False


def test_a_final_hello_compares_and_ends() -> None:
    differing = responder_with_data()
    assert differing.receive(hello(final=True), 0) == encode_frame(Done(False))
    empty = SyncSession(SessionRole.RESPONDER, engine(), now_ms=0)
    assert empty.receive(hello(final=True), 0) == encode_frame(Done(True))
    assert empty.converged is True and empty.finished and empty.next_deadline() is None


def test_both_sides_count_the_same_frames_bytes_and_records() -> None:
    a = fill(engine(), [message(n) for n in range(0, 30)] + [member(0, 1, 5)])
    b = fill(engine(), [message(n) for n in range(20, 50)] + [identity(2, 3, 1)])
    result = run_session(a, b)
    i, r = result.initiator.stats, result.responder.stats
    assert result.converged
    assert (i.frames_sent, i.frames_received) == (r.frames_received, r.frames_sent)
    assert i.frames_sent + i.frames_received == result.frames
    # small sets: HELLO, whole listings, TRANSFER each way (the responder's with its roots),
    # and the initiator's one-way DONE — no round trip
    assert i.round_trips == i.frames_sent - 1 == 2 and r.round_trips == 0
    assert i.bytes_sent == r.bytes_received and i.bytes_received == r.bytes_sent
    assert (i.records_sent, i.records_received) == (r.records_received, r.records_sent)
    # 20 + the op once (in MEMBERS or INDEX: full scopes hold both, and the receiver files
    # it in both; it was 22, the op twice); 20 + the identity
    assert i.records_sent == 21 and i.records_received == 21
    assert i.records_applied == 21 and r.records_applied == 21
    assert i.passes == r.passes == 1  # the responder's roots after its pushes equal ours
    assert i.round_trips_before_fetch is not None and 0 < i.round_trips_before_fetch < i.round_trips
    assert i.bytes_sent["tree"] > 0  # HELLO: the responder sent no tree, only listings
    for stats in (i, r):
        assert all(stats.bytes_sent[k] > 0 for k in ("records", "ids"))
        assert stats.reconciliation_bytes() < sum(stats.bytes_sent.values()) + sum(
            stats.bytes_received.values()
        )


@pytest.mark.parametrize("offset", [-1, 0, 1])
@pytest.mark.parametrize("side", ["initiator", "responder"])
def test_a_message_exactly_at_the_cutoff_is_old_and_one_ms_later_is_not(
    offset: int, side: str
) -> None:
    msg = message(3)  # physical ms 1_021
    cut = SyncConfig(cutoff_ms=msg.hlc.physical_ms + offset)
    # either side's cutoff is the session's: the holder does not even ship an old message
    configs = (cut, SyncConfig()) if side == "initiator" else (SyncConfig(), cut)
    b = engine()
    result = run_session(fill(engine(), [msg]), b, config=configs[0], responder_config=configs[1])
    taken = offset < 0
    assert (msg.msg_id in b.messages) == taken
    assert result.initiator.stats.records_sent == int(taken)


@pytest.mark.parametrize("ahead", [119_999, 120_000, 120_001])
def test_a_record_at_the_drift_limit_is_taken_and_one_ms_more_skipped(ahead: int) -> None:
    now = 1_000
    msg = MsgV1.create(KEYS[0], CHATS[0], Hlc(now + ahead), b"soon")
    b = engine()
    result = run_session(
        b, fill(engine(), [msg]), now_ms=now, config=SyncConfig(max_offset_ms=120_000)
    )
    assert (msg.msg_id in b.messages) == (ahead <= 120_000)
    assert (result.rejected_future > 0) == (ahead > 120_000)


def test_small_budgets_split_the_transfer_but_not_the_result() -> None:
    a = fill(engine(), [message(n) for n in range(0, 60)])
    b = engine()
    sizes: list[int] = []

    def watch(sender: str, frame: bytes) -> None:
        decoded = decode_frame(frame, max_frame=1 << 24, max_ids=1 << 20)
        if isinstance(decoded, Transfer) and sender == "responder":
            records = [r for s in decoded.sections.values() for r in s.records]
            sizes.append(len(records))
            budget = 600
            assert len(records) <= 4
            assert len(records) <= 1 or sum(map(len, records)) <= budget

    config = SyncConfig(max_record_bytes=600, max_ids_per_frame=4, max_passes=20)
    result = run_session(b, a, config=config, on_frame=watch)
    assert result.converged and set(b.messages) == set(a.messages)
    assert max(sizes) >= 2 and sum(sizes) == 60


@pytest.mark.parametrize("initiator_holds", [False, True], ids=["fetches", "pushes"])
def test_more_differing_leaves_than_max_cells_take_more_passes(initiator_holds: bool) -> None:
    a = fill(engine(), [message(n) for n in range(0, 40)])
    b = engine()
    config = SyncConfig(max_cells=8, max_passes=20, sketch=False)  # cells: a sketch has no cap
    result = (
        run_session(a, b, config=config) if initiator_holds else run_session(b, a, config=config)
    )
    assert result.converged and set(b.messages) == set(a.messages)
    assert result.initiator.stats.passes >= 40 // 8


def test_a_peer_asking_for_more_than_max_outbox_is_refused() -> None:
    a = fill(engine(), [message(n) for n in range(0, 20)])
    # the empty responder asks the initiator (its wants fill the initiator's outbox); with
    # this salt the responder decodes the first sketch (with another, a sketch too small for
    # the 20 may be answered by the responder's larger one: the initiator decodes and pushes)
    with pytest.raises(RemoteProtocolError) as info:
        run_session(
            a, engine(), config=SyncConfig(max_outbox=19, listings=False),
            responder_config=SyncConfig(listings=False), salt_seed=b"asks",
        )  # fmt: skip
    assert info.value.reason == "too_many_items"
    fine = run_session(a, engine(), config=SyncConfig(max_outbox=20), responder_config=SyncConfig())
    assert fine.converged


def test_the_defaults_are_the_bounds_the_documents_promise() -> None:
    """SYNC.md ("Bounded memory per session"), SECURITY.md's limits table and
    docs/ARCHITECTURE.md's idle timeout quote these numbers: a change here is a change there."""
    assert SyncConfig() == SyncConfig(
        hash_width=4,
        max_frame=4 * 1024 * 1024,
        max_record_bytes=1024 * 1024,
        max_ids_per_frame=65_536,
        max_cells=16_384,
        max_bucket_ids=4_096,
        max_outbox=200_000,
        max_passes=3,
        idle_timeout_ms=5_000,
        min_bytes_per_s=256 * 1024,
        sketch=True,
        short_id_bytes=None,  # sized by the estimate (sync.sketch.short_id_width)
        max_sketch_cells=262_140,  # SYNC.md ("Costs": the bound per pass)
    )


@given(
    st.lists(st.binary(min_size=30, max_size=30), min_size=1, max_size=6, unique=True),
    st.integers(0, (1 << 16) - 1),
)
def test_two_leaves_one_id_apart_name_that_id_whatever_else_they_share(
    tails: list[bytes], bucket: int
) -> None:
    """The cells' XOR and check cancel what both sides hold, however much that is."""
    ids = [bucket.to_bytes(2, "big") + tail for tail in tails]
    shared, extra = ids[:-1], ids[-1]

    def cell(held: list[bytes]) -> tuple[int, int, int]:
        xor = check = 0
        for i in held:
            xor ^= int.from_bytes(i, "big")
            check ^= check_hash(i)
        return len(held), xor, check

    assert decode_pure_cell(bucket, cell(shared), cell(ids)) == (1, extra)
    assert decode_pure_cell(bucket, cell(ids), cell(shared)) == (-1, extra)


def test_deadlines_count_from_the_clock_each_call_passes() -> None:
    idle = SyncConfig().idle_timeout_ms
    replica = fill(engine(), [message(1)])
    responder = SyncSession(SessionRole.RESPONDER, replica, now_ms=500, config=SyncConfig())
    assert responder.next_deadline() == 500 + idle  # silent from the start
    initiator = SyncSession(SessionRole.INITIATOR, engine(), now_ms=0)
    hello_frame = initiator.start(200)
    assert initiator.next_deadline() == 200 + idle
    reply = responder.receive(hello_frame, 700)
    assert reply is not None  # and the peer gets the time to digest it at min_bytes_per_s
    in_flight_ms = len(reply) * 1000 // SyncConfig().min_bytes_per_s
    assert responder.next_deadline() == 700 + idle + in_flight_ms


def test_an_initiator_starts_once_and_an_abort_without_an_error_says_aborted() -> None:
    initiator = SyncSession(SessionRole.INITIATOR, engine(), now_ms=0)
    assert initiator.stats.passes == 0
    initiator.start(0)
    assert initiator.stats.passes == 1
    with pytest.raises(LocalProtocolError):
        initiator.start(0)
    assert decode_frame(initiator.abort_frame(), max_frame=1 << 10, max_ids=1) == Abort("aborted")


def test_the_stats_count_each_kind_of_byte_on_the_wire() -> None:
    """Per side: records are the record bodies, ids the wanted ids and prefixes, tree the
    descent, control the rest; fetching starts after the frames before the first record."""
    a = fill(engine(), [message(n) for n in (235, 1, 2)])  # 235 and 247 share a bucket:
    b = fill(engine(), [message(n) for n in (247, 2, 3)])  # an id list, a prefix want
    frames: list[tuple[str, bytes]] = []
    descent = SyncConfig(listings=False)  # every kind of byte, on both sides
    result = run_session(
        a, b, config=descent, on_frame=lambda sender, f: frames.append((sender, f))
    )
    decoded = [(s, f, decode_frame(f, max_frame=1 << 24, max_ids=1 << 20)) for s, f in frames]
    for side, stats in (
        ("initiator", result.initiator.stats),
        ("responder", result.responder.stats),
    ):
        sent = dict.fromkeys(stats.bytes_sent, 0)
        transfer_records = transfer_ids = 0
        for data, frame in ((f, frame) for s, f, frame in decoded if s == side):
            if isinstance(frame, Hello):  # a closing HELLO may carry records
                pushed = sum(len(r) for records in frame.records.values() for r in records)
                sent["records"] += pushed
                sent["tree"] += len(data) - pushed
                continue
            if isinstance(frame, Nodes | Cells):
                sent["tree"] += len(data)
                continue
            if isinstance(frame, Sketches):
                sent["ids"] += len(data)
                continue
            sent["control"] += len(data)  # less the records and ids, below
            for section in frame.sections.values() if isinstance(frame, Transfer) else ():
                sent["records"] += sum(map(len, section.records))
                sent["ids"] += len(section.wants)
                sent["ids"] += sum(len(x.prefixes) for x in section.id_lists + section.prefix_wants)
                sent["ids"] += len(section.short_wants)
                transfer_ids += len(section.wants) + len(section.short_wants)
                transfer_ids += sum(
                    len(x.prefixes) for x in section.id_lists + section.prefix_wants
                )
                transfer_records += sum(map(len, section.records))
        sent["control"] -= transfer_records + transfer_ids
        assert stats.bytes_sent == sent, side
        assert sent["tree"] and sent["records"] and sent["ids"], side
    assert isinstance(decoded[-1][2], Done)
    first = next(n for n, (_, _, f) in enumerate(decoded) if _records_in(f))
    before = sum(1 for s, _, _ in decoded[:first] if s == "initiator")
    assert result.initiator.stats.round_trips_before_fetch == before


def _records_in(frame: object) -> bool:
    if isinstance(frame, Hello):
        return bool(frame.records)
    return isinstance(frame, Transfer) and any(s.records for s in frame.sections.values())
