"""The simulated replica against sync's MemoryReplica; rollback, the waiting room, GC, the
message rule and the planted rules."""

from __future__ import annotations

import random

import pytest

from sim import retention_model
from sim.bugs import Bug, OffByOneTree, rules_for
from sim.replica import IDENTITY, MEMBERS, MESSAGES, ShardContext, SimReplica
from sim.trees import SimTree, SparseMerkleTree
from store.hlc import Hlc, HlcClock
from store.ops import MembershipAction, MembershipOp
from store.records import IdentityRecord, MsgV1, Role
from store.signing import key_from_seed, public_key, user_id_from_key
from sync.frames import Domain
from sync.merkle import MerkleTree
from sync.replica import MemoryReplica, Record

KEYS = [key_from_seed(bytes([0x07 + i]) * 32) for i in range(3)]
USERS = [user_id_from_key(public_key(k)) for k in KEYS]
CHATS = [bytes([0xC0 + i]) * 32 for i in range(2)]
ADD, REMOVE, LEAVE = MembershipAction.ADD, MembershipAction.REMOVE, MembershipAction.LEAVE
MESSAGES_POOL = [
    MsgV1.create(KEYS[i % 3], CHATS[i % 2], Hlc(1_000 + i), b"m%d" % i) for i in range(40)
]


def _op(chat: int, user: int, action: MembershipAction, stamp: int) -> MembershipOp:
    """A member op (unchecked: MemoryReplica trusts what it is given; sessions verify)."""
    actor = KEYS[user] if action is LEAVE else KEYS[0]
    return MembershipOp.create(actor, CHATS[chat], USERS[user], action, Hlc(stamp), Role(0))


def _records(rng: random.Random, n: int) -> list[Record]:
    out: list[Record] = []
    for _ in range(n):
        roll = rng.random()
        if roll < 0.5:
            out.append(rng.choice(MESSAGES_POOL))
        elif roll < 0.8:
            action = rng.choice([ADD, ADD, REMOVE, LEAVE])
            stamp = rng.choice([900, 1_005, 1_010, 1_020, 1_030])
            out.append(_op(rng.randrange(2), rng.randrange(3), action, stamp))
        else:
            blob = b"blob-%d" % rng.randrange(3)
            out.append(IdentityRecord(rng.choice(USERS), Hlc(rng.choice([3, 4])), blob))
    return out


def _domain(record: Record) -> Domain:
    if isinstance(record, MsgV1):
        return MESSAGES
    return MEMBERS if isinstance(record, MembershipOp) else IDENTITY


def _replica(bug: Bug | None = None) -> SimReplica:
    return SimReplica(ShardContext(120_000), rules_for(bug), HlcClock())


def _roots(replica: object) -> list[tuple[bytes, int]]:
    return [replica.tree(d).root() for d in Domain]  # type: ignore[attr-defined]


def _state(replica: MemoryReplica) -> tuple[object, ...]:
    return (
        _roots(replica),
        replica.messages,
        replica.member_ops,
        replica.members,
        replica.histories,
        replica.dm_parties,
        replica.identities,
        replica.visible_ids(),
    )


@pytest.mark.parametrize("seed", range(25))
def test_agrees_with_memory_replica_record_for_record(seed: int) -> None:
    rng = random.Random(seed)
    ours, theirs = _replica(), MemoryReplica()
    for record in _records(rng, 60):
        assert ours.apply(_domain(record), [record]) == theirs.apply(_domain(record), [record])
    assert _state(ours) == _state(theirs)
    assert ours.waiting.waiting() == theirs.waiting.waiting()
    for domain in Domain:
        assert sorted(ours.record_ids(domain)) == sorted(theirs.record_ids(domain))
        for bucket in {(i[0] << 8) | i[1] for i in theirs.record_ids(domain)}:
            assert ours.bucket_ids(domain, bucket, None) == theirs.bucket_ids(domain, bucket, None)
        ids = theirs.record_ids(domain)
        assert ours.get_records(domain, ids, None) == theirs.get_records(domain, ids, None)


def test_sparse_and_sim_trees_are_merkle_trees() -> None:
    ids = [m.msg_id for m in MESSAGES_POOL]
    reference = MerkleTree.from_ids(ids)
    for tree in (SimTree(), SparseMerkleTree()):
        for record_id in ids:
            tree.insert(record_id)
        tree.remove(ids[0])
        tree.insert(ids[0])
        assert tree.root() == reference.root()
        salt = b"s" * 16
        for depth in range(5):
            indexes = list(range(min(16**depth, 300)))
            assert tree.hashes(depth, indexes, salt, 4) == reference.hashes(depth, indexes, salt, 4)
        assert all(tree.cell(b) == reference.cell(b) for b in range(0, 65_536, 97))


@pytest.mark.parametrize("seed", range(10))
def test_crash_rolls_back_exactly_the_unflushed_writes(seed: int) -> None:
    """Member ops included: the rows and histories they touched are folded again."""
    rng = random.Random(seed)
    replica, durable = _replica(), MemoryReplica()
    first, second = _records(rng, 30), _records(rng, 30)
    replica.t_ms = 100
    for record in first:
        replica.apply(_domain(record), [record])
        durable.apply(_domain(record), [record])
    replica.flush()
    replica.t_ms = 200
    for record in second:
        replica.apply(_domain(record), [record])
    replica.crash(flushed_at=150)
    assert _state(replica)[:-1] == _state(durable)[:-1]
    assert replica.visible_ids() == durable.visible_ids()
    assert len(replica.waiting) == 0  # in memory: lost with the process
    for domain in Domain:
        assert replica.tree(domain).root() == MerkleTree.from_ids(replica.record_ids(domain)).root()


def test_a_crash_takes_back_an_op_and_what_it_admitted() -> None:
    replica = _replica()
    post = MESSAGES_POOL[0]  # user 0 in chat 0, at 1000
    replica.t_ms = 100
    replica.apply(MEMBERS, [_op(0, 0, ADD, 900)])
    replica.flush()
    replica.t_ms = 200
    replica.apply(MEMBERS, [_op(0, 0, REMOVE, 950)])
    replica.apply(MESSAGES, [post])
    assert post.msg_id in replica.messages and not replica.is_visible(post)
    assert replica.crash(flushed_at=150) == 2
    assert post.msg_id not in replica.messages
    assert replica.member_active((CHATS[0], USERS[0]))
    assert len(replica.member_ops) == 1 and replica.histories[(CHATS[0], USERS[0])].removes == ()


def test_a_message_waits_for_the_op_that_admits_it() -> None:
    replica = _replica()
    post = MESSAGES_POOL[3]  # user 0 in chat 1, at 1003
    assert replica.apply(MESSAGES, [post]) == 0
    assert post.msg_id in replica.waiting and replica.tree(MESSAGES).root()[1] == 0
    assert replica.apply(MEMBERS, [_op(1, 0, ADD, 1_004)]) == 1  # too late: still waiting
    assert post.msg_id in replica.waiting
    assert replica.apply(MEMBERS, [_op(1, 0, ADD, 1_003)]) == 2  # the op, and the message
    assert replica.is_visible(post) and len(replica.waiting) == 0


def test_gc_collects_old_messages_and_counts_resurrections() -> None:
    replica = _replica()
    replica.apply(MEMBERS, [_op(c, u, ADD, 900) for c in range(2) for u in range(3)])
    for msg in MESSAGES_POOL:
        replica.apply(MESSAGES, [msg])
    removed = retention_model.run_gc(replica, now_ms=1_020, retention_ms=0, grain_ms=10)
    assert removed == 21  # physical 1000..1020: the cutoff 1020 is already on the grain
    assert replica.horizon == 1_020
    assert all(m.hlc.physical_ms > 1_020 for m in replica.messages.values())
    assert replica.tree(MESSAGES).root() == MerkleTree.from_ids(replica.messages).root()
    assert replica.counters.resurrected == 0
    gc_bug = _replica(Bug.GC_RESURRECTION)
    gc_bug.apply(MEMBERS, [_op(1, 0, ADD, 900)])
    retention_model.run_gc(gc_bug, now_ms=1_020, retention_ms=0, grain_ms=10)
    gc_bug.apply(MESSAGES, [MESSAGES_POOL[3]])  # below the horizon: the checker counts it
    assert gc_bug.counters.resurrected == 1
    assert retention_model.cutoff(2_345, 1_000, 0, grain_ms=100) == 1_300
    assert retention_model.cutoff(2_345, 1_000, 1_500, grain_ms=100) == 1_500


def test_a_message_leaving_the_waiting_room_below_the_horizon_is_not_stored() -> None:
    replica = _replica()
    replica.apply(MESSAGES, [MESSAGES_POOL[3]])  # waits: no op yet
    retention_model.run_gc(replica, now_ms=1_020, retention_ms=0, grain_ms=10)
    replica.apply(MEMBERS, [_op(1, 0, ADD, 900)])
    assert not replica.messages and replica.counters.resurrected == 0


def test_far_future_records_from_a_session_are_refused() -> None:
    replica = _replica()
    replica.now_ms = 1_000
    ahead = MsgV1.create(KEYS[0], CHATS[0], Hlc(1_000 + 120_001), b"future")
    future_op = _op(0, 0, ADD, 1_000 + 120_001)
    assert replica.apply(MEMBERS, [future_op]) == 0
    assert replica.apply(MESSAGES, [ahead]) == 0
    assert replica.counters.rejected_drift == 2
    assert not replica.member_ops and len(replica.waiting) == 0
    unchecked = _replica(Bug.NO_MAX_OFFSET)
    unchecked.clock = HlcClock(max_offset_ms=1 << 47)
    unchecked.now_ms = 1_000
    assert unchecked.apply(MEMBERS, [future_op]) == 1
    assert unchecked.apply(MESSAGES, [ahead]) == 1


def test_planted_rules_differ_from_the_real_ones_only_where_they_should() -> None:
    user, t = USERS[0], Hlc(5)
    real, lww = _replica(), _replica(Bug.LWW_ARRIVAL)
    for replica in (real, lww):
        replica.apply(IDENTITY, [IdentityRecord(user, t, b"b")])
        replica.apply(IDENTITY, [IdentityRecord(user, t, b"a")])  # a tie: bytes decide
    assert real.identities[user] == (t, b"b")
    assert lww.identities[user] == (t, b"a")  # the last arrival won

    key = (CHATS[0], USERS[1])
    tie = [_op(0, 1, ADD, 5), _op(0, 1, REMOVE, 5)]
    real, inverted = _replica(), _replica(Bug.ADD_REMOVE_INVERTED)
    for replica in (real, inverted):
        replica.apply(MEMBERS, tie)
    assert real.member_active(key) is False  # remove wins a tie
    assert inverted.member_active(key) is True
    assert real.member_row_version(key) != inverted.member_row_version(key)

    ids = [m.msg_id for m in MESSAGES_POOL]
    off = OffByOneTree()
    for record_id in ids:
        off.insert(record_id)
    reference = MerkleTree.from_ids(ids)
    assert off.root() == reference.root()  # roots agree ...
    assert any(off.cell(b) != reference.cell(b) for b in range(65_536))  # ... leaves do not


def test_planted_authorization_rules() -> None:
    """User 0 in chat 0: added at 900, removed at 1005, added again at 1020. Posts at 1000
    (shown), 1010 (hidden: in the gap) and 1030 (shown)."""
    shown, gap, again = (MsgV1.create(KEYS[0], CHATS[0], Hlc(t), b"p") for t in (1000, 1010, 1030))
    ops = [_op(0, 0, ADD, 900), _op(0, 0, REMOVE, 1_005), _op(0, 0, ADD, 1_020)]
    want = {shown.msg_id, again.msg_id}
    real, ignoring, arrival = (
        _replica(b) for b in (None, Bug.AUTHZ_NO_REMOVALS, Bug.AUTHZ_ARRIVAL)
    )
    for replica in (real, ignoring, arrival):
        replica.apply(MEMBERS, ops[:1])
        replica.apply(MESSAGES, [shown, gap])  # the removal has not arrived yet
        replica.apply(MEMBERS, ops[1:2])
        replica.apply(MESSAGES, [again])  # arrives while the row says: removed
        replica.apply(MEMBERS, ops[2:])
        assert set(replica.messages) == want | {gap.msg_id}  # admission is the real rule
    assert real.visible_ids() == want
    assert ignoring.visible_ids() == want | {gap.msg_id}  # the gap post shows
    assert arrival.visible_ids() == {shown.msg_id, gap.msg_id}  # decided once, on arrival
