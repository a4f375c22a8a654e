"""The sketch path over a session's scope: a sketch, a decode and the asks that follow cover
the intersection of both sides' scopes only (per-shard trees, ``ids_in_range``), so a sketch
peer never ships a record outside it, on RocksDB as in memory, whichever side opens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from store import ChatDb, ChatDbConfig, MsgV1
from store.records import decode_msg
from sync.frames import Domain, Nodes, Sketches
from sync.loopback import run_session
from sync.protocol import SessionRole, SyncConfig, SyncSession
from sync.replica import DbReplica, MemoryReplica
from sync.scope import EVERYTHING, Scope, shard_of

from sync_support import CHATS, Wire, message

S = 3  # one of CHATS per shard
NARROW = Scope(frozenset({shard_of(CHATS[0], S), shard_of(CHATS[2], S)}), S)
# 90 messages, a third outside NARROW: enough for a sketch (d > 1), too few to saturate depth 2
MESSAGES: list[MsgV1] = [message(n) for n in range(90)]
INSIDE = {m.msg_id for m in MESSAGES if NARROW.holds_chat(m.chat_id)}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatDb]:
    db = ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=tmp_path / "db")
    yield db
    db.close()


def holding(replica: MemoryReplica | DbReplica, msgs: list[MsgV1]) -> MemoryReplica | DbReplica:
    replica.apply_ops(list(msgs))
    return replica


def shipped_chats(wire: Wire) -> set[bytes]:
    blobs = wire.records("initiator") + wire.records("responder")
    return {decode_msg(b).chat_id for b in blobs}


@pytest.mark.parametrize("narrow_opens", [True, False], ids=["narrow-initiator", "full-initiator"])
@pytest.mark.parametrize("on_disk", [False, True], ids=["memory", "rocksdb"])
def test_a_sketch_session_moves_the_intersection_only(
    narrow_opens: bool, on_disk: bool, store: ChatDb
) -> None:
    """The full replica holds two thirds of the messages (of every chat), the narrow one the
    in-scope third the full one lacks: one session of sketches brings each what the other
    holds within NARROW and nothing else — no out_of_scope, converged over NARROW."""
    full = holding(MemoryReplica(admit_all=True), MESSAGES[:60])
    narrow_side = DbReplica(store, admit_all=True, scope=NARROW) if on_disk else None
    narrow = narrow_side or MemoryReplica(admit_all=True, scope=NARROW)
    holding(narrow, [m for m in MESSAGES[60:] if m.msg_id in INSIDE])
    wire = Wire()
    pair = (narrow, full) if narrow_opens else (full, narrow)
    result = run_session(*pair, on_frame=wire)
    assert result.error is None and result.converged
    assert any(isinstance(f, Sketches) for _, f in wire.frames)  # the sketch path ran
    # a region listed over the scope agrees with the scope's tree, bucket by bucket: a listing
    # of the whole replica would not (its extra ids left out as inconsistent buckets)
    sides = (result.initiator, result.responder)
    assert [s.stats.inconsistent_buckets for s in sides] == [0, 0]
    assert shipped_chats(wire) and all(NARROW.holds_chat(c) for c in shipped_chats(wire))
    assert narrow.scope_tree(Domain.MESSAGES, NARROW).count == len(INSIDE)
    assert full.scope_tree(Domain.MESSAGES, NARROW).root() == (
        narrow.scope_tree(Domain.MESSAGES, NARROW).root()
    )
    assert full.tree(Domain.MESSAGES).count == 60 + len(
        [m for m in MESSAGES[60:] if m.msg_id in INSIDE]
    )
    assert narrow.refused_out_of_scope == 0


@pytest.mark.parametrize("on_disk", [False, True], ids=["memory", "rocksdb"])
def test_a_range_listing_holds_only_the_scope_asked_for(on_disk: bool, store: ChatDb) -> None:
    """What a sketch is built from: ``ids_in_range`` over a scope narrower than the replica's
    lists the ids of that scope's chats only (a full replica's range read, filtered)."""
    replica = DbReplica(store, admit_all=True) if on_disk else MemoryReplica(admit_all=True)
    holding(replica, MESSAGES)
    every = replica.ids_in_range(Domain.MESSAGES, 0, 1 << 16, None, EVERYTHING)
    listed = replica.ids_in_range(Domain.MESSAGES, 0, 1 << 16, None, NARROW)
    ids = {listed[i : i + 32] for i in range(0, len(listed), 32)}
    assert len(every) == 32 * len(MESSAGES)
    assert ids == INSIDE and len(listed) == 32 * len(INSIDE)


def test_one_id_outside_a_narrowed_scope_is_not_taken_by_the_shortcut() -> None:
    """The full initiator's roots differ from the scoped responder's by one message, of a
    chat outside the responder's scope: the summed cells name it, but the responder narrowed
    the session and must not ask for it (the initiator, not yet told the intersection, would
    ship it: out_of_scope). It descends, names the intersection, and they agree there."""
    outside = next(m for m in MESSAGES if not NARROW.holds_chat(m.chat_id))
    full = holding(MemoryReplica(admit_all=True), [outside])
    narrow = MemoryReplica(admit_all=True, scope=NARROW)
    wire = Wire()
    result = run_session(full, narrow, on_frame=wire)
    assert result.error is None and result.converged
    assert wire.records("initiator") == [] and result.initiator.scope == NARROW
    assert not narrow.messages


def test_one_id_inside_an_unnarrowed_scope_takes_the_shortcut() -> None:
    """The same with a scoped initiator and a full responder: the responder holds every shard
    the initiator offered, so nothing narrows and the one id moves without a descent."""
    inside = next(m for m in MESSAGES if m.msg_id in INSIDE)
    full = holding(MemoryReplica(admit_all=True), [inside])
    narrow = MemoryReplica(admit_all=True, scope=NARROW)
    wire = Wire()
    result = run_session(narrow, full, on_frame=wire)
    assert result.error is None and result.converged
    assert not any(isinstance(f, Nodes) for _, f in wire.frames)  # no descent
    assert inside.msg_id in narrow.messages


@pytest.mark.parametrize("on_disk", [False, True], ids=["memory", "rocksdb"])
def test_a_session_equal_over_the_intersection_ends_at_the_top_level(
    on_disk: bool, store: ChatDb
) -> None:
    """The full initiator's roots cover chats the narrow responder does not hold, so they
    differ from the intersection's; every top node of the intersection is equal, so the
    initiator ends the session there, converged: HELLO, NODES, DONE — no sketch, no pass 2.
    A small set is listed whole over the intersection instead: HELLO, SKETCH, DONE. With one
    message of the intersection missing it descends as before."""
    full = holding(MemoryReplica(admit_all=True), MESSAGES)
    narrow_side = DbReplica(store, admit_all=True, scope=NARROW) if on_disk else None
    narrow = holding(narrow_side or MemoryReplica(admit_all=True, scope=NARROW), MESSAGES)
    for config, first in ((SyncConfig(listings=False), "Nodes"), (None, "Sketches")):
        wire = Wire()
        result = run_session(full, narrow, config=config, on_frame=wire)
        assert result.error is None and result.converged
        assert result.responder.converged
        assert [type(f).__name__ for _, f in wire.frames] == ["Hello", first, "Done"]
        assert result.initiator.stats.passes == 1 and not wire.records("initiator")
    missing = next(m for m in MESSAGES if m.msg_id in INSIDE)
    behind = holding(
        MemoryReplica(admit_all=True, scope=NARROW), [m for m in MESSAGES if m != missing]
    )
    wire = Wire()
    result = run_session(full, behind, on_frame=wire)
    assert result.error is None and result.converged
    assert missing.msg_id in behind.messages and len(wire.frames) > 3


def test_an_initiator_that_caught_up_since_its_hello_closes_the_pass_as_before() -> None:
    """Unnarrowed, the initiator's top nodes can all equal the responder's when another
    session wrote the records it lacked between its HELLO and the responder's NODES (a
    catch-up from several peers). Ending there with DONE made the responder abort the
    session (``unexpected_frame``, penalty points); the pass goes on and converges."""
    full = holding(MemoryReplica(admit_all=True), MESSAGES)
    behind = holding(MemoryReplica(admit_all=True), MESSAGES[:-3])
    initiator = SyncSession(SessionRole.INITIATOR, behind, now_ms=0, salt_seed=b"i")
    responder = SyncSession(SessionRole.RESPONDER, full, now_ms=0, salt_seed=b"r")
    frame = responder.receive(initiator.start(0), 0)  # NODES: the roots differed
    holding(behind, MESSAGES[-3:])  # another session brought them meanwhile
    while frame is not None:
        frame = initiator.receive(frame, 0)
        if frame is not None:
            frame = responder.receive(frame, 0)
    assert initiator.error is None and responder.error is None
    assert initiator.converged and responder.converged
