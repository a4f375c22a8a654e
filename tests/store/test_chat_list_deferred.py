"""Chat lists refreshed later read the same as chat lists refreshed at once (store.inbox).

The moves of members' entries wait until ``STALE_MESSAGES_MAX`` messages do, the writer is
idle, a list is read, another entry is written or the database closes. Whatever the
interleaving of messages, member ops and reads, a reader sees what a store that refreshed
after every write shows, and so does the disk once the waiting moves are written.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from store import ChatDb, Hlc, MsgV1
from store.authz import new_group
from store.ops import MembershipAction, MembershipOp
from store.records import Role
from sync.replica import DbReplica

from store_support import AUTHOR_IDS, KEYS, fresh_db, receipt_of, small_config

GROUPS = [new_group(KEYS[c], b"deferred-lists-%d" % c) for c in range(2)]  # chat c: KEYS[c]'s

Step = tuple[str, int, int, int]  # (what, user, chat, stamp)


def member_op(user: int, chat: int, stamp: int, *, remove: bool) -> MembershipOp:
    action = MembershipAction.REMOVE if remove else MembershipAction.ADD
    group = GROUPS[chat]
    return MembershipOp.create(
        KEYS[chat], group.chat_id(), AUTHOR_IDS[user], action, Hlc(stamp), Role.PARTICIPANT,
        proof=group,
    )  # fmt: skip


def ops_of(step: Step, posted: list[MsgV1]) -> list:  # type: ignore[type-arg]
    what, user, chat, stamp = step
    if what in ("add", "remove"):
        return [member_op(user, chat, stamp, remove=what == "remove")]
    if what == "receipt" and posted:
        return [receipt_of(posted[-1], Hlc(stamp, 1), author=user)]
    msg = MsgV1.create(KEYS[user], GROUPS[chat].chat_id(), Hlc(stamp), b"m%d" % stamp)
    posted.append(msg)
    return [msg]


def lists(db: ChatDb) -> list[list[tuple[object, ...]]]:
    return [
        [
            (i.entry.chat_id, i.entry.last_ts, i.entry.last_msg_id, i.entry.last_sender, i.unread)
            for i in db.list_user_chats(user).items
        ]
        for user in AUTHOR_IDS
    ]


def inbox_rows(db: ChatDb) -> dict[bytes, bytes]:
    return dict(db.iter_all("user_inbox"))


steps = st.lists(
    st.tuples(
        st.sampled_from(["post", "post", "post", "add", "remove", "receipt", "read"]),
        st.integers(0, 2),
        st.integers(0, 1),
        st.integers(1, 60),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(steps, st.data())
def test_a_deferred_chat_list_reads_as_one_refreshed_at_once(
    plan: list[Step], data: st.DataObject
) -> None:
    play_both(plan, lambda: data.draw(st.booleans(), label="writer idle"))


def play_both(plan: list[Step], later_idle: Callable[[], bool]) -> None:
    """``plan`` on a store that refreshes after every step and on one that refreshes when
    ``later_idle`` says so (or when read): the two read the same, and hold the same rows."""
    creators = [member_op(c, c, 0, remove=False) for c in range(2)]
    with fresh_db() as at_once, fresh_db() as later:
        replicas = DbReplica(at_once), DbReplica(later)
        for replica in replicas:
            replica.apply_ops(creators)
        posted: list[MsgV1] = []
        for step in plan:
            if step[0] == "read":
                assert lists(later) == lists(at_once), plan
                continue
            ops = ops_of(step, posted)
            for replica in replicas:
                replica.apply_ops(ops)
            at_once.flush_chat_lists()
            if later_idle():
                later.flush_chat_lists()
        assert lists(later) == lists(at_once), plan
        assert inbox_rows(later) == inbox_rows(at_once), plan  # the read wrote what waited


def test_the_moves_wait_until_a_read_and_the_read_sees_them(tmp_path: Path) -> None:
    post = MsgV1.create(KEYS[1], GROUPS[0].chat_id(), Hlc(10), b"hello")
    with ChatDb(small_config(str(tmp_path))) as db:
        replica = DbReplica(db)
        replica.apply_ops([member_op(0, 0, 1, remove=False), member_op(1, 0, 1, remove=False)])
        entries = inbox_rows(db)
        replica.apply_ops([post])
        assert db.chat_lists_stale() and inbox_rows(db) == entries  # nothing moved yet
        (item,) = db.list_user_chats(AUTHOR_IDS[0]).items
        assert item.entry.last_msg_id == post.msg_id
        assert not db.chat_lists_stale() and inbox_rows(db) != entries


def test_enough_waiting_messages_refresh_by_themselves(tmp_path: Path) -> None:
    from store.inbox import STALE_MESSAGES_MAX

    chat = GROUPS[0].chat_id()
    posts = [MsgV1.create(KEYS[0], chat, Hlc(10 + n), b"m") for n in range(STALE_MESSAGES_MAX)]
    with ChatDb(small_config(str(tmp_path))) as db:
        replica = DbReplica(db)
        replica.apply_ops([member_op(0, 0, 1, remove=False)])
        replica.apply_ops(posts[:-1])
        assert db.chat_lists_stale()
        replica.apply_ops(posts[-1:])
        assert not db.chat_lists_stale()
        (entry,) = [v for v in inbox_rows(db).values()]
        assert posts[-1].msg_id in entry


def test_closing_writes_what_waits(tmp_path: Path) -> None:
    post = MsgV1.create(KEYS[0], GROUPS[0].chat_id(), Hlc(10), b"kept")
    with ChatDb(small_config(str(tmp_path))) as db:
        DbReplica(db).apply_ops([member_op(0, 0, 1, remove=False), post])
        assert db.chat_lists_stale()
    with ChatDb(small_config(str(tmp_path))) as db:
        (item,) = db.list_user_chats(AUTHOR_IDS[0]).items
        assert item.entry.last_msg_id == post.msg_id


def test_the_two_paths_agree_on_a_hidden_preview_and_a_member_added_to_a_receipt_only_chat() -> (
    None
):
    """The property's two counterexamples (session 17): a removal at a post's stamp hides the
    previewed post (the list refreshed at once kept it as the preview); a member added to a
    chat of receipts only (the list refreshed at once gave them no entry)."""
    for plan in (
        [("post", 0, 0, 1), ("add", 0, 0, 2), ("remove", 0, 0, 1)],
        [("post", 0, 1, 1), ("receipt", 1, 0, 1), ("add", 0, 1, 2)],
    ):
        play_both(plan, lambda: False)
