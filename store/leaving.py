"""Leaving chats: every row of their messages, deletes and member ops out of the store, in
one WriteBatch (SYNC.md, "Scopes": a node drops a shard no served user needs any more after
its grace period). Leaving users (``drop_users``: a user shard no longer needed) takes their
member-index entries and identities, the rows placed by user, in one WriteBatch too; their
member ops stay in the chats held (placed by chat).

Rows keyed by the chat (messages, the hidden index, deletes, member ops and rows,
references, receipts, the event log's positions of shown messages) go by one
``delete_range`` per chat and column family; rows keyed by id (the sync indexes
``seen_msg``, ``seen_delete`` and ``seen_member``, ``ref_targets``) go one by one, found in
one scan of each sync index. The chat's meta and its members' chat
list entries lose their preview, as when retention expires a chat's last message. This
node's event log keeps its entries (positions are never rewritten); a feed read skips
entries whose message is gone, as after retention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from store.keys import CHAT_ID_LEN, key_identity
from store.retention import reset_preview

if TYPE_CHECKING:  # a ChatDb is passed in; this module imports no rocksdict itself
    from store.chatdb import ChatDb

BY_CHAT = (
    "messages", "hidden", "deletes", "member_ops", "members", "refs", "referred", "receipts",
    "event_at", "views",
)  # fmt: skip
# sync indexes: record id -> the record's key, which starts with its chat
BY_ID = ("seen_msg", "seen_delete", "seen_member")


@dataclass(frozen=True, slots=True)
class Dropped:
    """The ids of what left, per sync index: what the caller takes out of its trees."""

    ids: dict[str, list[bytes]]

    @property
    def count(self) -> int:
        return sum(len(ids) for ids in self.ids.values())


def drop_chats(db: ChatDb, leaves: Callable[[bytes], bool]) -> Dropped:
    """Drop every message, delete and member op (with the rows folded from them) of the
    chats ``leaves`` says."""
    rocks = db.rocks
    chats: set[bytes] = set()
    dropped: dict[str, list[bytes]] = {index: [] for index in BY_ID}
    for index, ids in dropped.items():
        for record_id, key in rocks.iter_all(index):
            if leaves(chat := key[:CHAT_ID_LEN]):
                chats.add(chat)
                ids.append(record_id)
    chats.update(chat for chat in db.metas.chat_ids() if leaves(chat))
    batch = rocks.new_batch()
    for chat in sorted(chats):
        end = _after(chat)
        for cf in BY_CHAT:
            batch.delete_range(chat, end, rocks.handle[cf])
    for index, ids in dropped.items():
        for record_id in ids:
            batch.delete(record_id, rocks.handle[index])
    for msg_id in dropped["seen_msg"]:
        batch.delete(msg_id, rocks.handle["ref_targets"])
    rocks.write(batch)
    db.deletes.forget()  # the chats with a delete are cached
    db.hidden.forget()
    db.members.forget_histories()
    for chat in chats:
        reset_preview(db, chat)
    return Dropped(dropped)


def drop_users(db: ChatDb, leaves: Callable[[bytes], bool]) -> Dropped:
    """Drop the member-index entries naming, and the identities of, the users ``leaves``
    says: ids per tree ("member_index", "seen_identity")."""
    rocks = db.rocks
    index = [(op_id, user) for op_id, user in db.member_index.iter_users() if leaves(user)]
    identities = [(rid, user) for rid, user in db.iter_identity_users() if leaves(user)]
    if index or identities:
        batch = rocks.new_batch()
        for op_id, _ in index:
            batch.delete(op_id, rocks.handle["member_index"])
        for record_id, user in identities:
            batch.delete(record_id, rocks.handle["seen_identity"])
            batch.delete(key_identity(user), rocks.handle["identity"])
        rocks.write(batch)
    return Dropped(
        {"member_index": [i for i, _ in index], "seen_identity": [i for i, _ in identities]}
    )


def _after(prefix: bytes) -> bytes:
    """The first key past every key starting with ``prefix``."""
    number = int.from_bytes(prefix, "big") + 1
    if number >> (8 * len(prefix)):
        return prefix + b"\xff" * 256  # all 0xff: no chat id is (BLAKE3), but be exact
    return number.to_bytes(len(prefix), "big")
