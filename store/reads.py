"""Read positions and unread counts, from the users' signed READ_RECEIPTs (MESSAGES.md).

``receipts[chat | user | position | seq] = the receipt's messages key`` for every stored
receipt (written with the message by ``store.messages``, trimmed with it by the retention
GC). A user's read position in a chat is the greatest position of their shown receipts: one
reverse seek. Their unread count is the number of shown content messages by someone else
stamped after it: nothing to count when the position is at or past the chat's newest shown
content message (its ChatMeta says which), else a scan of the chat's messages from there
that reads sender and kind in place and stops at ``UNREAD_CAP``, so a long chat never read
costs a bounded scan. Erased messages are no longer stored, so they are not counted.

Both are functions of the stored messages and the hidden index, so every replica holding the
same messages counts the same. ``recount`` is what a chat list's counters (``store.unread``)
must give; the list reads them and recounts only a reader who has none.
"""

from __future__ import annotations

from collections.abc import Iterator

from store.hidden import Hidden
from store.hlc import Hlc
from store.keys import (
    CHAT_ID_LEN,
    MSG_ID_LEN,
    U64_MAX,
    USER_ID_LEN,
    check_len,
    prefix_end,
    seq_of,
)
from store.kinds import CONTENT
from store.metas import Metas
from store.records import KIND_AT, STAMP_AT
from store.rocks import Rocks
from store.unread_counter import UNREAD_CAP as UNREAD_CAP  # (its home; named here too)

NO_MESSAGE = bytes(MSG_ID_LEN)  # ChatMeta.last_msg_id of a chat with no shown content
_POSITION_AT = CHAT_ID_LEN + USER_ID_LEN
_SENDER_AT = STAMP_AT - USER_ID_LEN  # where a stored message's sender starts
_CONTENT_BYTES = frozenset(int(kind) for kind in CONTENT)  # kind bytes, hashed as ints


class Receipts:
    """Read positions and unread counts: reads only (the receipts are written with their
    messages, ``store.messages``)."""

    def __init__(self, rocks: Rocks, metas: Metas, hidden: Hidden) -> None:
        self._rocks, self._metas, self._hidden = rocks, metas, hidden

    def read_position(self, chat_id: bytes, user_id: bytes) -> Hlc | None:
        """The greatest position of the user's shown receipts in the chat (None: none)."""
        reader = check_len(chat_id, CHAT_ID_LEN, "chat_id") + check_len(
            user_id, USER_ID_LEN, "user_id"
        )
        packed = self._position(reader, self._hidden.seqs(chat_id))
        return None if packed is None else Hlc.unpack(packed)

    def _position(self, reader: bytes, hidden: set[int]) -> int | None:
        """``read_position`` packed, for ``reader`` = chat | user (checked by the caller):
        the first row of a reverse scan from rocksdict's own iterator."""
        for key, _ in self._rocks.items("receipts", reader, prefix_end(reader), reverse=True):
            if key[:_POSITION_AT] != reader:
                return None  # (below the reader's rows: it has none)
            if not hidden or seq_of(key) not in hidden:
                return int.from_bytes(key[_POSITION_AT : _POSITION_AT + 8], "big")
        return None

    def unread_count(self, chat_id: bytes, user_id: bytes, position: Hlc | None) -> int:
        """Shown content messages of the chat by others stamped after ``position``, up to
        ``UNREAD_CAP``."""
        check_len(chat_id, CHAT_ID_LEN, "chat_id")
        packed = None if position is None else position.pack()
        return self._unread(chat_id, user_id, packed, self._hidden.seqs(chat_id))

    def unread_for(self, chat_id: bytes, user_id: bytes) -> int:
        """``unread_count`` at the user's ``read_position`` (ids checked by the caller): the
        chat list's call, one hidden lookup and no Hlc made."""
        hidden = self._hidden.seqs(chat_id)
        return self._unread(chat_id, user_id, self._position(chat_id + user_id, hidden), hidden)

    def recount(self, chat_id: bytes, user_id: bytes) -> tuple[int | None, int]:
        """(packed read position, unread count) of the user, from what is stored (ids checked
        by the caller): what their counters (``store.unread``) must give."""
        hidden = self._hidden.seqs(chat_id)
        position = self._position(chat_id + user_id, hidden)
        return position, self._unread(chat_id, user_id, position, hidden)

    def position(self, chat_id: bytes, user_id: bytes) -> int | None:
        """``read_position`` packed (ids checked by the caller)."""
        return self._position(chat_id + user_id, self._hidden.seqs(chat_id))

    def content_by_sender(self, chat_id: bytes, after: int | None = None) -> dict[bytes, int]:
        """Sender -> how many shown content messages of the chat they sent, stamped after the
        packed stamp ``after`` (None: all) — not capped: the unread counters' totals
        (``store.unread``). One scan from ``after``, sender and kind read in place."""
        start = chat_id
        if after is not None:
            if after >= U64_MAX:
                return {}
            start = chat_id + (after + 1).to_bytes(8, "big")
        end = prefix_end(chat_id)
        values = self._shown_values(start, end, self._hidden.seqs(chat_id))
        counts: dict[bytes, int] = {}
        kind_at, content = KIND_AT, _CONTENT_BYTES
        for value in values:
            if value[kind_at[value[STAMP_AT]]] in content:
                sender = value[_SENDER_AT:STAMP_AT]
                counts[sender] = counts.get(sender, 0) + 1
        del end  # (held to here: the scan's bound)
        return counts

    def _unread(self, chat_id: bytes, user_id: bytes, packed: int | None, hidden: set[int]) -> int:
        meta = self._metas.load(chat_id)  # its newest shown content message, if it has one
        if meta.last_msg_id == NO_MESSAGE or (packed is not None and packed >= meta.last_msg_ts):
            return 0  # nothing to read, or read up to the end (most chats in a list): no scan
        start = chat_id
        if packed is not None:
            if packed >= U64_MAX:
                return 0
            start = chat_id + (packed + 1).to_bytes(8, "big")
        end = prefix_end(chat_id)
        values = self._shown_values(start, end, hidden)
        # sender_and_kind, inlined: the sender's bytes and the kind byte read in place
        count = 0
        kind_at, content = KIND_AT, _CONTENT_BYTES
        for value in values:
            if value[_SENDER_AT:STAMP_AT] != user_id and value[kind_at[value[STAMP_AT]]] in content:
                count += 1
                if count == UNREAD_CAP:
                    break
        del end  # (held to here: the scan's bound)
        return count

    def _shown_values(self, start: bytes, end: bytes | None, hidden: set[int]) -> Iterator[bytes]:
        """The values of the messages from ``start`` to ``end``, but the hidden ones (seqs in
        ``hidden``), in key order. The caller keeps ``end`` alive while it iterates."""
        if hidden:  # rare: the keys say which are hidden
            rows = self._rocks.iter_range("messages", start, end)
            return (value for key, value in rows if seq_of(key) not in hidden)
        return self._rocks.iter_values("messages", start, end)
