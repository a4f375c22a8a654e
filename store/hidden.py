"""The hidden index: stored messages their sender was not active to send (a local view).

``hidden[chat | seq] = the message's key`` for every stored group message whose
sender was not an active member at its stamp (``store.access.visible``). The
writer keeps it in step: when it stores messages and when member ops change
a sender's history (``store.admission``). Reads — a chat's history, the chat
list's previews and unread counts — leave these messages out. Most chats have
none, and the set of chats that have some is kept in memory, so they cost
nothing there.
"""

from __future__ import annotations

from store.keys import CHAT_ID_LEN, check_len
from store.rocks import Rocks


class Hidden:
    """The hidden index's reads, and the set of chats that have hidden messages (its state).
    The writes are the writers' (``store.messages``, ``store.admission``): they put the keys
    in their own WriteBatch and call ``note`` once it is written."""

    def __init__(self, rocks: Rocks) -> None:
        self._rocks = rocks
        self._chats: set[bytes] | None = None  # chats with a hidden message (loaded on first use)

    def chats(self) -> set[bytes]:
        if self._chats is None:
            self._chats = {key[:CHAT_ID_LEN] for key, _ in self._rocks.iter_all("hidden")}
        return self._chats

    def forget(self) -> None:
        """Drop the cache (a write that carried its changes failed): loaded again on use."""
        self._chats = None

    def seqs(self, chat_id: bytes) -> set[int]:
        """The seqs of the chat's hidden messages (empty for most chats, without a read)."""
        if chat_id not in self.chats():
            return set()
        rows = self._rocks.iter_prefix("hidden", check_len(chat_id, CHAT_ID_LEN, "chat_id"))
        return {int.from_bytes(key[CHAT_ID_LEN:], "big") for key, _ in rows}

    def note(self, keys: list[bytes]) -> None:
        """After a batch that added hidden keys was written."""
        chats = self.chats()
        chats.update(key[:CHAT_ID_LEN] for key in keys)
