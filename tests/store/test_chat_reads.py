"""ChatReads (store/chat_reads.py): the HTTP API's view of the store has the API's reads and
nothing else — no write, no row store to reach one through — and answers as the ChatDb does."""

from __future__ import annotations

import inspect

from store import ChatDb, Direction, Hlc, MsgV1
from store.chat_reads import ChatReads

from store_support import AUTHOR_IDS, GROUP_CHAT, KEYS, group_op

# what node/api reads; a new one is added here and in ChatReads together
API_READS = {
    "range", "get_message", "folded_range", "hidden_grants", "read_user_chats", "read_position",
    "unread_count", "may_read", "feed", "log_page", "delivery", "delivered",
    "shown_messages", "get_identity", "list_members_with_info", "chat_proof", "indexed_members",
    "member_ops_page", "deletes_page", "last_position",
}  # fmt: skip
ALICE, BOB = AUTHOR_IDS[:2]


def public(reads: ChatReads) -> set[str]:
    names = {name for name in vars(reads) if not name.startswith("_")}
    return names | {name for name in vars(ChatReads) if not name.startswith("_")}


def test_the_facade_has_the_api_reads_and_nothing_else(db: ChatDb) -> None:
    assert public(db.reads) == API_READS


def test_no_attribute_leads_to_a_store(db: ChatDb) -> None:
    """Each is a method bound to a row store's read (or a property): none is a store."""
    for name, value in vars(db.reads).items():
        if name == "_position":
            assert inspect.isfunction(value)  # a closure over the event log's position
            continue
        assert inspect.ismethod(value), name
        assert value.__func__.__name__ == name  # the row store's method of that name
        assert not name.startswith(("put_", "apply_", "write", "delete_", "acknowledge"))


def test_the_facade_answers_as_the_db_does(db: ChatDb) -> None:
    db.apply_member_ops([group_op(0, 1), group_op(1, 2)])
    msgs = [MsgV1.create(KEYS[n % 2], GROUP_CHAT, Hlc(1000 + n), b"m%d" % n) for n in range(7)]
    db.apply_ops(msgs)
    reads = db.reads
    for direction in Direction:
        assert reads.range(GROUP_CHAT, None, 3, direction) == db.range(
            GROUP_CHAT, None, 3, direction
        )
        assert reads.folded_range(GROUP_CHAT, None, 3, direction) == db.folded_range(
            GROUP_CHAT, None, 3, direction
        )
    assert db.chat_lists_stale()  # the moves wait: a read through the facade writes nothing
    unsettled = reads.read_user_chats(BOB)
    assert db.chat_lists_stale()
    assert reads.read_user_chats(BOB) == unsettled
    settled = db.list_user_chats(BOB)  # writes the moves (a node: its writer), then reads
    assert not db.chat_lists_stale() and reads.read_user_chats(BOB) == settled
    assert reads.unread_count(GROUP_CHAT, BOB, None) == db.unread_count(GROUP_CHAT, BOB, None) > 0
    assert reads.may_read(GROUP_CHAT, BOB) and not reads.may_read(GROUP_CHAT, AUTHOR_IDS[2])
    assert reads.last_position == db.last_position > 0
    assert reads.feed(BOB, 0, 100) == db.feed(BOB, 0, 100)
    assert reads.get_message(msgs[0].msg_id) == msgs[0]
    assert reads.list_members_with_info(GROUP_CHAT) == db.list_members_with_info(GROUP_CHAT)
    assert reads.member_ops_page(GROUP_CHAT) == db.member_ops_page(GROUP_CHAT)
