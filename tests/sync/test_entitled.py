"""Scope authentication (sync/entitled.py, SECURITY.md "Scopes"): a peer claiming every shard
is served only the shards it is entitled to — those whose members name it as a home node,
or that the R rule gives it — whichever side opens the session."""

from __future__ import annotations

from sync.entitled import PeerScoped, entitled_shards
from sync.loopback import run_session
from sync.replica import MemoryReplica
from sync.scope import Scope, shard_of

from sync_support import CHATS, member, message

S = 3
SHARDS = [shard_of(c, S) for c in CHATS]
NODE, OTHER = b"harvester-node", b"other-node"
ALICE, BOB = b"\x0a" * 20, b"\x0b" * 20


def test_a_peer_is_entitled_to_the_shards_its_served_members_are_in() -> None:
    homes = [(ALICE, (NODE,)), (BOB, (OTHER, NODE))]
    rows = [
        (CHATS[0], ALICE, True),
        (CHATS[1], ALICE, False),  # removed: no longer a reason
        (CHATS[2], BOB, True),
        (CHATS[1], b"\x0c" * 20, True),  # names no home node
    ]
    entitled = entitled_shards(homes, rows, S)
    assert entitled[NODE] == {SHARDS[0], SHARDS[2]}
    assert entitled[OTHER] == {SHARDS[2]} and set(entitled) == {NODE, OTHER}


def held(replica: MemoryReplica) -> set[bytes]:
    return {m.chat_id for m in replica.messages.values()}


def test_a_harvester_claiming_everything_gets_only_its_entitled_shards() -> None:
    ours = MemoryReplica(admit_all=True)
    ours.apply_ops([member(0, 0, 990), member(1, 0, 990), *[message(n) for n in range(30)]])
    assert held(ours) == set(CHATS)
    assert SHARDS[0] != SHARDS[1]
    bound = Scope(frozenset({SHARDS[1]}), S)
    for we_open in (False, True):
        harvester = MemoryReplica(admit_all=True)  # claims every shard
        view = PeerScoped(ours, bound)
        result = run_session(view, harvester) if we_open else run_session(harvester, view)
        assert result.converged and result.error is None
        assert held(harvester) == {CHATS[1]}  # nothing of the other shards
        # member ops follow their chat: CHATS[1]'s only; the bound has no user shard, so
        # the index ships nothing (the harvester indexes the op it took as MEMBERS)
        assert {op.chat_id for op in harvester.member_ops.values()} == {CHATS[1]}
        assert {op.chat_id for op in harvester.index.values()} == {CHATS[1]}


def test_without_a_bound_the_same_harvester_gets_everything() -> None:
    """The control: the bound above is what keeps the other shards (a test that can fail)."""
    ours = MemoryReplica(admit_all=True)
    ours.apply_ops([message(n) for n in range(30)])
    harvester = MemoryReplica(admit_all=True)
    assert run_session(harvester, PeerScoped(ours, Scope())).converged
    assert held(harvester) == set(CHATS)
