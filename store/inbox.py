"""A user's chat list (user_inbox, newest first), with unread counts.

The list is a local view, never shipped by sync: its entries are kept by the writer as
messages and member ops arrive (``store.admission``). The unread counts come from the
users' signed, synced read receipts (``store.reads``), so they agree on every replica.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from store.errors import InvalidInput
from store.keys import (
    CHAT_ID_LEN,
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
from store.reads import ReadStore
from store.records import ChatKind, InboxEntry, MsgV1, decode_inbox_entry, decode_msg, is_dm_chat

INBOX_KEY_CACHE = 1 << 17  # (user, chat) pairs whose inbox key is remembered (~25 MB)

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


class InboxStore(ReadStore):
    """Chat lists. Every user_inbox write goes through here, so ``_inbox_keys`` (user | chat ->
    the entry's current key, filled after each successful write) stays true to the disk."""

    def _scan_inbox_key(self, user_id: bytes, chat_id: bytes) -> bytes | None:
        """The user's entry for the chat, by a prefix scan of the user's inbox (ids checked
        by the caller: a shorter chat id would match a key's suffix)."""
        for key, _ in self.iter_prefix("user_inbox", user_id):
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
        self._write_inboxes([(chat_id, list(members), entry, previous_last_ts)])

    def refresh_inboxes(self, fresh: list[MsgV1], previous_last_ts: dict[bytes, int]) -> None:
        """Point each participant's entry of every chat in ``fresh`` at the chat's newest message.

        ``fresh``: messages just stored (not duplicates); ``previous_last_ts``: each chat's
        ChatMeta.last_ts before they were stored. Participants: the chat's active members
        and the senders of ``fresh``. All chats in one WriteBatch.
        """
        by_chat: dict[bytes, list[MsgV1]] = {}
        for msg in fresh:
            by_chat.setdefault(msg.chat_id, []).append(msg)
        updates: list[_InboxUpdate] = []
        for chat_id, chat_msgs in by_chat.items():
            meta = self.load_meta(chat_id)  # just written by put_messages (and cached)
            newest = next((m for m in chat_msgs if m.msg_id == meta.last_msg_id), None)
            sender = newest.sender if newest is not None else self._sender_of(meta.last_msg_id)
            users = sorted(set(meta.members) | {m.sender for m in chat_msgs})
            entry = InboxEntry(
                chat_id=chat_id,
                kind=ChatKind.DM if is_dm_chat(chat_id, users) else ChatKind.GROUP,
                last_ts=meta.last_ts,
                last_msg_id=meta.last_msg_id,
                last_sender=sender or chat_msgs[-1].sender,
                last_seq=meta.last_seq,
            )
            updates.append((chat_id, users, entry, previous_last_ts.get(chat_id)))
        self._write_inboxes(updates)

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
        found = self.multi_get("user_inbox", list(guesses.values()))
        guessed = {
            pair: key
            for (pair, key), value in zip(guesses.items(), found, strict=True)
            if value is not None
        }
        batch = self.new_batch()
        inbox_cf = self._handle["user_inbox"]
        written: dict[bytes, bytes] = {}
        for chat_id, users, entry, _ in updates:
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
            self.write(batch)
            self._remember_inbox_keys(written)

    def _remember_inbox_keys(self, written: dict[bytes, bytes]) -> None:
        """Cache keys only after their batch is written (a failed write must not leak)."""
        if len(self._inbox_keys) + len(written) > INBOX_KEY_CACHE:
            self._inbox_keys.clear()
        self._inbox_keys.update(written)

    def _sender_of(self, msg_id: bytes) -> bytes | None:
        raw = self.get("seen_msg", msg_id)
        stored = self.get("messages", raw) if raw else None
        return None if stored is None else decode_msg(stored, trusted=True).sender

    def delete_user_inbox_entry(self, user_id: bytes, chat_id: bytes) -> bool:
        """Remove ``chat_id`` from the user's chat list (after a Remove or Leave)."""
        user_id = check_len(user_id, USER_ID_LEN, "user_id")  # bytes: the cache's key
        chat_id = check_len(chat_id, CHAT_ID_LEN, "chat_id")
        # the key holds rev_ts, which the caller does not know: the cache, else one scan
        key = self._inbox_keys.get(user_id + chat_id) or self._scan_inbox_key(user_id, chat_id)
        if key is None:
            return False
        batch = self.new_batch()
        batch.delete(key, self._handle["user_inbox"])
        self.write(batch)
        self._inbox_keys.pop(user_id + chat_id, None)
        return True

    def list_user_chats(
        self, user_id: bytes, cursor: str | None = None, limit: int = DEFAULT_PAGE_LIMIT
    ) -> ChatListPage:
        """The user's chats, most recent first, with unread counts; paginated by cursor."""
        check_len(user_id, USER_ID_LEN, "user_id")
        if not 1 <= limit <= MAX_PAGE_LIMIT:
            raise InvalidInput(
                f"limit must be 1..{MAX_PAGE_LIMIT}, got {limit}", reason="bad_limit"
            )
        start = user_id
        if cursor is not None:
            after = decode_cursor(cursor, USER_INBOX_KEY_LEN, user_id)
            start = after + b"\x00"
        rows: list[tuple[bytes, InboxEntry]] = []
        for key, raw in self.iter_range("user_inbox", start, prefix_end(user_id)):
            if len(rows) == limit:
                return ChatListPage(self._with_unread(user_id, rows), encode_cursor(rows[-1][0]))
            rows.append((key, decode_inbox_entry(raw, trusted=True)))  # our own rows
        return ChatListPage(self._with_unread(user_id, rows), None)

    def _with_unread(
        self, user_id: bytes, rows: list[tuple[bytes, InboxEntry]]
    ) -> list[ChatListItem]:
        items: list[ChatListItem] = []
        append = items.append
        set_entry, set_unread = _SET_ITEM
        for _, entry in rows:
            chat = entry.chat_id
            item = _new(ChatListItem)  # ChatListItem(entry, unread), through its slots
            set_entry(item, entry)
            set_unread(item, self.unread_count(chat, user_id, self.read_position(chat, user_id)))
            append(item)
        return items
