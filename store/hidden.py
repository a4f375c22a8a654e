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

from store.events import EventLog
from store.keys import CHAT_ID_LEN, check_len


class HiddenIndex(EventLog):
    _hidden_chats: set[bytes] | None = None  # chats with a hidden message (loaded on first use)

    def hidden_chats(self) -> set[bytes]:
        if self._hidden_chats is None:
            self._hidden_chats = {key[:CHAT_ID_LEN] for key, _ in self.iter_all("hidden")}
        return self._hidden_chats

    def hidden_seqs(self, chat_id: bytes) -> set[int]:
        """The seqs of the chat's hidden messages (empty for most chats, without a read)."""
        if chat_id not in self.hidden_chats():
            return set()
        return {
            int.from_bytes(key[CHAT_ID_LEN:], "big")
            for key, _ in self.iter_prefix("hidden", check_len(chat_id, CHAT_ID_LEN, "chat_id"))
        }

    def _note_hidden_chats(self, keys: list[bytes]) -> None:
        """After a batch that added hidden keys was written."""
        chats = self.hidden_chats()
        chats.update(key[:CHAT_ID_LEN] for key in keys)
