"""This node's event log and a user's feed of it (store/events.py, store/feed.py): every
event once, in commit order, while writes go on between pages; only what the user may read;
a removal reaches the removed; hidden and erased messages stay out; the log outlives a
restart."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from store import ChatDb, ChatDbConfig, Hlc, MessageKind, MsgV1
from store.authz import new_group
from store.events import EventKind
from store.feed import FeedEvent
from store.kinds import Claims
from store.ops import MembershipAction, MembershipOp
from sync.replica import DbReplica

from store_support import AUTHOR_IDS, GROUP_CHAT, KEYS, group_op

CONFIG = ChatDbConfig(block_cache_mb=8, memtable_mb=8)
OTHER = new_group(KEYS[1], b"feed-test-other!")  # a group of KEYS[1]'s that KEYS[2] is not in
OTHER_CHAT = OTHER.chat_id()
ALICE, BOB, CAROL = AUTHOR_IDS  # GROUP's creator, and two users she adds


def post(author: int, n: int, chat: bytes = GROUP_CHAT) -> MsgV1:
    return MsgV1.create(KEYS[author], chat, Hlc(1000 + n), b"post %d" % n)


def all_of(db: ChatDb, user: bytes, page: int = 3) -> list[FeedEvent]:
    events: list[FeedEvent] = []
    position = 0
    while True:
        got = db.feed(user, position, page)
        events += got.events
        if got.position == position:
            return events
        position = got.position


def ids(events: list[FeedEvent]) -> list[bytes]:
    """The messages' ids (member events left out)."""
    return [e.msg.msg_id for e in events if e.msg is not None]


def test_a_feed_holds_the_readable_chats_in_commit_order(tmp_path: Path) -> None:
    mine = [post(1, n) for n in range(3)]
    theirs = [post(1, 10 + n, OTHER_CHAT) for n in range(3)]
    with ChatDb(CONFIG, path=tmp_path) as db:
        replica = DbReplica(db)
        replica.apply_ops([group_op(1, 1), group_op(2, 1)])
        replica.apply_ops([mine[0], theirs[0]])
        replica.apply_ops([theirs[1], mine[2], mine[1]])  # arrival order, not stamp order
        bob = all_of(db, BOB, page=1)
        carol = all_of(db, CAROL, page=2)
    expected = [mine[0].msg_id, mine[2].msg_id, mine[1].msg_id]
    assert [e.kind for e in bob] == [EventKind.MEMBER] * 2 + [EventKind.MESSAGE] * 3
    assert ids(bob) == expected == ids(carol)  # nothing of the group Carol is not in
    assert [e.position for e in bob] == sorted(e.position for e in bob)


def test_a_removed_member_learns_it_and_then_nothing_more(tmp_path: Path) -> None:
    with ChatDb(CONFIG, path=tmp_path) as db:
        replica = DbReplica(db)
        replica.apply_ops([group_op(1, 1), group_op(2, 1), post(1, 0)])
        replica.apply_ops([group_op(2, 500, remove=True), post(1, 1)])
        carol = all_of(db, CAROL)
        bob = all_of(db, BOB)
    # the ops about her — her add, her removal — and nothing of the chat she left
    assert [e.kind for e in carol] == [EventKind.MEMBER] * 2
    assert [e.member_op.action for e in carol if e.member_op] == [
        MembershipAction.ADD,
        MembershipAction.REMOVE,
    ]
    assert len(bob) == 5  # two adds, a post, the removal, a post


def test_a_hidden_message_enters_the_feed_when_shown_and_leaves_with_an_event(
    tmp_path: Path,
) -> None:
    late = post(2, 0)  # Carol's post after her removal: stored, hidden
    with ChatDb(CONFIG, path=tmp_path) as db:
        replica = DbReplica(db)
        replica.apply_ops([group_op(1, 1), group_op(2, 1), group_op(2, 500, remove=True)])
        replica.apply_ops([late])
        assert late.msg_id not in ids(all_of(db, BOB))
        replica.apply_ops([group_op(2, 800)])  # a re-add before the post: now it shows
        shown = all_of(db, BOB)
        assert [e.kind for e in shown if e.msg == late] == [EventKind.MESSAGE]
        # a removal between the re-add and the post: hidden again, and the feed says so
        replica.apply_ops([group_op(2, 900, remove=True)])
        last = db.feed(BOB, shown[-1].position, 10).events
    assert [(e.kind, e.msg) for e in last if e.msg is not None] == [(EventKind.HIDDEN, late)]


def test_an_erased_message_leaves_the_feed_and_its_delete_enters_it(tmp_path: Path) -> None:
    target = post(1, 0)
    delete = MsgV1.create(
        KEYS[1], GROUP_CHAT, Hlc(1100), Claims.of(target).encode(), kind=MessageKind.DELETE,
        ref=target.msg_id,
    )  # fmt: skip
    with ChatDb(CONFIG, path=tmp_path) as db:
        replica = DbReplica(db)
        replica.apply_ops([group_op(1, 1), target])
        replica.apply_ops([delete])
        events = all_of(db, BOB)
    assert [(e.kind, e.msg) for e in events if e.msg is not None] == [(EventKind.DELETE, delete)]


def test_the_log_outlives_a_restart_and_tells_its_listeners(tmp_path: Path) -> None:
    told: list[int] = []
    with ChatDb(CONFIG, path=tmp_path) as db:
        db.add_listener(told.append)
        DbReplica(db).apply_ops([group_op(1, 1), post(1, 0)])
        first = db.last_position
    with ChatDb(CONFIG, path=tmp_path) as db:
        assert db.last_position == first
        DbReplica(db).apply_ops([post(1, 1)])
        events = all_of(db, BOB)
    # the plan's member op and message are one write (store.plan, one WriteBatch): told once
    assert told == [2] and first == 2
    assert [e.position for e in events] == [1, 2, 3]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40)), min_size=1, max_size=25),
    st.integers(1, 4),
)
def test_paging_while_writes_go_on_misses_nothing_and_gives_nothing_twice(
    tmp_path_factory: object, steps: list[tuple[int, int]], page: int
) -> None:
    """Each step writes a post of Bob's (in a chat Carol reads, or in his own group, which she
    does not), then Carol reads one page: in the end she has every post of her chat once, in
    commit order."""
    path = tmp_path_factory.mktemp("feed")  # type: ignore[attr-defined]
    with ChatDb(CONFIG, path=path) as db:
        replica = DbReplica(db)
        replica.apply_ops([group_op(1, 1), group_op(2, 1), _other_add()])
        expected: list[bytes] = []
        got: list[bytes] = []
        position = 0
        for n, (where, stamp) in enumerate(steps):
            msg = post(1, 100 * n + stamp, GROUP_CHAT if where else OTHER_CHAT)
            replica.apply_ops([msg])
            if where:
                expected.append(msg.msg_id)
            feed = db.feed(CAROL, position, page)
            got += ids(feed.events)
            position = feed.position
        while (feed := db.feed(CAROL, position, page)).position != position:
            got += ids(feed.events)
            position = feed.position
    assert got == expected


def _other_add() -> MembershipOp:
    """KEYS[1]'s own group, with KEYS[1] in it (Bob posts there; only he reads it)."""
    return MembershipOp.create(
        KEYS[1], OTHER_CHAT, AUTHOR_IDS[1], MembershipAction.ADD, Hlc(1), proof=OTHER
    )
