"""A user's chat list (user_inbox, newest first), with unread counts.

The list is a local view, never shipped by sync: its entries are kept by the writer as
messages and member ops arrive (``store.admission``). The unread counts come from the
users' signed, synced read receipts (``store.reads``), so they agree on every replica.

A new message moves the entry of every member of its chat (a delete and a put each):
written per message, that was most of what storing a gossiped message cost (16 members:
40 µs of the writer's 55 per message) and most of RocksDB's write volume. So the lists
of the chats that got messages are refreshed together, once ``STALE_MESSAGES_MAX``
messages wait or when the node's writer has nothing else to do
(``flush_chat_lists``), and always before a list is read or another entry written: every
read sees every stored message. A crash loses only the waiting moves (a chat then sits
at its older place until its next message); the messages themselves were written first.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import islice

from store.errors import InvalidInput
from store.keys import (
    CHAT_ID_LEN,
    MESSAGES_KEY_LEN,
    USER_ID_LEN,
    USER_INBOX_KEY_LEN,
    check_len,
    decode_cursor,
    encode_cursor,
    key_user_inbox,
    prefix_end,
    rev_ts,
)
from store.messages import DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT
from store.metas import Metas
from store.reads import Receipts
from store.records import ChatKind, InboxEntry, MsgV1, decode_inbox_entry, decode_msg, is_dm_chat
from store.rocks import Rocks
from store.unread import UnreadCounters

ZERO_MSG_ID = bytes(32)
NO_SENDER = bytes(20)  # an entry's sender when the chat has no message to preview

INBOX_KEY_CACHE = 1 << 17  # (user, chat) pairs whose inbox key is remembered (~25 MB)
STALE_MESSAGES_MAX = 2048  # stored messages whose chat-list moves may wait, at most

# (chat id, users, their new entry, the chat's last_ts when its entries were last written)
_InboxUpdate = tuple[bytes, list[bytes], InboxEntry, int | None]


@dataclass(frozen=True, slots=True)
class ChatListItem:
    entry: InboxEntry
    unread: int


_new = object.__new__
_SET_ITEM = tuple(ChatListItem.__dict__[name].__set__ for name in ChatListItem.__slots__)
assert ChatListItem.__slots__ == ("entry", "unread")


@dataclass(frozen=True, slots=True)
class ChatListPage:
    items: list[ChatListItem]
    next_cursor: str | None


@dataclass
class StaleList:
    """A chat whose members' entries wait for a refresh (``Inbox.refresh_inboxes``)."""

    previous_last_ts: int | None  # the chat's last_ts when its entries were last written
    senders: dict[bytes, bytes] = field(default_factory=dict)  # msg id -> sender, since then


class Inbox:
    """Chat lists. Every user_inbox write goes through here, under ``_inbox_lock`` (the
    writer and API readers refresh them from their own threads), so ``_inbox_keys`` (user |
    chat -> the entry's current key, filled after each successful write) stays true to the
    disk. The unread counts come from the counters (``store.unread``: an entry written
    makes its user a reader there, an entry deleted makes them none), else from
    ``receipts``."""

    def __init__(
        self, rocks: Rocks, metas: Metas, receipts: Receipts, unread: UnreadCounters
    ) -> None:
        self._rocks, self._metas, self._receipts, self._unread = rocks, metas, receipts, unread
        self._inbox_keys: dict[bytes, bytes] = {}  # user | chat -> its user_inbox key
        # the chats whose lists wait for their refresh, and the lock of every user_inbox write
        self._stale_lists: dict[bytes, StaleList] = {}
        self._stale_messages = 0
        self._inbox_lock = threading.RLock()

    def _scan_inbox_key(self, user_id: bytes, chat_id: bytes) -> bytes | None:
        """The user's entry for the chat, by a prefix scan of the user's inbox (ids checked
        by the caller: a shorter chat id would match a key's suffix)."""
        for key, _ in self._rocks.iter_prefix("user_inbox", user_id):
            if key[-CHAT_ID_LEN:] == chat_id:
                return key
        return None

    def upsert_inbox_for_members(
        self,
        chat_id: bytes,
        members: Iterable[bytes],
        entry: InboxEntry,
        *,
        previous_last_ts: int | None = None,
    ) -> None:
        """Give each member exactly one inbox entry for ``chat_id``: ``entry``, sorted by its last_ts.

        ``previous_last_ts``: the chat's last_ts when its entries were last written (lets
        one multi-get find old keys the cache does not hold).
        """
        with self._inbox_lock:
            self.flush_chat_lists()  # the waiting moves first: they are older than this one
            self._write_inboxes([(chat_id, list(members), entry, previous_last_ts)])

    def refresh_inboxes(self, fresh: list[MsgV1], previous_last_ts: dict[bytes, int]) -> None:
        """Point each participant's entry of every chat in ``fresh`` at the chat's newest
        message — now, or with the next ``flush_chat_lists`` (see the module's docstring).

        ``fresh``: messages just stored (not duplicates); ``previous_last_ts``: each chat's
        ChatMeta.last_ts before they were stored.
        """
        with self._inbox_lock:
            stale = self._stale_lists
            for msg in fresh:
                chat = stale.get(msg.chat_id)
                if chat is None:
                    chat = stale[msg.chat_id] = StaleList(previous_last_ts.get(msg.chat_id))
                chat.senders[msg.msg_id] = msg.sender
            self._stale_messages += len(fresh)
            if self._stale_messages >= STALE_MESSAGES_MAX:
                self.flush_chat_lists()

    def mark_stale(self, chat_id: bytes, previous_last_ts: int | None) -> None:
        """The chat's entries are to be written again from its meta with the next flush (a
        member added, a preview moved back): through ``_list_update``, as for new messages, so
        a list refreshed at once and one refreshed later read the same."""
        with self._inbox_lock:
            if chat_id not in self._stale_lists:
                self._stale_lists[chat_id] = StaleList(previous_last_ts)

    def chat_lists_stale(self) -> bool:
        """Whether some chat's entries wait for ``flush_chat_lists``."""
        return bool(self._stale_lists)

    def flush_chat_lists(self) -> None:
        """Point each participant's entry of every waiting chat at the chat's newest message.

        Participants: a group's active members; a DM's members and the senders of its new
        messages (its two parties). All chats in one WriteBatch; on failure they still wait.
        """
        with self._inbox_lock:
            if not self._stale_lists:
                return
            self._write_inboxes(
                [self._list_update(chat_id, c) for chat_id, c in self._stale_lists.items()]
            )
            self._stale_lists.clear()
            self._stale_messages = 0

    def _list_update(self, chat_id: bytes, chat: StaleList) -> _InboxUpdate:
        """The entry the chat's participants get, from its meta as it stands."""
        meta = self._metas.load(chat_id)  # cached by put_messages
        if meta.last_msg_id == ZERO_MSG_ID:  # nothing to preview (receipts only, or hidden)
            sender: bytes | None = NO_SENDER
        else:
            sender = chat.senders.get(meta.last_msg_id) or self._sender_of(meta.last_msg_id)
        senders = set(chat.senders.values())
        parties = sorted(set(meta.members) | senders)
        dm = is_dm_chat(chat_id, parties)
        # a group's list is its active members': a message or receipt stamped before a
        # removal, arriving after it, brings nobody back (MESSAGES.md, "The chat list")
        users = parties if dm else sorted(meta.members)
        entry = InboxEntry(
            chat_id=chat_id,
            kind=ChatKind.DM if dm else ChatKind.GROUP,
            last_ts=meta.last_ts,
            last_msg_id=meta.last_msg_id,
            last_sender=sender or next(reversed(chat.senders.values()), NO_SENDER),
            last_seq=meta.last_seq,
        )
        return chat_id, users, entry, chat.previous_last_ts

    def _write_inboxes(self, updates: list[_InboxUpdate]) -> None:
        """One WriteBatch: each (user, chat) entry moved to its new key.

        The old key comes from, in order: this batch, the cache, a guess at the chat's
        previous last_ts (one multi-get for every guess), a prefix scan of the user's inbox.
        """
        updates = [
            (
                check_len(chat_id, CHAT_ID_LEN, "chat_id"),
                [check_len(user, USER_ID_LEN, "user_id") for user in users],  # bytes, hashable
                entry,
                previous,
            )
            for chat_id, users, entry, previous in updates
        ]
        guesses: dict[bytes, bytes] = {}  # user | chat -> its key at the chat's previous last_ts
        for chat_id, users, _, previous in updates:
            if previous is not None:
                previous_rev = rev_ts(previous)
                for user in users:
                    pair = user + chat_id
                    if pair not in self._inbox_keys:
                        guesses.setdefault(pair, key_user_inbox(user, previous_rev, chat_id))
        found = self._rocks.multi_get("user_inbox", list(guesses.values()))
        guessed = {
            pair: key
            for (pair, key), value in zip(guesses.items(), found, strict=True)
            if value is not None
        }
        batch = self._rocks.new_batch()
        inbox_cf = self._rocks.handle["user_inbox"]
        written: dict[bytes, bytes] = {}
        counted: list[bytes] = []  # chats where users were made readers here
        for chat_id, users, entry, _ in updates:
            if self._unread.create(batch, chat_id, users):
                counted.append(chat_id)
            encoded = entry.encode()
            rev = rev_ts(entry.last_ts)
            for user in users:
                pair = user + chat_id
                new_key = key_user_inbox(user, rev, chat_id)
                old_key = (
                    written.get(pair)
                    or self._inbox_keys.get(pair)
                    or guessed.get(pair)
                    or self._scan_inbox_key(user, chat_id)
                )
                if old_key is not None and old_key != new_key:
                    batch.delete(old_key, inbox_cf)
                batch.put(new_key, encoded, inbox_cf)
                written[pair] = new_key
        if batch.len():
            self._rocks.write(batch)
            self._remember_inbox_keys(written)
            self._unread.created(counted)

    def _remember_inbox_keys(self, written: dict[bytes, bytes]) -> None:
        """Cache keys only after their batch is written (a failed write must not leak)."""
        if len(self._inbox_keys) + len(written) > INBOX_KEY_CACHE:
            self._inbox_keys.clear()
        self._inbox_keys.update(written)

    def _sender_of(self, msg_id: bytes) -> bytes | None:
        raw = self._rocks.get("seen_msg", msg_id)
        stored = self._rocks.get("messages", raw[:MESSAGES_KEY_LEN]) if raw else None
        return None if stored is None else decode_msg(stored, trusted=True).sender

    def delete_user_inbox_entry(self, user_id: bytes, chat_id: bytes) -> bool:
        """Remove ``chat_id`` from the user's chat list (after a Remove or Leave)."""
        user_id = check_len(user_id, USER_ID_LEN, "user_id")  # bytes: the cache's key
        chat_id = check_len(chat_id, CHAT_ID_LEN, "chat_id")
        with self._inbox_lock:
            self.flush_chat_lists()
            # the key holds rev_ts, which the caller does not know: the cache, else one scan
            key = self._inbox_keys.get(user_id + chat_id) or self._scan_inbox_key(user_id, chat_id)
            batch = self._rocks.new_batch()
            self._unread.drop(batch, chat_id, user_id)  # no longer a reader: own count kept
            if key is not None:
                batch.delete(key, self._rocks.handle["user_inbox"])
            self._rocks.write(batch)
            self._inbox_keys.pop(user_id + chat_id, None)
            return key is not None

    def list_user_chats(
        self, user_id: bytes, cursor: str | None = None, limit: int = DEFAULT_PAGE_LIMIT
    ) -> ChatListPage:
        """The waiting chat-list moves written, then ``read_user_chats`` (tools and tests; a
        node's API asks its writer to write them, and reads)."""
        self.flush_chat_lists()  # every stored message is in the list it reads
        return self.read_user_chats(user_id, cursor, limit)

    def read_user_chats(
        self, user_id: bytes, cursor: str | None = None, limit: int = DEFAULT_PAGE_LIMIT
    ) -> ChatListPage:
        """The user's chats, most recent first, with unread counts; paginated by cursor. Reads
        only: the moves still waiting (``chat_lists_stale``) are not in it."""
        check_len(user_id, USER_ID_LEN, "user_id")
        if not 1 <= limit <= MAX_PAGE_LIMIT:
            raise InvalidInput(
                f"limit must be 1..{MAX_PAGE_LIMIT}, got {limit}", reason="bad_limit"
            )
        start = user_id
        if cursor is not None:
            after = decode_cursor(cursor, USER_INBOX_KEY_LEN, user_id)
            start = after + b"\x00"
        end = prefix_end(user_id)  # (held while the rows are read: see Rocks.items)
        # the page's rows and one more (are there more?), pulled by islice in C
        stored = list(islice(self._rocks.items_in("user_inbox", start, end), limit + 1))
        del end
        rows = [(key, decode_inbox_entry(raw, trusted=True)) for key, raw in stored[:limit]]
        cursor = encode_cursor(rows[-1][0]) if len(stored) > limit else None
        return ChatListPage(self._with_unread(user_id, rows), cursor)

    def _with_unread(
        self, user_id: bytes, rows: list[tuple[bytes, InboxEntry]]
    ) -> list[ChatListItem]:
        items: list[ChatListItem] = []
        append = items.append
        set_entry, set_unread = _SET_ITEM
        counts = self._unread.counts(user_id, [entry.chat_id for _, entry in rows])
        unread_for = self._receipts.unread_for  # = unread_count(chat, user, read_position(...))
        for (_, entry), count in zip(rows, counts, strict=True):
            item = _new(ChatListItem)  # ChatListItem(entry, unread), through its slots
            set_entry(item, entry)
            # no counter (an earlier version's store, a chat voided since): recounted
            set_unread(item, unread_for(entry.chat_id, user_id) if count is None else count)
            append(item)
        return items
