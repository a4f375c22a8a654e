"""Edits, deletes, reactions and receipts, decided alike by every replica (MESSAGES.md).

Posts, and edits, deletes (by authors, by admins, by others; true and lying about their
target), reactions, retractions and receipts of a few of them, with member ops (admin grants
among them), reach three ``DbReplica``s one by one or in batches, twice or never, and by
anti-entropy sessions between any two — cut short, on skewed clocks, across partitions —
while the retention GC runs on all of them. Once every pair has synced:

* the replicas hold the same records in all four domains (equal roots), and every message a
  valid delete erases is held by none of them;
* every chat's view — current payloads and edit marks, tombstones, reactions, read
  positions — is the same on all three and equals ``store.kinds.fold_chat`` (the rule)
  over everything delivered anywhere that the member ops admit and the GC kept.
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import rule
from test_authz_convergence import shown_by_the_rule
from three_replicas import three_replicas

from store import ChatDb, ChatDbConfig, MessageKind, MsgV1
from store.kinds import (
    ChatView,
    IsAdmin,
    MessageView,
    Tombstone,
    delete_is_valid,
    erases,
    fold_chat,
)
from store.ops import MembershipAction, MembershipOp, Op
from store.reads import UNREAD_CAP
from store.records import Role
from sync.loopback import run_session
from sync.protocol import SyncConfig
from sync.replica import DbReplica

from sync_support import (
    CHATS,
    MEMBER_OPS,
    USERS,
    delete_of,
    kinds,
    member,
    member_stamp,
    message,
    roots,
)

TMP = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
JOINED = [member(chat, user, member_stamp(0)) for chat in range(3) for user in range(4)]
# admin adds stamped among the posts and their deletes (1,000 + 7n + 1..30)
ADMIN_ADDS = st.builds(
    member, st.integers(0, 2), st.integers(1, 3), st.sampled_from([1_000, 1_030, 1_060]),
    role=st.just(Role.ADMIN),
)  # fmt: skip
OPS: st.SearchStrategy[Op] = st.one_of(
    st.integers(0, 8).map(message), MEMBER_OPS, ADMIN_ADDS, kinds(st.integers(0, 8))
)
CUTOFFS = [None, 1_010, 1_030]  # physical ms; messages are stamped 1,000 + 7n (+ 1..30)


def expected_views(ops: list[Op], cutoff: int | None) -> dict[bytes, object]:
    """Per chat, the view the rule gives for every op delivered anywhere."""
    members = [op for op in ops if isinstance(op, MembershipOp)]
    shown = set().union(*shown_by_the_rule(ops).values())
    msgs = {op.msg_id: op for op in ops if isinstance(op, MsgV1)}.values()

    def admitted(m: MsgV1) -> bool:
        return any(
            op.action is MembershipAction.ADD and op.hlc <= m.hlc
            for op in members
            if (op.chat_id, op.user_id) == (m.chat_id, m.sender)
        )

    views = {}
    for chat in CHATS:
        is_admin = admins_by_the_rule(members, chat)
        mine = [m for m in msgs if m.chat_id == chat and admitted(m)]
        deletes = [m for m in mine if m.kind is MessageKind.DELETE]
        kept = [
            m
            for m in mine
            if m.kind is not MessageKind.DELETE and (cutoff is None or m.hlc.physical_ms > cutoff)
        ]
        views[chat] = fold_chat(kept, deletes, is_admin, shown=lambda m: m.msg_id in shown)
    return views


def admins_by_the_rule(members: list[MembershipOp], chat: bytes) -> IsAdmin:
    creator = USERS[0]  # KEYS[0] created every group of sync_support
    grants = [
        op
        for op in members
        if op.chat_id == chat and op.action is MembershipAction.ADD and op.role is Role.ADMIN
    ]
    return lambda user, hlc: (
        user == creator or any(op.user_id == user and op.hlc <= hlc for op in grants)
    )


class ThreeReplicas(three_replicas(OPS)):
    initial_ops = tuple(JOINED)
    cutoff: int | None = None

    @rule(cutoff=st.sampled_from(CUTOFFS[1:]))
    def collect(self, cutoff: int) -> None:
        """The retention GC on every replica, at one cutoff that only moves forward."""
        self.cutoff = max(self.cutoff or cutoff, cutoff)
        for replica in self.replicas:
            replica.expire_messages(self.cutoff)

    def config(self) -> SyncConfig:
        return SyncConfig(authenticate=True, max_offset_ms=60_000, cutoff_ms=self.cutoff)

    def check_convergence(self) -> None:
        self.settle()
        assert roots(self.replicas[0]) == roots(self.replicas[1]) == roots(self.replicas[2])
        expected = expected_views(self.delivered, self.cutoff)
        for chat in CHATS:
            views = [replica.view(chat) for replica in self.replicas]
            assert views[0] == views[1] == views[2] == expected[chat], chat.hex()
            for db in self.dbs:
                check_chat_list_numbers(db, chat, expected[chat])
        self.check_nothing_erased_is_held()

    def check_nothing_erased_is_held(self) -> None:
        msgs = [op for op in self.delivered if isinstance(op, MsgV1)]
        members = [op for op in self.delivered if isinstance(op, MembershipOp)]
        deletes = [m for m in msgs if m.kind is MessageKind.DELETE]
        for m in msgs:
            is_admin = admins_by_the_rule(members, m.chat_id)
            if any(delete_is_valid(d, is_admin) and erases(d, m) for d in deletes):
                for db in self.dbs:
                    assert db.get_message(m.msg_id) is None, m.kind.name


def check_chat_list_numbers(db: ChatDb, chat: bytes, view: ChatView) -> None:
    """What the chat list shows, from the store's own indexes, is the fold's: every user's
    read position and unread count, and the preview (the newest shown content message)."""
    for user in USERS:
        position = db.read_position(chat, user)
        assert position == view.read_positions.get(user)
        assert db.unread_count(chat, user, position) == min(UNREAD_CAP, view.unread(user))
    shown = [item.msg.msg_id for item in view.items if isinstance(item, MessageView)]
    assert db.load_meta(chat).last_msg_id == (shown[-1] if shown else bytes(32))


ThreeReplicas.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
test_three_replicas_fold_every_kind_alike = ThreeReplicas.TestCase


def test_a_delete_reaches_another_replica_by_sync_and_erases_there(tmp_path: Path) -> None:
    target = message(0)
    delete = delete_of(0, USERS.index(target.sender), 5)  # by its author
    config = ChatDbConfig(block_cache_mb=8, memtable_mb=8)
    with ChatDb(config, path=tmp_path / "a") as db_a, ChatDb(config, path=tmp_path / "b") as db_b:
        first, second = DbReplica(db_a), DbReplica(db_b)
        for replica in (first, second):
            replica.apply_ops([*JOINED, target])
        first.apply_ops([delete])
        assert db_a.get_message(target.msg_id) is None
        assert db_b.get_message(target.msg_id) is not None
        run_session(first, second, config=SyncConfig(authenticate=True))
        assert db_b.get_message(target.msg_id) is None
        assert roots(first) == roots(second)
        (tombstone,) = second.view(target.chat_id).items
        assert isinstance(tombstone, Tombstone) and tombstone.msg_id == target.msg_id
