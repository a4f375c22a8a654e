"""The chat list follows membership (MESSAGES.md, "The chat list"): a member removed or gone
loses the chat's entry, one added (again) gets it, with the chat's newest message."""

from __future__ import annotations

from pathlib import Path

from store import ChatDb, ChatDbConfig, Hlc, MsgV1
from sync.replica import DbReplica

from store_support import AUTHOR_IDS, GROUP_CHAT, KEYS, group_op, receipt_of


def listed(db: ChatDb, user: int) -> list[bytes]:
    return [item.entry.chat_id for item in db.list_user_chats(AUTHOR_IDS[user]).items]


def test_removal_takes_the_entry_away_and_a_re_add_brings_it_back(tmp_path: Path) -> None:
    post = MsgV1.create(KEYS[0], GROUP_CHAT, Hlc(150), b"hello")
    with ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=tmp_path) as db:
        replica = DbReplica(db)
        replica.apply_ops([group_op(0, 100), group_op(1, 100), post])
        assert listed(db, 0) == listed(db, 1) == [GROUP_CHAT]
        replica.apply_ops([group_op(1, 200, remove=True)])
        assert listed(db, 1) == [] and listed(db, 0) == [GROUP_CHAT]
        replica.apply_ops([group_op(1, 300)])  # re-added: the entry, at the newest message
        (item,) = db.list_user_chats(AUTHOR_IDS[1]).items
        assert (item.entry.chat_id, item.entry.last_msg_id) == (GROUP_CHAT, post.msg_id)
        replica.apply_ops([group_op(2, 400)])  # a newcomer sees the chat at once
        assert listed(db, 2) == [GROUP_CHAT]


def test_a_removal_that_arrives_late_still_takes_the_entry_away(tmp_path: Path) -> None:
    """The ops in any order: the entry follows the folded row, not the last op to arrive."""
    post = MsgV1.create(KEYS[0], GROUP_CHAT, Hlc(150), b"hello")
    with ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=tmp_path) as db:
        replica = DbReplica(db)
        replica.apply_ops([group_op(0, 100), group_op(1, 300), post])
        replica.apply_ops([group_op(1, 200, remove=True)])  # older than the add: still a member
        assert listed(db, 1) == [GROUP_CHAT]
        replica.apply_ops([group_op(1, 100)])  # an even older add changes nothing either
        assert listed(db, 1) == [GROUP_CHAT]
        replica.apply_ops([group_op(1, 400, remove=True)])
        assert listed(db, 1) == []


def test_a_removed_members_late_message_or_receipt_does_not_bring_the_chat_back(
    tmp_path: Path,
) -> None:
    """Stamped while they were a member, so stored and shown — but the list is the active
    members', and a receipt or post from before the removal arriving after it adds nobody."""
    post = MsgV1.create(KEYS[0], GROUP_CHAT, Hlc(150), b"hello")
    late_post = MsgV1.create(KEYS[1], GROUP_CHAT, Hlc(160), b"from before")
    receipt = receipt_of(post, Hlc(170), author=1)
    with ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=tmp_path) as db:
        replica = DbReplica(db)
        replica.apply_ops([group_op(0, 100), group_op(1, 100), post])
        replica.apply_ops([group_op(1, 200, remove=True)])
        assert listed(db, 1) == []
        replica.apply_ops([receipt])
        replica.apply_ops([late_post])
        assert listed(db, 1) == [] and listed(db, 0) == [GROUP_CHAT]
