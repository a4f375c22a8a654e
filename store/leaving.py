"""Leaving chats: every row of their messages and deletes out of the store, in one
WriteBatch (SYNC.md, "Scopes": a node drops a shard no served user needs any more after its
grace period). Global rows — member rows and ops, identities — stay: every node holds them.

Rows keyed by the chat (messages, the hidden index, deletes, references, receipts, the
event log's positions of shown messages) go by one ``delete_range`` per chat and column
family; rows keyed by id (the sync indexes ``seen_msg`` and ``seen_delete``, ``ref_targets``)
go one by one, found in one scan of each sync index. The chat's meta and its members' chat
list entries lose their preview, as when retention expires a chat's last message. This
node's event log keeps its entries (positions are never rewritten); a feed read skips
entries whose message is gone, as after retention.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from store.keys import CHAT_ID_LEN
from store.retention import reset_preview

if TYPE_CHECKING:  # a ChatDb is passed in; this module imports no rocksdict itself
    from store.chatdb import ChatDb

BY_CHAT = ("messages", "hidden", "deletes", "refs", "referred", "receipts", "event_at")


def drop_chats(db: ChatDb, leaves: Callable[[bytes], bool]) -> tuple[list[bytes], list[bytes]]:
    """Drop every message and delete of the chats ``leaves`` says (message ids, delete ids:
    what the caller takes out of its trees)."""
    rocks = db.rocks
    chats: set[bytes] = set()
    msg_ids, delete_ids = [], []
    for msg_id, key in rocks.iter_all("seen_msg"):
        if leaves(chat := key[:CHAT_ID_LEN]):
            chats.add(chat)
            msg_ids.append(msg_id)
    for delete_id, key in rocks.iter_all("seen_delete"):
        if leaves(chat := key[:CHAT_ID_LEN]):
            chats.add(chat)
            delete_ids.append(delete_id)
    chats.update(chat for chat in db.metas.chat_ids() if leaves(chat))
    batch = rocks.new_batch()
    for chat in sorted(chats):
        end = _after(chat)
        for cf in BY_CHAT:
            batch.delete_range(chat, end, rocks.handle[cf])
    for msg_id in msg_ids:
        batch.delete(msg_id, rocks.handle["seen_msg"])
        batch.delete(msg_id, rocks.handle["ref_targets"])
    for delete_id in delete_ids:
        batch.delete(delete_id, rocks.handle["seen_delete"])
    rocks.write(batch)
    db.deletes.forget()  # the chats with a delete are cached
    db.hidden.forget()
    for chat in chats:
        reset_preview(db, chat)
    return msg_ids, delete_ids


def _after(prefix: bytes) -> bytes:
    """The first key past every key starting with ``prefix``."""
    number = int.from_bytes(prefix, "big") + 1
    if number >> (8 * len(prefix)):
        return prefix + b"\xff" * 256  # all 0xff: no chat id is (BLAKE3), but be exact
    return number.to_bytes(len(prefix), "big")
