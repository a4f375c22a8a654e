"""Who may post, decided alike by every replica: three RocksDB replicas, any interleaving.

Messages and member ops (adds, removes, re-adds around the messages' stamps; forged ones
are refused before a replica sees them, tests/node) reach three ``DbReplica``s one by one
or in batches (as HTTP and gossip hand them to the writer), twice or never, and by
anti-entropy sessions between any two — cut short at random, on skewed clocks, while some
pairs never talk (a partition). Whatever happened, once every pair has synced:

* the three replicas hold the same records (equal Merkle roots) and show the same
  messages, chat by chat;
* what they show is exactly what the rule (SECURITY.md, "Who may post") says, computed
  here from its definition over every op delivered anywhere — a group message shows iff
  its sender was active at its stamp, a removed-then-re-added member's messages split
  exactly into the periods; a DM's messages iff their sender is one of its parties;
* every chat's preview (ChatMeta's newest message) is its newest shown message.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from three_replicas import three_replicas

from store import ChatDb, Hlc, MsgV1
from store.authz import DmProof
from store.ops import MembershipAction, MembershipOp, Op
from store.records import dm_chat_id
from sync.frames import Domain

from sync_support import CHATS, KEYS, MEMBER_OPS, USERS, message, roots

TMP = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
DM_PROOF = DmProof(USERS[1], USERS[2])
DM_CHAT = dm_chat_id(USERS[1], USERS[2])
ALL_CHATS = [*CHATS, DM_CHAT]


@cache
def dm_message(n: int) -> MsgV1:
    """A message in the DM of USERS[1] and USERS[2]; every third one from USERS[3], a stranger."""
    key = KEYS[1 + n % 3]
    return MsgV1.create(key, DM_CHAT, Hlc(1_003 + n * 11), b"dm%d" % n)


@cache
def dm_op(user: int, hlc: int) -> MembershipOp:
    return MembershipOp.create(
        KEYS[1], DM_CHAT, USERS[user], MembershipAction.ADD, Hlc(hlc), proof=DM_PROOF
    )


OPS: st.SearchStrategy[Op] = st.one_of(
    st.integers(0, 40).map(message),
    st.integers(0, 12).map(dm_message),
    MEMBER_OPS,
    st.builds(dm_op, st.integers(1, 2), st.sampled_from([990, 1_100, 1_200])),
)


def shown_by_the_rule(ops: list[Op]) -> dict[bytes, set[bytes]]:
    """Per chat, the messages the rule shows — from its definition, not from store.access."""
    members = [op for op in ops if isinstance(op, MembershipOp)]
    parties: dict[bytes, set[bytes]] = {}
    for op in members:
        if isinstance(op.proof, DmProof):
            parties[op.chat_id] = {op.proof.user_a, op.proof.user_b}
    shown: dict[bytes, set[bytes]] = {chat: set() for chat in ALL_CHATS}
    for msg in {op.msg_id: op for op in ops if isinstance(op, MsgV1)}.values():
        if msg.chat_id in parties:
            if msg.sender in parties[msg.chat_id]:
                shown[msg.chat_id].add(msg.msg_id)
            continue
        mine = [op for op in members if (op.chat_id, op.user_id) == (msg.chat_id, msg.sender)]
        adds = [op.hlc for op in mine if op.action is MembershipAction.ADD and op.hlc <= msg.hlc]
        removes = [op.hlc for op in mine if op.action is not MembershipAction.ADD]
        removes = [stamp for stamp in removes if stamp <= msg.hlc]
        if adds and (not removes or max(removes) < max(adds)):
            shown[msg.chat_id].add(msg.msg_id)
    return shown


class ThreeReplicas(three_replicas(OPS)):
    def check_convergence(self) -> None:
        self.settle()
        assert roots(self.replicas[0]) == roots(self.replicas[1]) == roots(self.replicas[2])
        expected = shown_by_the_rule(self.delivered)
        for chat in ALL_CHATS:
            seen = [replica.visible_ids(chat) for replica in self.replicas]
            assert seen[0] == seen[1] == seen[2] == expected[chat], chat.hex()
            for db in self.dbs:
                assert db.load_meta(chat).last_msg_id == newest(db, expected[chat])
        stored = self.replicas[0].tree(Domain.MESSAGES).count
        assert stored >= sum(len(ids) for ids in expected.values())


def newest(db: ChatDb, ids: set[bytes]) -> bytes:
    msgs: list[Any] = [db.get_message(i) for i in ids]
    return max(((m.hlc, m.msg_id) for m in msgs), default=(None, bytes(32)))[1]


ThreeReplicas.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
test_three_replicas_show_what_the_rule_says = ThreeReplicas.TestCase
