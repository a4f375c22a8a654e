"""The simulated replica against sync's MemoryReplica; rollback, GC and the planted rules."""

from __future__ import annotations

import random

import pytest

from sim import retention_model
from sim.bugs import Bug, OffByOneTree, rules_for
from sim.replica import IDENTITY, MEMBERS, MESSAGES, ShardContext, SimReplica
from sim.trees import SimTree, SparseMerkleTree
from store.hlc import Hlc, HlcClock
from store.records import IdentityRecord, MemberInfo, MemberRecord, MsgV1, Role
from store.signing import key_from_seed
from sync.frames import Domain
from sync.merkle import MerkleTree
from sync.replica import MemoryReplica, Record

KEY = key_from_seed(b"\x07" * 32)
CHATS = [bytes([0xC0 + i]) * 32 for i in range(2)]
USERS = [bytes([0x10 + i]) * 20 for i in range(3)]
MESSAGES_POOL = [MsgV1.create(KEY, CHATS[i % 2], Hlc(1_000 + i), b"m%d" % i) for i in range(40)]


def _records(rng: random.Random, n: int) -> list[Record]:
    out: list[Record] = []
    for _ in range(n):
        roll = rng.random()
        if roll < 0.5:
            out.append(rng.choice(MESSAGES_POOL))
        elif roll < 0.8:
            added = rng.choice([0, 5, 7, 9])
            removed = rng.choice([None, 5, 7, 8])
            info = MemberInfo(
                Role(rng.randrange(2)), Hlc(added), None if removed is None else Hlc(removed)
            )
            out.append(MemberRecord(rng.choice(CHATS), rng.choice(USERS), info))
        else:
            blob = b"blob-%d" % rng.randrange(3)
            out.append(IdentityRecord(rng.choice(USERS), Hlc(rng.choice([3, 4])), blob))
    return out


def _domain(record: Record) -> Domain:
    if isinstance(record, MsgV1):
        return MESSAGES
    return MEMBERS if isinstance(record, MemberRecord) else IDENTITY


def _replica(bug: Bug | None = None) -> SimReplica:
    return SimReplica(ShardContext(120_000), rules_for(bug), HlcClock())


def _roots(replica: object) -> list[tuple[bytes, int]]:
    return [replica.tree(d).root() for d in Domain]  # type: ignore[attr-defined]


@pytest.mark.parametrize("seed", range(25))
def test_agrees_with_memory_replica_record_for_record(seed: int) -> None:
    rng = random.Random(seed)
    ours, theirs = _replica(), MemoryReplica()
    for record in _records(rng, 60):
        assert ours.apply(_domain(record), [record]) == theirs.apply(_domain(record), [record])
    assert _roots(ours) == _roots(theirs)
    assert ours.messages == theirs.messages
    assert ours.members == theirs.members
    assert ours.identities == theirs.identities
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


def test_crash_rolls_back_exactly_the_unflushed_writes() -> None:
    rng = random.Random(1)
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
    assert replica.crash(flushed_at=150) > 0
    assert _roots(replica) == _roots(durable)
    assert replica.members == durable.members and replica.identities == durable.identities
    for domain in Domain:
        assert replica.tree(domain).root() == MerkleTree.from_ids(replica.record_ids(domain)).root()


def test_gc_collects_old_messages_and_counts_resurrections() -> None:
    replica = _replica()
    for msg in MESSAGES_POOL:
        replica.apply(MESSAGES, [msg])
    removed = retention_model.run_gc(replica, now_ms=1_020, retention_ms=0, grain_ms=10)
    assert removed == 21  # physical 1000..1020: the cutoff 1020 is already on the grain
    assert replica.horizon == 1_020
    assert all(m.hlc.physical_ms > 1_020 for m in replica.messages.values())
    assert replica.tree(MESSAGES).root() == MerkleTree.from_ids(replica.messages).root()
    assert replica.counters.resurrected == 0
    replica.apply(MESSAGES, [MESSAGES_POOL[3]])  # below the horizon: the checker counts it
    assert replica.counters.resurrected == 1
    assert retention_model.cutoff(2_345, 1_000, 0, grain_ms=100) == 1_300
    assert retention_model.cutoff(2_345, 1_000, 1_500, grain_ms=100) == 1_500


def test_far_future_records_from_a_session_are_refused() -> None:
    replica = _replica()
    replica.now_ms = 1_000
    ahead = MsgV1.create(KEY, CHATS[0], Hlc(1_000 + 120_001), b"future")
    assert replica.apply(MESSAGES, [ahead]) == 0
    assert replica.counters.rejected_drift == 1
    unchecked = _replica(Bug.NO_MAX_OFFSET)
    unchecked.clock = HlcClock(max_offset_ms=1 << 47)
    unchecked.now_ms = 1_000
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
    tie = [
        MemberRecord(*key, MemberInfo(Role.PARTICIPANT, t, None)),
        MemberRecord(*key, MemberInfo(Role.PARTICIPANT, Hlc(0), t)),
    ]
    real, inverted = _replica(), _replica(Bug.ADD_REMOVE_INVERTED)
    for replica in (real, inverted):
        replica.apply(MEMBERS, tie)
    assert real.member_active(key) is False  # remove wins a tie
    assert inverted.member_active(key) is True
    assert real.member_record_id(key) != inverted.member_record_id(key)

    ids = [m.msg_id for m in MESSAGES_POOL]
    off = OffByOneTree()
    for record_id in ids:
        off.insert(record_id)
    reference = MerkleTree.from_ids(ids)
    assert off.root() == reference.root()  # roots agree ...
    assert any(off.cell(b) != reference.cell(b) for b in range(65_536))  # ... leaves do not
