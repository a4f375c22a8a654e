"""Unread counters: ``unread[chat | reader]`` = the reader's position and unread count.

The chat list reads a reader's unread count in a chat from here (one multi-get for a page)
instead of seeking their position and scanning the messages after it (``store.reads``).
A counter is derived state: every write that changes what it counts changes it in the
same WriteBatch, so it equals ``Receipts.recount`` at every point, and after a restart:

- messages shown (``store.messages``): the counters of their chat follow them
  (``store.unread_counter.follow_counters``: new content by others after a position is
  added, a receipt moving its reader's position recounts from there);
- a chat-list entry written for a reader (``store.inbox``: a member added, a chat's first
  message) creates their counter by a recount; an entry deleted (a member removed or gone)
  deletes it;
- what hides, shows again or removes stored messages — the re-decided hidden index
  (``store.admission``), erasures (``store.deletes``), the retention trim — deletes the
  chat's counters (``void``): the next entry written recreates them.

A reader without a counter (a database of an earlier version, a voided chat) is recounted
when read. Who has counters is a local choice, like the chat list itself; what a counter
says is not.
"""

from __future__ import annotations

from collections.abc import Iterable

from rocksdict import WriteBatch

from store.keys import CHAT_ID_LEN, USER_ID_LEN
from store.reads import Receipts
from store.rocks import Rocks
from store.unread_counter import Counter, Shown, decode_counter, encode_counter, follow_counters

CACHED_CHATS = 1 << 14  # chats whose counters are kept in memory, at most

ChatCounters = dict[bytes, Counter]  # reader -> counter


class UnreadCounters:
    """The counter rows, and a cache of them per chat (filled from disk, changed with each
    write that changes them; one writer at a time). ``forget`` after a failed write."""

    def __init__(self, rocks: Rocks, receipts: Receipts) -> None:
        self._rocks, self._receipts = rocks, receipts
        self._chats: dict[bytes, ChatCounters] = {}  # chat -> its counters, as on disk
        self._void: set[bytes] = set()  # chats whose rows a written (or pending) batch deletes

    def of_chat(self, chat_id: bytes) -> ChatCounters | None:
        """The chat's counters (None: it has none)."""
        if chat_id in self._void:
            return None
        counters = self._chats.get(chat_id)
        if counters is None:
            rows = self._rocks.iter_prefix("unread", chat_id)
            counters = {key[CHAT_ID_LEN:]: decode_counter(value) for key, value in rows}
            if len(self._chats) >= CACHED_CHATS:
                self._chats.clear()
            self._chats[chat_id] = counters
        return counters or None

    def forget(self) -> None:
        """A write that carried counter changes failed: read them from disk again."""
        self._chats.clear()
        self._void.clear()

    # --- writes, each in the caller's batch ---

    def follow(
        self, batch: WriteBatch, shown: dict[bytes, list[Shown]]
    ) -> dict[bytes, ChatCounters]:
        """Put in ``batch`` the counters of each chat in ``shown`` (chat -> its messages shown
        by this batch, not yet on disk) moved past them; returns them for ``remember``."""
        unread_cf = self._rocks.handle["unread"]
        changes: dict[bytes, ChatCounters] = {}
        for chat_id, rows in shown.items():
            counters = self.of_chat(chat_id)
            if counters is None:
                continue

            def recount(reader: bytes, position: int, chat_id: bytes = chat_id) -> int:
                return self._receipts.unread_after(chat_id, reader, position)

            changed = follow_counters(counters, rows, recount)
            for reader, counter in changed.items():
                batch.put(chat_id + reader, encode_counter(*counter), unread_cf)
            changes[chat_id] = changed
        return changes

    def remember(self, changes: dict[bytes, ChatCounters]) -> None:
        """After the batch ``follow`` filled was written (or handed to the shared batch,
        whose failure calls ``forget``)."""
        for chat_id, changed in changes.items():
            counters = self._chats.get(chat_id)
            if counters is not None:
                counters.update(changed)

    def create(self, batch: WriteBatch, chat_id: bytes, readers: Iterable[bytes]) -> bool:
        """Recount the readers' counters that are missing, from what is on disk (so never
        inside a shared batch, whose writes are not on disk yet); ``created`` once written.
        Whether any was."""
        if self._rocks.is_shared(batch):
            return False
        counters = self.of_chat(chat_id) or {}
        unread_cf = self._rocks.handle["unread"]
        made = False
        for reader in readers:
            if reader not in counters:
                counter = self._receipts.recount(chat_id, reader)
                batch.put(chat_id + reader, encode_counter(*counter), unread_cf)
                made = True
        return made

    def created(self, chat_ids: Iterable[bytes]) -> None:
        """After a batch that created counters of these chats was written."""
        for chat_id in chat_ids:
            self._void.discard(chat_id)
            self._chats.pop(chat_id, None)  # read again from disk when next asked

    def drop(self, batch: WriteBatch, chat_id: bytes, reader: bytes) -> None:
        """Delete one reader's counter (their chat-list entry goes); the cache carries it
        (``forget`` on failure)."""
        batch.delete(chat_id + reader, self._rocks.handle["unread"])
        counters = self._chats.get(chat_id)
        if counters is not None:
            counters.pop(reader, None)

    def void(self, batch: WriteBatch, chat_ids: Iterable[bytes]) -> None:
        """Delete every counter of these chats: the batch changes what they count in a way
        they do not follow (hidden, shown again, erased, trimmed). From now on they have
        none (``forget`` if the batch fails)."""
        unread_cf = self._rocks.handle["unread"]
        for chat_id in set(chat_ids):
            if chat_id in self._void:
                continue
            for key, _ in self._rocks.iter_prefix("unread", chat_id):
                batch.delete(key, unread_cf)
            self._void.add(chat_id)
            self._chats.pop(chat_id, None)

    # --- reads ---

    def counts(self, user_id: bytes, chat_ids: list[bytes]) -> list[int | None]:
        """The user's unread count in each chat (None: no counter; ids checked by the
        caller), one multi-get."""
        if len(user_id) != USER_ID_LEN:
            raise ValueError("user_id must be 20 bytes")
        raw = self._rocks.multi_get("unread", [chat_id + user_id for chat_id in chat_ids])
        return [None if value is None else decode_counter(value)[1] for value in raw]
