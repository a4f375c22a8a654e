"""put_messages' fast path (``Messages._put_new_standalone``: new NEW and KEYS messages, their
rows built a column at a time) writes what the general loop writes, byte for byte.

Two stores get the same deliveries — batches drawn from a pool of NEW, KEYS, replies, edits,
reactions and receipts (an edit may come before its target, a message twice, in one batch or
two), directly or through ``apply_ops`` (members, so the chat has unread counters), with a
retention cutoff set part way — one with the fast path, one with it turned off. After every
delivery both return the same results and hold the same rows in every column family.
"""

from __future__ import annotations

from unittest.mock import patch

from hypothesis import example, given, settings
from hypothesis import strategies as st

import store.messages as messages
from store import ChatDb, Hlc, MessageKind, MsgV1
from store.plan import ADMIT_ALL
from store.rocks import COLUMN_FAMILIES

from store_support import CHATS, GROUP_CHAT, KEYS, fresh_db, group_op

POOL_CHATS = (GROUP_CHAT, CHATS[1], CHATS[2])


def _pool() -> list[MsgV1]:
    """Content and KEYS in three chats, then what refers to some of it (signed once)."""
    pool: list[MsgV1] = []
    for i in range(12):
        kind = MessageKind.KEYS if i % 5 == 4 else MessageKind.NEW
        chat = POOL_CHATS[i % 3]
        pool.append(MsgV1.create(KEYS[i % 3], chat, Hlc(2_000 + i // 2), b"m%d" % i, kind=kind))
    referring = [
        (MessageKind.EDIT, b"edited"),
        (MessageKind.REACTION, b"\x01+1"),
        (MessageKind.REPLY, b"re"),
    ]
    for i, target in enumerate([m for m in pool if m.kind is MessageKind.NEW][:6]):
        kind, payload = referring[i % 3]
        hlc = Hlc(target.hlc.physical_ms, target.hlc.logical + 1 + i)
        author = KEYS[i % 3] if kind is not MessageKind.EDIT else KEYS[(pool.index(target)) % 3]
        pool.append(
            MsgV1.create(author, target.chat_id, hlc, payload, kind=kind, ref=target.msg_id)
        )
    return pool


POOL = _pool()
STANDALONE = [i for i, m in enumerate(POOL) if m.ref is None]
REFERRING = [i for i, m in enumerate(POOL) if m.ref is not None]
# the group's first message, through apply_ops: its members become readers (unread counters)
WARM = MsgV1.create(KEYS[0], GROUP_CHAT, Hlc(1_500), b"first")

# a delivery: new standalone messages (mostly: the fast path), sometimes with a message that
# refers to another or one delivered before (the general loop)
deliveries = st.lists(
    st.tuples(
        st.lists(st.sampled_from(STANDALONE), min_size=1, max_size=8, unique=True),
        st.lists(st.sampled_from(REFERRING), max_size=2),
        st.booleans(),  # through apply_ops (else put_messages)
        st.sampled_from([None, None, None, 2_002]),  # the retention cutoff set before it
    ),
    min_size=1,
    max_size=6,
)


def _rows(db: ChatDb) -> dict[str, list[tuple[bytes, bytes]]]:
    return {cf: list(db.iter_all(cf)) for cf in COLUMN_FAMILIES}


def _deliver(db: ChatDb, msgs: list[MsgV1], via_apply: bool) -> object:
    if via_apply:
        plan = db.apply_ops(msgs, rules=ADMIT_ALL)
        return sorted(plan.store)
    return db.put_messages(msgs)


# an edit, a reaction and a reply before their targets, then the targets alone (fast path)
@example([([1], REFERRING[:3], False, None), ([0, 2, 3, 6], [], False, None)])
@example([([1], REFERRING[:3], True, None), ([0, 2, 3, 6], [], True, None)])
@settings(max_examples=60, deadline=None)
@given(deliveries)
def test_the_fast_path_writes_what_the_general_loop_writes(
    steps: list[tuple[list[int], list[int], bool, int | None]],
) -> None:
    # every batch of the fast store through the fast path: from one message, not COLUMNS_FROM
    with fresh_db() as fast, fresh_db() as general, patch.object(messages, "COLUMNS_FROM", 1):
        general.messages._put_new_standalone = lambda msgs, ids: None  # type: ignore[method-assign]
        members = [group_op(user, 1_000 + user) for user in range(3)]
        for db in (fast, general):
            db.apply_member_ops(members)
            db.apply_ops([WARM], rules=ADMIT_ALL)
            db.flush_chat_lists()  # (the node does, once a second)
        assert fast.unread.of_chat(GROUP_CHAT) is not None  # the group's messages are counted
        assert _rows(fast) == _rows(general)
        for standalone, referring, via_apply, cutoff in steps:
            msgs = [POOL[i] for i in standalone + referring]
            if cutoff is not None:
                fast.expire_before_ms = general.expire_before_ms = cutoff
            assert _deliver(fast, msgs, via_apply) == _deliver(general, msgs, via_apply)
            assert _rows(fast) == _rows(general)
            assert fast.last_position == general.last_position


def test_a_batch_of_new_messages_takes_the_fast_path() -> None:
    """(So that the test above compares two paths.) New NEW and KEYS messages: the fast path;
    one twice, or one that refers to another: the general loop; and fewer than
    ``COLUMNS_FROM`` (its fixed cost is more than it saves there)."""
    with fresh_db() as db:
        taken: list[bool] = []
        fast = db.messages._put_new_standalone

        def spy(msgs: list[MsgV1], ids: list[bytes]) -> object:
            result = fast(msgs, ids)
            taken.append(result is not None)
            return result

        db.messages._put_new_standalone = spy  # type: ignore[method-assign,assignment]
        standalone = [POOL[i] for i in STANDALONE]
        db.put_messages(standalone[:3])  # below COLUMNS_FROM: not asked
        with patch.object(messages, "COLUMNS_FROM", 1):
            db.put_messages(standalone[3:5])
            db.put_messages([standalone[5], standalone[5]])
            db.put_messages([standalone[6], POOL[-1]])
        assert taken == [True, False, False]
        many = [MsgV1.create(KEYS[0], CHATS[1], Hlc(9_000 + i), b"x") for i in range(40)]
        db.put_messages(many)  # COLUMNS_FROM or more
        assert taken == [True, False, False, True]
