"""A node keeps what waits for its member op across a restart (``DbReplica`` over RocksDB).

A message posted before its author's add reaches the node is acknowledged (202, waiting)
and held; if the node stops before the add comes, the message must still be there after
the restart, and show once the add arrives.
"""

from __future__ import annotations

from pathlib import Path

from store import ChatDb, ChatDbConfig
from store.waiting import WaitingRoom
from sync.replica import DbReplica

from sync_support import CHATS, USERS, member, message

CONFIG = ChatDbConfig(block_cache_mb=8, memtable_mb=8)


def waiting_ids(replica: DbReplica) -> set[bytes]:
    return {m.msg_id for m in replica.waiting.waiting()}


def test_a_message_waiting_at_a_restart_waits_after_it_and_shows_when_its_add_comes(
    tmp_path: Path,
) -> None:
    msg = message(4)  # no add of its author yet
    chat, user = CHATS.index(msg.chat_id), USERS.index(msg.sender)
    with ChatDb(CONFIG, path=tmp_path) as db:
        replica = DbReplica(db)
        assert replica.apply_ops([msg]).new == [False]
        assert waiting_ids(replica) == {msg.msg_id}
    with ChatDb(CONFIG, path=tmp_path) as db:  # the node restarted
        replica = DbReplica(db)
        assert waiting_ids(replica) == {msg.msg_id}
        assert replica.visible_ids(msg.chat_id) == set()
        replica.apply_ops([member(chat, user, 1)])  # the add, stamped before the message
        assert waiting_ids(replica) == set()
        assert replica.visible_ids(msg.chat_id) == {msg.msg_id}
    with ChatDb(CONFIG, path=tmp_path) as db:  # stored now: nothing waits any more
        assert db.load_waiting() == []
        assert DbReplica(db).visible_ids(msg.chat_id) == {msg.msg_id}


def test_a_message_admitted_while_the_store_was_closed_is_stored_on_opening(
    tmp_path: Path,
) -> None:
    """The add was written (say, by a tool) while the message waited: opening admits it."""
    msg = message(5)
    chat = CHATS.index(msg.chat_id)
    user = USERS.index(msg.sender)
    with ChatDb(CONFIG, path=tmp_path) as db:
        DbReplica(db).apply_ops([msg])
        db.apply_member_ops([member(chat, user, 1)])  # the store alone: nothing released
        assert [m.msg_id for m in db.load_waiting()] == [msg.msg_id]
    with ChatDb(CONFIG, path=tmp_path) as db:
        replica = DbReplica(db)
        assert waiting_ids(replica) == set()
        assert db.load_waiting() == []
        assert replica.visible_ids(msg.chat_id) == {msg.msg_id}


def test_the_store_keeps_only_what_the_bounded_room_holds(tmp_path: Path) -> None:
    """Evicted messages leave the store too: the bound on a stranger's bytes holds on disk."""
    msgs = [message(n) for n in range(6)]
    with ChatDb(CONFIG, path=tmp_path) as db:
        replica = DbReplica(db, WaitingRoom(max_messages=2))
        for msg in msgs:
            replica.apply_ops([msg])
        assert waiting_ids(replica) == {msgs[4].msg_id, msgs[5].msg_id}
        assert {m.msg_id for m in db.load_waiting()} == waiting_ids(replica)
