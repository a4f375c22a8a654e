"""Unread counters: per chat its shown content total, per (chat, user) their tally.

``unread[chat] = total`` and ``unread[chat | user] = tally`` (``store.unread_counter``: how a
reader's count follows from them). The chat list reads its page's counts in one multi-get
instead of seeking each reader's position and scanning the messages after it
(``store.reads``). Derived state: every write that changes what they count changes them in
the same WriteBatch, so a reader's count equals ``Receipts.recount`` at every point, and
after a restart:

- messages shown (``store.messages``): their chat's total and their senders' tallies follow
  them, and the readers positioned after a late one's stamp, or whose receipt moved;
- a chat-list entry written for a reader (``store.inbox``: a member added, a chat's first
  message) makes them a reader (the chat's first: a scan of the chat counts the total and
  every sender's own); an entry deleted (a member removed) keeps only their own count;
- what hides, shows again or removes stored messages — the re-decided hidden index
  (``store.admission``), erasures (``store.deletes``), the retention trim — deletes the
  chat's rows (``void``): the next entry written makes them again.

A reader without a tally, or in a chat without a total (a store of an earlier version, a
voided chat), is recounted when read. Who is a reader is a local choice, like the chat list
itself; what a count says is not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rocksdict import WriteBatch

from store.keys import CHAT_ID_LEN, USER_ID_LEN
from store.reads import Receipts
from store.rocks import Rocks
from store.unread_counter import (
    Reader,
    Shown,
    Tally,
    count_of,
    decode_tally,
    decode_total,
    encode_tally,
    encode_total,
    follow_tallies,
)

CACHED_CHATS = 1 << 14  # chats whose rows are kept in memory, at most


@dataclass
class ChatTallies:
    total: int  # the chat's shown content
    tallies: dict[bytes, Tally]  # user -> their tally (every sender, and the readers)
    last_position: int = -1  # at or after every reader's position (follow_tallies)

    def note_positions(self, tallies: Iterable[Tally]) -> None:
        for tally in tallies:
            if tally.reader is not None and tally.reader.position is not None:
                self.last_position = max(self.last_position, tally.reader.position)


Changes = dict[bytes, tuple[int, dict[bytes, Tally]]]  # chat -> its new total, changed tallies


class UnreadCounters:
    """The rows, and a cache of them per chat (filled from disk, changed with each write that
    changes them; one writer at a time). ``forget`` after a failed write."""

    def __init__(self, rocks: Rocks, receipts: Receipts) -> None:
        self._rocks, self._receipts = rocks, receipts
        self._chats: dict[bytes, ChatTallies | None] = {}  # as on disk (None: no total)
        self._void: set[bytes] = set()  # chats whose rows a written (or pending) batch deletes

    def of_chat(self, chat_id: bytes) -> ChatTallies | None:
        """The chat's rows (None: it has no total, so nothing to keep)."""
        if chat_id in self._void:
            return None
        if chat_id not in self._chats:
            if len(self._chats) >= CACHED_CHATS:
                self._chats.clear()
            self._chats[chat_id] = self._load(chat_id)
        return self._chats[chat_id]

    def _load(self, chat_id: bytes) -> ChatTallies | None:
        total, tallies = None, {}
        for key, value in self._rocks.iter_prefix("unread", chat_id):
            if len(key) == CHAT_ID_LEN:
                total = decode_total(value)
            else:
                tallies[key[CHAT_ID_LEN:]] = decode_tally(value)
        if total is None:
            return None
        chat = ChatTallies(total, tallies)
        chat.note_positions(tallies.values())
        return chat

    def forget(self) -> None:
        """A write that carried changes to the rows failed: read them from disk again."""
        self._chats.clear()
        self._void.clear()

    # --- writes, each in the caller's batch ---

    def follow(self, batch: WriteBatch, shown: dict[bytes, list[Shown]]) -> Changes:
        """Put in ``batch`` the rows of each chat in ``shown`` (chat -> its messages shown by
        this batch, not yet on disk) moved past them; returns them for ``remember``."""
        unread_cf = self._rocks.handle["unread"]
        changes: Changes = {}
        for chat_id, rows in shown.items():
            chat = self.of_chat(chat_id)
            if chat is None:
                continue

            def after(user: bytes, position: int, chat_id: bytes = chat_id) -> tuple[int, int]:
                later = self._receipts.content_by_sender(chat_id, position)
                return sum(later.values()), later.get(user, 0)

            total, changed = follow_tallies(
                chat.total, chat.tallies, rows, after, chat.last_position
            )
            if total != chat.total:
                batch.put(chat_id, encode_total(total), unread_cf)
            for user, tally in changed.items():
                batch.put(chat_id + user, encode_tally(tally), unread_cf)
            changes[chat_id] = (total, changed)
        return changes

    def remember(self, changes: Changes) -> None:
        """After the batch ``follow`` filled was written (or handed to the shared batch,
        whose failure calls ``forget``)."""
        for chat_id, (total, changed) in changes.items():
            chat = self._chats.get(chat_id)
            if chat is not None:
                chat.total = total
                chat.tallies.update(changed)
                chat.note_positions(changed.values())

    def create(self, batch: WriteBatch, chat_id: bytes, readers: Iterable[bytes]) -> bool:
        """Make the readers who are not yet readers so, from what is on disk (so never inside
        a shared batch, whose writes are not on disk yet); the chat's first reader counts
        its total and every sender's own. ``created`` once written. Whether any was made."""
        if self._rocks.is_shared(batch):
            return False
        chat = self.of_chat(chat_id)
        new = [
            r for r in readers if chat is None or (t := chat.tallies.get(r)) is None or not t.reader
        ]
        if not new:
            return False
        unread_cf = self._rocks.handle["unread"]
        if chat is None:  # the chat's first reader: its total and every sender's own
            owns = self._receipts.content_by_sender(chat_id)
            chat = ChatTallies(sum(owns.values()), {u: Tally(n, None) for u, n in owns.items()})
            batch.put(chat_id, encode_total(chat.total), unread_cf)
            for user, tally in chat.tallies.items():
                if user not in new:
                    batch.put(chat_id + user, encode_tally(tally), unread_cf)
        for reader in new:
            own = chat.tallies[reader].own if reader in chat.tallies else 0
            position = self._receipts.position(chat_id, reader)
            later = (
                self._receipts.content_by_sender(chat_id, position)
                if position is not None
                else {u: t.own for u, t in chat.tallies.items()}
            )
            part = Reader(chat.total - sum(later.values()), own - later.get(reader, 0), position)
            batch.put(chat_id + reader, encode_tally(Tally(own, part)), unread_cf)
        return True

    def created(self, chat_ids: Iterable[bytes]) -> None:
        """After a batch that made readers of these chats was written."""
        for chat_id in chat_ids:
            self._void.discard(chat_id)
            self._chats.pop(chat_id, None)  # read again from disk when next asked

    def drop(self, batch: WriteBatch, chat_id: bytes, reader: bytes) -> None:
        """The reader's chat-list entry goes: their tally keeps only their own count (the
        cache carries it; ``forget`` on failure)."""
        chat = self.of_chat(chat_id)
        tally = None if chat is None else chat.tallies.get(reader)
        if chat is None or tally is None or tally.reader is None:
            return
        chat.tallies[reader] = Tally(tally.own, None)
        batch.put(
            chat_id + reader, encode_tally(chat.tallies[reader]), self._rocks.handle["unread"]
        )

    def void(self, batch: WriteBatch, chat_ids: Iterable[bytes]) -> None:
        """Delete every row of these chats: the batch changes what they count in a way they do
        not follow (hidden, shown again, erased, trimmed). From now on they have none
        (``forget`` if the batch fails)."""
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
        """The user's unread count in each chat (None: not a reader there; ids checked by the
        caller): one multi-get of the chats' totals and the user's tallies."""
        if len(user_id) != USER_ID_LEN:
            raise ValueError("user_id must be 20 bytes")
        n = len(chat_ids)
        raw = self._rocks.multi_get("unread", chat_ids + [c + user_id for c in chat_ids])
        return [
            None if total is None or tally is None else count_of(total, tally)
            for total, tally in zip(raw[:n], raw[n:], strict=True)
        ]
