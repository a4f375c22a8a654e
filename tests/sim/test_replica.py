"""The simulated replica against sync's MemoryReplica; rollback, the waiting room, GC, the
message rule and the planted rules."""

from __future__ import annotations

import random

import pytest

from sim import retention_model
from sim.bugs import Bug, OffByOneTree, rules_for
from sim.replica import DELETES, IDENTITY, MEMBERS, MESSAGES, ShardContext, SimReplica
from sim.trees import IndexedTree, SimTree, TreeCache
from store.hlc import Hlc, HlcClock
from store.kinds import Claims, MessageView, Tombstone, reaction_payload
from store.ops import MembershipAction, MembershipOp
from store.records import IdentityRecord, MessageKind, MsgV1, Role
from store.signing import key_from_seed, public_key, user_id_from_key
from sync.buckets import Buckets
from sync.frames import Domain
from sync.merkle import MerkleTree
from sync.replica import MemoryReplica, Record
from sync.scope import Scope, shard_of

KEYS = [key_from_seed(bytes([0x07 + i]) * 32) for i in range(3)]
USERS = [user_id_from_key(public_key(k)) for k in KEYS]
CHATS = [bytes([0xC0 + i]) * 32 for i in range(2)]
ADD, REMOVE, LEAVE = MembershipAction.ADD, MembershipAction.REMOVE, MembershipAction.LEAVE
MESSAGES_POOL = [
    MsgV1.create(KEYS[i % 3], CHATS[i % 2], Hlc(1_000 + i), b"m%d" % i) for i in range(40)
]


def _op(
    chat: int, user: int, action: MembershipAction, stamp: int, role: Role = Role.PARTICIPANT
) -> MembershipOp:
    """A member op (unchecked: MemoryReplica trusts what it is given; sessions verify)."""
    actor = KEYS[user] if action is LEAVE else KEYS[0]
    return MembershipOp.create(actor, CHATS[chat], USERS[user], action, Hlc(stamp), role)


def _about(user: int, stamp: int, kind: MessageKind, target: MsgV1, payload: bytes) -> MsgV1:
    """A message of ``kind`` by ``user`` that refers to ``target``, in its chat."""
    return MsgV1.create(
        KEYS[user], target.chat_id, Hlc(stamp), payload, kind=kind, ref=target.msg_id
    )


def _kinds_about(i: int, target: MsgV1) -> list[MsgV1]:
    """Around post ``i``: its author's two edits and another's, a delete by its author
    and one by another user (valid only if that user is an admin by then; user 0 never
    is here), a lying delete, a reaction and its retraction, a receipt."""
    author, other, t = i % 3, (i + 1) % 3, 1_000 + i
    claims = Claims.of(target).encode()
    lie = Claims(USERS[other], target.hlc, target.kind).encode()
    edit = MessageKind.EDIT
    return [
        _about(author, t + 50, edit, target, b"first edit"),
        _about(author, t + 60, edit, target, b"second edit"),
        _about(other, t + 70, edit, target, b"not the author's"),
        _about(author, t + 80, MessageKind.DELETE, target, claims),
        _about(other, t + 90, MessageKind.DELETE, target, claims),
        _about(other, t + 95, MessageKind.DELETE, target, lie),
        _about(other, t + 40, MessageKind.REACTION, target, reaction_payload(b"+1")),
        _about(other, t + 45, MessageKind.REACTION, target, reaction_payload(b"+1", retract=True)),
        _about(other, t + 30, MessageKind.READ_RECEIPT, target, target.hlc.to_bytes()),
    ]


KINDS_POOL = [m for i, post in enumerate(MESSAGES_POOL[:12]) for m in _kinds_about(i, post)]


def _records(rng: random.Random, n: int) -> list[Record]:
    out: list[Record] = []
    for _ in range(n):
        roll = rng.random()
        if roll < 0.35:
            out.append(rng.choice(MESSAGES_POOL))
        elif roll < 0.55:
            out.append(rng.choice(KINDS_POOL))
        elif roll < 0.8:
            action = rng.choice([ADD, ADD, REMOVE, LEAVE])
            stamp = rng.choice([900, 1_005, 1_010, 1_020, 1_030])
            role = Role.ADMIN if action is ADD and rng.random() < 0.2 else Role.PARTICIPANT
            user = rng.randrange(3)
            out.append(_op(rng.randrange(2), user, action, stamp, role if user else Role(0)))
        else:
            blob = b"blob-%d" % rng.randrange(3)
            out.append(IdentityRecord(rng.choice(USERS), Hlc(rng.choice([3, 4])), blob))
    return out


def _domain(record: Record) -> Domain:
    if isinstance(record, MsgV1):
        return DELETES if record.kind is MessageKind.DELETE else MESSAGES
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
        replica.parties,
        replica.identities,
        replica.deletes,
        replica.erased,
        replica.admin_states,
        [replica.view(chat) for chat in CHATS],
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


def test_a_sim_tree_is_a_merkle_tree() -> None:
    ids = [m.msg_id for m in MESSAGES_POOL]
    reference = MerkleTree.from_ids(ids)
    tree = SimTree()
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


def test_an_indexed_tree_reads_as_the_merkle_tree_of_what_its_replica_holds() -> None:
    """Its lower levels come from the shard's index, where other replicas' ids are too."""
    ids = [m.msg_id for m in MESSAGES_POOL]
    known, held = Buckets(), dict.fromkeys(ids[: len(ids) // 2])
    for record_id in ids:  # the other half: listed by other replicas of the shard
        known.add(record_id)
    tree = IndexedTree(TreeCache(), known)
    tree.hold(held)
    for record_id in held:
        tree.insert(record_id)
    del held[ids[0]]
    tree.remove(ids[0])
    reference = MerkleTree.from_ids(held)
    assert tree.root() == reference.root() and tree.root_check() == reference.root_check()
    salt = b"s" * 16
    for depth in range(5):
        indexes = list(range(0, 16**depth, max(1, 16**depth // 300)))
        assert tree.hashes(depth, indexes, salt, 4) == reference.hashes(depth, indexes, salt, 4)
        assert all(tree.node(depth, i) == reference.node(depth, i) for i in indexes)
    buckets = sorted({(i[0] << 8) | i[1] for i in ids})
    assert tree.leaf_counts(buckets) == reference.leaf_counts(buckets)
    assert all(tree.cell(b) == reference.cell(b) for b in buckets)
    assert tree == reference and tree.copy() == reference
    with pytest.raises(ValueError, match="empty"):  # nothing under the node: out of step
        IndexedTree(TreeCache(), known).remove(ids[1])


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
    assert replica.crash(flushed_at=150) == 3  # the remove (as an op and in the index), the post
    assert post.msg_id not in replica.messages and len(replica.index) == 1
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


def _with_members() -> SimReplica:
    replica = _replica()
    replica.apply(MEMBERS, [_op(c, u, ADD, 900) for c in range(2) for u in range(3)])
    replica.flush()
    return replica


def _trees_match(replica: SimReplica) -> bool:
    return all(
        replica.tree(d).root() == MerkleTree.from_ids(replica.record_ids(d)).root() for d in Domain
    )


def test_a_crash_takes_back_a_delete_and_puts_its_erased_messages_back() -> None:
    post = MESSAGES_POOL[0]  # user 0 in chat 0, at 1000
    edit, _, _, delete, *_ = _kinds_about(0, post)
    replica = _with_members()
    replica.t_ms = 100
    replica.apply(MESSAGES, [post, edit])
    replica.flush()
    replica.t_ms = 200
    replica.apply(DELETES, [delete])
    assert not replica.messages.keys() & {post.msg_id, edit.msg_id}
    assert replica.erased == {post.msg_id, edit.msg_id}
    assert isinstance(replica.view(CHATS[0]).items[0], Tombstone)
    assert replica.crash(flushed_at=150) == 3  # the delete and two erasures
    assert replica.messages.keys() >= {post.msg_id, edit.msg_id}
    assert not replica.deletes and not replica.erased and _trees_match(replica)
    assert replica.view(CHATS[0]).items[0] == MessageView(post, edit)
    replica.apply(DELETES, [delete])  # it comes back by sync: erased again
    assert post.msg_id not in replica.messages and delete.msg_id in replica.deletes


def test_a_crash_forgets_what_an_unflushed_delete_refused() -> None:
    """A message refused on arrival (erased) under a delete the crash takes back may arrive
    again, and is stored; the delete, back by sync, erases it once more."""
    post = MESSAGES_POOL[0]
    delete = _kinds_about(0, post)[3]
    replica = _with_members()
    replica.t_ms = 200
    replica.apply(DELETES, [delete])
    assert replica.apply(MESSAGES, [post]) == 0 and post.msg_id in replica.erased
    replica.crash(flushed_at=150)
    assert not replica.erased and not replica.deletes
    assert replica.apply(MESSAGES, [post]) == 1
    replica.apply(DELETES, [delete])
    assert replica.erased == {post.msg_id} and replica.counters.resurrected_deleted == 0


def test_deletes_are_never_collected() -> None:
    post = MESSAGES_POOL[3]  # user 0 in chat 1, at 1003
    delete = _kinds_about(3, post)[3]  # at 1083
    replica = _with_members()
    replica.apply(MESSAGES, [post])
    replica.apply(DELETES, [delete])
    root = replica.tree(DELETES).root()
    retention_model.run_gc(replica, now_ms=5_000, retention_ms=0, grain_ms=10)
    assert replica.deletes.keys() == {delete.msg_id} and replica.tree(DELETES).root() == root
    late = _replica()  # a delete that waited for its add, released below the horizon: kept
    late.apply(DELETES, [delete])
    retention_model.run_gc(late, now_ms=5_000, retention_ms=0, grain_ms=10)
    late.apply(MEMBERS, [_op(1, 0, ADD, 900)])
    assert late.deletes.keys() == {delete.msg_id}


def test_planted_message_kind_rules() -> None:
    post = MESSAGES_POOL[0]  # user 0's; user 1 is no admin
    first, second, _, _, by_other, *_ = _kinds_about(0, post)
    real, anyone = _with_members(), _replica(Bug.ANYONE_MAY_DELETE)
    anyone.apply(MEMBERS, [_op(c, u, ADD, 900) for c in range(2) for u in range(3)])
    for replica in (real, anyone):
        replica.apply(MESSAGES, [post])
        replica.apply(DELETES, [by_other])
    assert post.msg_id in real.messages and post.msg_id not in anyone.messages
    # ... and once user 1 is an admin from before the delete, the real rule erases too
    real.apply(MEMBERS, [_op(0, 1, ADD, 950, Role.ADMIN)])
    assert post.msg_id not in real.messages

    real, by_arrival = _with_members(), _replica(Bug.EDIT_ARRIVAL_ORDER)
    by_arrival.apply(MEMBERS, [_op(c, u, ADD, 900) for c in range(2) for u in range(3)])
    for replica in (real, by_arrival):
        replica.apply(MESSAGES, [post, second, first])  # the later edit arrives first
    shown = [r.view(CHATS[0]).items[0] for r in (real, by_arrival)]
    assert [item.payload for item in shown if isinstance(item, MessageView)] == [
        b"second edit",
        b"first edit",
    ]


def test_a_crash_keeps_the_per_shard_trees_in_step() -> None:
    """A scoped session reads per-shard leaves (``sync.shards``): a delete taken back and the
    messages it had erased put back must move them too, or the intersection's tree claims a
    delete the replica no longer holds and no session ever sends it again (found by the
    scoped replay: one delete lost on one node of 100)."""
    post = MESSAGES_POOL[0]
    edit, _, _, delete, *_ = _kinds_about(0, post)
    replica = _with_members()
    shard = Scope(frozenset({shard_of(CHATS[0], 64)}), 64)
    assert replica.scope_tree(DELETES, shard).root()[1] == 0  # the leaves, built now
    replica.t_ms = 100
    replica.apply(MESSAGES, [post, edit])
    replica.flush()
    replica.t_ms = 200
    replica.apply(DELETES, [delete])
    assert replica.scope_tree(DELETES, shard).root()[1] == 1
    replica.crash(flushed_at=150)
    for domain in (MESSAGES, DELETES):
        held = replica.record_ids(domain)
        assert replica.scope_tree(domain, shard).root() == MerkleTree.from_ids(held).root()
