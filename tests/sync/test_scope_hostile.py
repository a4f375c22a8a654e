"""Hostile scopes: malformed, oversized and forged scope fields in HELLO and NODES, a peer
that claims a scope to harvest records outside it, and one that pushes records outside the
session's scope (SYNC.md, "Scopes"; SECURITY.md, "Scopes")."""

from __future__ import annotations

from functools import cache
from typing import Any

import cbor2
import pytest

from store import Hlc, MsgV1
from sync.errors import RemoteProtocolError
from sync.frames import (
    Domain,
    FrameType,
    Hello,
    Nodes,
    Transfer,
    TransferSection,
    decode_frame,
    encode_frame,
)
from sync.protocol import SessionRole, State, SyncConfig, SyncSession
from sync.replica import MemoryReplica
from sync.scope import EVERYTHING, MAX_SHARDS, Scope, shard_of

from sync_support import CHATS, KEYS, advance, decoded

S = 3  # the test network: one of CHATS per shard
IN_SHARD = shard_of(CHATS[0], S)
NARROW = Scope(frozenset({IN_SHARD}), S)
DIGESTS = bytes(4 * len(Domain))
ZERO_CELL = (bytes(32), 0, 0)


def hello(scope: Scope, records: dict[Domain, list[bytes]] | None = None) -> Hello:
    return Hello(1, bytes(16), 4, DIGESTS, ZERO_CELL, 0, False, records or {}, scope)


def hello_body(*extra: Any) -> list[Any]:
    """A HELLO's fields (a zero summed cell: its xor as b""), then ``extra``: records, scope."""
    return [FrameType.HELLO, 1, 1, bytes(16), 4, DIGESTS, b"", 0, 0, 0, False, *extra]


def reason(body: list[Any]) -> str:
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(cbor2.dumps(body), max_frame=1 << 20, max_ids=1 << 16)
    return info.value.reason


def test_a_full_hello_carries_no_scope_and_a_scoped_one_round_trips() -> None:
    full = encode_frame(hello(EVERYTHING))
    assert full == cbor2.dumps(hello_body())  # --full: not a byte of scope on the wire
    scoped = hello(NARROW)
    assert encode_frame(scoped) == cbor2.dumps(hello_body([], [S, b"\x80"]))  # no records: []
    assert decoded(encode_frame(scoped)) == scoped
    closing = hello(NARROW, {Domain.MESSAGES: [b"r" * 9]})  # a closing HELLO keeps its scope
    assert decoded(encode_frame(closing)) == closing
    assert decoded(encode_frame(hello(EVERYTHING, {Domain.DELETES: [b"d"]}))).scope.is_full
    nodes = Nodes({Domain.MESSAGES: (b"", b"")}, 0, NARROW)
    assert decoded(encode_frame(nodes)) == nodes
    assert len(encode_frame(Nodes({}, 0))) < len(encode_frame(nodes))


@pytest.mark.parametrize(
    ("scope", "why"),
    [
        ([1_000_000, bytes(125_000)], "scope_too_large"),  # a million shards
        ([MAX_SHARDS + 1, bytes((MAX_SHARDS + 8) // 8)], "scope_too_large"),
        ([1 << 70, b""], "malformed_frame"),  # not a u64
        ([-1, b""], "malformed_frame"),
        ([0, b""], "bad_scope"),  # a network of no shards
        ([16, b"\x00"], "bad_scope"),  # a bitmap one byte short
        ([16, bytes(3)], "bad_scope"),  # one byte long
        ([4, b"\x08"], "bad_scope"),  # shard 4 of a 4-shard network
        ([8, "\x01"], "malformed_frame"),  # a text bitmap
        ([8], "malformed_frame"),
        ([8, b"\x01", 0], "malformed_frame"),  # a user bitmap that is no bytes
        ([8, b"\x01", b"\x00"], "bad_scope"),  # an empty user bitmap: sent as none
        ([8, b"\x01", b"\x01\x00"], "bad_scope"),  # a user bitmap one byte long
        ([4, b"\x80", b"\x08"], "bad_scope"),  # user shard 4 of a 4-shard network
        ([8, b"\x01", b"\x01", 0], "too_many_items"),
        (b"\x01", "malformed_frame"),
        (None, "malformed_frame"),
    ],
)
def test_a_malformed_or_oversized_scope_is_refused_with_a_reason(scope: Any, why: str) -> None:
    assert reason(hello_body([], scope)) == why
    assert reason([FrameType.NODES, [], 0, scope]) == why


def test_a_scope_of_exactly_max_shards_is_read() -> None:
    """The last value in: a network of MAX_SHARDS shards, the bitmap ⌈S/8⌉ bytes."""
    widest = [MAX_SHARDS, b"\x80" + bytes(MAX_SHARDS // 8 - 1)]
    frame = decode_frame(cbor2.dumps(hello_body([], widest)), max_frame=1 << 20, max_ids=1 << 16)
    assert isinstance(frame, Hello) and frame.scope == Scope(frozenset({0}), MAX_SHARDS)
    nodes = decode_frame(
        cbor2.dumps([FrameType.NODES, [], 0, widest]), max_frame=1 << 20, max_ids=1
    )
    assert isinstance(nodes, Nodes) and nodes.scope == Scope(frozenset({0}), MAX_SHARDS)


def test_a_hello_with_a_field_after_its_scope_is_malformed() -> None:
    assert reason(hello_body([], [S, b"\x80"], 0)) == "malformed_frame"


def test_a_scope_in_the_records_place_is_malformed() -> None:
    """The scope comes after the records (``[]`` when none): in their place it is refused, and
    so is a records field that is not a list of sections (null, a map, bytes)."""
    assert reason(hello_body([S, b"\x80"])) == "malformed_frame"
    for records in (None, {}, b"\x80"):
        assert reason(hello_body(records, [S, b"\x80"])) == "malformed_frame"


def responder(replica: MemoryReplica) -> SyncSession:
    return SyncSession(SessionRole.RESPONDER, replica, now_ms=0)


def test_a_scope_of_another_network_ends_the_session() -> None:
    """Shard numbers mean nothing across networks of different sizes."""
    session = responder(MemoryReplica(scope=NARROW))
    frame = encode_frame(hello(Scope(frozenset({0}), S + 1)))
    with pytest.raises(RemoteProtocolError) as info:
        session.receive(frame, 0)
    assert info.value.reason == "scope_mismatch" and session.state is State.ABORTED


def test_a_responder_naming_shards_not_offered_ends_the_session() -> None:
    initiator = SyncSession(SessionRole.INITIATOR, MemoryReplica(scope=NARROW), now_ms=0)
    initiator.start(0)
    top = {Domain.MESSAGES: (b"", bytes(256 * 4))}
    wider = Scope(frozenset(range(S)), S)
    with pytest.raises(RemoteProtocolError) as info:
        initiator.receive(encode_frame(Nodes(top, 0, wider)), 0)
    assert info.value.reason == "scope_widened"


def test_a_scope_in_a_later_nodes_frame_ends_the_session() -> None:
    """The cells path's second NODES (the sketch path sends a SKETCH there: no scope field)."""
    a, b = collision()
    cells = SyncConfig(sketch=False)
    init = SyncSession(SessionRole.INITIATOR, full_replica(a, b), now_ms=0, config=cells)
    resp = SyncSession(
        SessionRole.RESPONDER, MemoryReplica(scope=NARROW, admit_all=True), now_ms=0, config=cells
    )
    session, frame = advance(init, resp, State.AWAIT_MIDDLE, SessionRole.RESPONDER)
    honest = decoded(frame)
    assert isinstance(honest, Nodes)
    forged = encode_frame(Nodes(honest.sections, honest.cutoff_ms, NARROW))
    with pytest.raises(RemoteProtocolError) as info:
        session.receive(forged, 0)
    assert info.value.reason == "bad_scope"


# --- harvesting and pushing: two messages of chats in different shards, one bucket ---


@cache
def collision() -> tuple[MsgV1, MsgV1]:
    """A message of CHATS[0] (in NARROW) and one of CHATS[1] (outside) in the same bucket."""
    seen: dict[int, MsgV1] = {}
    for k in range(20_000):
        chat = k % 2
        msg = MsgV1.create(KEYS[0], CHATS[chat], Hlc(5_000 + k), b"h%d" % k)
        bucket = (msg.msg_id[0] << 8) | msg.msg_id[1]
        other = seen.get(bucket)
        if other is not None and other.chat_id != msg.chat_id:
            return (other, msg) if chat == 1 else (msg, other)
        seen.setdefault(bucket, msg)
    raise AssertionError("no collision")


def full_replica(*msgs: MsgV1) -> MemoryReplica:
    replica = MemoryReplica(admit_all=True)
    replica.apply_ops(list(msgs))
    return replica


def shipped(frames: list[bytes]) -> set[bytes]:
    out: set[bytes] = set()
    for frame in frames:
        parsed = decoded(frame)
        if isinstance(parsed, Transfer):
            for section in parsed.sections.values():
                out.update(section.records)
    return out


PATHS = pytest.mark.parametrize("sketch", [False, True], ids=["cells", "sketch"])


@PATHS
def test_a_peer_claiming_a_scope_is_served_only_that_scope(sketch: bool) -> None:
    """The attacker claims NARROW and asks by id for a record outside it, in a bucket the
    pass found different: it gets the record inside, never the one outside."""
    inside, outside = collision()
    assert not NARROW.holds_chat(outside.chat_id)
    config = SyncConfig(sketch=sketch)
    victim = SyncSession(
        SessionRole.RESPONDER, full_replica(inside, outside), now_ms=0, config=config
    )
    attacker = SyncSession(
        SessionRole.INITIATOR,
        MemoryReplica(scope=NARROW, admit_all=True),
        now_ms=0,
        config=config,
    )
    served = until_victim_transfers(attacker, victim)
    assert victim.scope == NARROW
    want = Transfer(False, {Domain.MESSAGES: TransferSection(wants=inside.msg_id + outside.msg_id)})
    reply = victim.receive(encode_frame(want), 0)
    assert reply is not None and not victim.finished
    sent = shipped([*served, reply])
    assert inside.encoded in sent and outside.encoded not in sent


@PATHS
def test_a_record_pushed_outside_the_scope_ends_the_session_and_is_not_written(
    sketch: bool,
) -> None:
    """The attacker holds both and pushes both: the one inside the scope is written, the one
    outside ends the session (out_of_scope) and is written nowhere."""
    inside, outside = collision()
    victim_replica = MemoryReplica(scope=NARROW, admit_all=True)
    config = SyncConfig(sketch=sketch)
    attacker = SyncSession(
        SessionRole.INITIATOR, full_replica(inside, outside), now_ms=0, config=config
    )
    victim = SyncSession(SessionRole.RESPONDER, victim_replica, now_ms=0, config=config)
    until_victim_transfers(attacker, victim)
    assert attacker.scope == NARROW  # the victim named it
    push = Transfer(
        False, {Domain.MESSAGES: TransferSection(records=[inside.encoded, outside.encoded])}
    )
    with pytest.raises(RemoteProtocolError) as info:
        victim.receive(encode_frame(push), 0)
    assert info.value.reason == "out_of_scope"
    assert inside.msg_id in victim_replica.messages
    assert outside.msg_id not in victim_replica.messages


def until_victim_transfers(attacker: SyncSession, victim: SyncSession) -> list[bytes]:
    """Run an honest session until the victim (the responder) is in TRANSFER and awaits the
    attacker's next frame; the frames the victim sent. Either path gets there: the cells
    path after its CELLS, the sketch path after its decode or its one-id shortcut."""
    frame = attacker.start(0)
    sent = []
    while frame is not None:
        frame = victim.receive(frame, 0)
        assert frame is not None, "the session ended before a transfer"
        sent.append(frame)
        if victim.state is State.TRANSFER:
            return sent
        frame = attacker.receive(frame, 0)
    raise AssertionError("the attacker ended the session")


def test_full_replicas_of_a_network_of_any_size_speak_todays_frames() -> None:
    """A full scope has no shard count on the wire: two full nodes of a 64-shard network
    send exactly the frames of two nodes before scopes."""
    from sync.loopback import run_session

    from sync_support import Wire

    a, b = collision()
    sizes = []
    for scope in (EVERYTHING, Scope(None, 64)):
        wire = Wire()
        left, right = MemoryReplica(admit_all=True, scope=scope), full_replica(a, b)
        result = run_session(left, right, on_frame=wire)
        assert result.converged and set(left.messages) == {a.msg_id, b.msg_id}
        assert all(getattr(frame, "scope", None) in (None, EVERYTHING) for _, frame in wire.frames)
        sizes.append(result.bytes_sent)
    assert sizes[0] == sizes[1]
