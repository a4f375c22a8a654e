"""Replicas agree: the same ops in any order, duplicated or batched, give the same synced state.

What is compared is everything sync ships: the set of (msg_id, encoded message), every member
row (tombstones included; these rows are unsigned, so seen_member stays empty — sync ships
signed member ops, tests/sync/test_replica_agreement.py), every identity row with its
seen_identity index, and the replicated part of seen_msg (msg_id -> chat and HLC).

Local-only fields, which MAY differ between replicas and are therefore not compared:

* the per-chat ``seq`` inside message keys (and so the seq bytes of seen_msg values and the
  ``seq`` of StoredMessage): it numbers messages in the order *this* replica stored them;
* ``ChatMeta.last_seq``: the same local counter;
* whether a chats_meta row exists at all (a replica that saw an add before a remove writes
  one; a replica that saw the remove first never had an active member to record);
* the inbox: its ``last_seq`` is that local counter, and it is never synced.

The replicated parts of ChatMeta (newest message, active members, membership hash) are
functions of the synced state and are compared.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from store import ChatDb, ChatMeta, IdentityRecord, MemberInfo, MsgV1
from store.merge import add_op_state, merge_member_states, remove_op_state
from store.records import compute_identity_record_id

from store_support import (
    CHATS,
    TMP_ROOT,
    USERS,
    dump_all,
    fresh_db,
    member_infos,
    member_rows,
    messages,
    msg_ids,
    removal_stamps,
    replicated_state,
    roles,
    small_config,
    small_hlcs,
)

SYNC_CHATS = CHATS[:2]
SYNC_USERS = USERS[:3]

chat_users = st.tuples(st.sampled_from(SYNC_CHATS), st.sampled_from(SYNC_USERS))
small_messages = messages(chats=SYNC_CHATS, stamps=small_hlcs(5, 2))

# An op: ("msg", MsgV1) | ("add", chat, user, role, hlc) | ("remove", chat, user, hlc)
#      | ("record", chat, user, MemberInfo) | ("identity", user, hlc, blob)
ops = st.one_of(
    st.tuples(st.just("msg"), small_messages),
    st.builds(lambda cu, r, h: ("add", *cu, r, h), chat_users, roles, small_hlcs()),
    st.builds(lambda cu, h: ("remove", *cu, h), chat_users, removal_stamps()),
    st.builds(lambda cu, i: ("record", *cu, i), chat_users, member_infos),
    st.builds(
        lambda u, h, b: ("identity", u, h, b),
        st.sampled_from(SYNC_USERS),
        small_hlcs(3, 1),
        st.binary(max_size=2),
    ),
)


def member_state(op: tuple[Any, ...]) -> tuple[bytes, bytes, MemberInfo]:
    if op[0] == "add":
        return op[1], op[2], add_op_state(op[3], op[4])
    if op[0] == "remove":
        return op[1], op[2], remove_op_state(op[3])
    return op[1], op[2], op[3]


def apply_one(db: ChatDb, op: tuple[Any, ...]) -> None:
    """One op through the single-record API."""
    kind = op[0]
    if kind == "msg":
        db.put_message(op[1])
    elif kind == "add":
        db.add_member_synced(op[1], op[2], op[3], op[4])
    elif kind == "remove":
        db.remove_member_synced(op[1], op[2], op[3])
    elif kind == "record":
        db.apply_member_record_synced(op[1], op[2], op[3])
    else:
        db.put_identity(op[1], op[2], op[3])


def apply_batched(db: ChatDb, batch: list[tuple[Any, ...]]) -> None:
    """Many ops through the batch APIs (one WriteBatch per domain)."""
    db.put_messages([op[1] for op in batch if op[0] == "msg"])
    db.apply_member_states(
        [member_state(op) for op in batch if op[0] in ("add", "remove", "record")]
    )
    db.put_identities([IdentityRecord(*op[1:]) for op in batch if op[0] == "identity"])


def replicated_meta(db: ChatDb, chat: bytes) -> tuple[Any, ...]:
    meta = db.get_chat_meta(chat) or ChatMeta()
    return (
        meta.last_ts,
        meta.last_msg_id,
        meta.last_msg_ts,
        meta.members,
        meta.membership_hash,
    )


def assert_replicas_agree(a: ChatDb, b: ChatDb) -> None:
    assert replicated_state(a) == replicated_state(b)
    for chat in SYNC_CHATS:
        assert replicated_meta(a, chat) == replicated_meta(b, chat)
        assert a.list_members_with_info(chat) == b.list_members_with_info(chat)
    for user in SYNC_USERS:
        assert a.get_identity(user) == b.get_identity(user)


@settings(max_examples=25)
@given(st.lists(ops, max_size=30), st.data())
def test_two_replicas_agree_whatever_the_order(
    op_list: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    # replica B: another order, some ops twice, applied in random-sized batches
    extra = data.draw(st.lists(st.sampled_from(op_list), max_size=8)) if op_list else []
    shuffled = data.draw(st.permutations(op_list + extra))
    with fresh_db() as a, fresh_db() as b:
        for op in op_list:
            apply_one(a, op)
        i = 0
        while i < len(shuffled):
            size = data.draw(st.integers(1, 6))
            apply_batched(b, shuffled[i : i + size])
            i += size
        assert_replicas_agree(a, b)
        # and the content is what the ops say
        sent = {op[1].msg_id: op[1].encoded for op in op_list if op[0] == "msg"}
        assert replicated_state(a)["messages"] == sent
        # replaying everything once more changes nothing synced (idempotence on disk)
        before = dump_all(b)
        apply_batched(b, op_list)
        assert dump_all(b) == before


class ReplicaPair(RuleBasedStateMachine):
    """Replica A applies ops as they happen; B gets them later, shuffled, duplicated, batched.

    A is checked against a pure model after every step; whenever B has caught up, and at
    the end, the two must agree on everything synced.
    """

    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory(prefix="chatdb-replicas-", dir=TMP_ROOT)
        self.path_a = str(Path(self._tmp.name) / "a")
        self.a = ChatDb(small_config(self.path_a))
        self.b = ChatDb(small_config(str(Path(self._tmp.name) / "b")))
        self.pending: list[tuple[Any, ...]] = []  # applied to A, not yet delivered to B
        self.delivered: list[tuple[Any, ...]] = []
        self.msgs: dict[bytes, bytes] = {}
        self.members: dict[tuple[bytes, bytes], MemberInfo] = {}
        self.identities: dict[bytes, tuple[Any, bytes]] = {}

    def _local(self, op: tuple[Any, ...]) -> None:
        apply_one(self.a, op)
        self.pending.append(op)
        if op[0] == "msg":
            msg: MsgV1 = op[1]
            self.msgs[msg.msg_id] = msg.encoded
        elif op[0] == "identity":
            user, new = op[1], (op[2], op[3])
            self.identities[user] = max(self.identities.get(user, new), new)
        else:
            chat, user, state = member_state(op)
            merged = merge_member_states(self.members.get((chat, user)), state)
            assert merged is not None
            self.members[(chat, user)] = merged

    @rule(msg=small_messages)
    def put_message(self, msg: MsgV1) -> None:
        self._local(("msg", msg))

    @rule(cu=chat_users, role=roles, hlc=small_hlcs())
    def add_member(self, cu: tuple[bytes, bytes], role: Any, hlc: Any) -> None:
        self._local(("add", *cu, role, hlc))

    @rule(cu=chat_users, hlc=removal_stamps())
    def remove_member(self, cu: tuple[bytes, bytes], hlc: Any) -> None:
        self._local(("remove", *cu, hlc))

    @rule(cu=chat_users, info=member_infos)
    def apply_member_record(self, cu: tuple[bytes, bytes], info: MemberInfo) -> None:
        self._local(("record", *cu, info))

    @rule(user=st.sampled_from(SYNC_USERS), hlc=small_hlcs(3, 1), blob=st.binary(max_size=2))
    def put_identity(self, user: bytes, hlc: Any, blob: bytes) -> None:
        self._local(("identity", user, hlc, blob))

    @precondition(lambda self: bool(self.pending))
    @rule(data=st.data())
    def deliver_some(self, data: st.DataObject) -> None:
        """Gossip: some pending ops reach B in another order, maybe with old ones again."""
        chosen = data.draw(st.lists(st.sampled_from(self.pending), min_size=1, unique=True))
        again = (
            data.draw(st.lists(st.sampled_from(self.delivered), max_size=3))
            if self.delivered
            else []
        )
        batch = data.draw(st.permutations(chosen + again))
        if data.draw(st.booleans()):
            apply_batched(self.b, batch)
        else:
            for op in batch:
                apply_one(self.b, op)
        self.pending = [op for op in self.pending if op not in chosen]
        self.delivered += chosen

    @rule()
    def reopen_a(self) -> None:
        """Close and reopen A: nothing lost, no stale chats_meta cache."""
        before = dump_all(self.a)
        self.a.close()
        self.a = ChatDb(small_config(self.path_a))
        assert dump_all(self.a) == before

    @invariant()
    def a_matches_the_model(self) -> None:
        assert replicated_state(self.a)["messages"] == self.msgs
        assert set(msg_ids(self.a)) == set(self.msgs)
        rows = member_rows(self.a)
        assert rows == self.members
        # unsigned rows are local folds: nothing is indexed for sync (it ships signed ops)
        assert dict(self.a.iter_all("seen_member")) == {}
        for chat in SYNC_CHATS:
            active = sorted(u for (c, u), i in self.members.items() if c == chat and i.active)
            assert self.a.list_members(chat) == active
        for user in SYNC_USERS:
            assert self.a.get_identity(user) == self.identities.get(user)
        assert dict(self.a.iter_all("seen_identity")) == {
            compute_identity_record_id(u, *w): u for u, w in self.identities.items()
        }

    @invariant()
    def caught_up_replicas_agree(self) -> None:
        if not self.pending:
            assert_replicas_agree(self.a, self.b)

    def teardown(self) -> None:
        try:
            apply_batched(self.b, list(reversed(self.pending)))
            self.pending = []
            assert_replicas_agree(self.a, self.b)
        finally:
            self.a.close()
            self.b.close()
            self._tmp.cleanup()


ReplicaPair.TestCase.settings = settings(max_examples=15, stateful_step_count=20)
TestReplicaPair = ReplicaPair.TestCase
