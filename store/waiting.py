"""The waiting room: messages that arrived before the member op that admits them. Pure.

A message is stored only once an op makes it admissible (``store.access``); until
then it waits here, so a reordering of gossip or a sync frame that brings the
message before its op loses nothing. (A node also keeps the room's messages in
its store — ``Admission.save_waiting`` — so that a restart loses none.) The room is bounded in messages
and bytes and evicts the oldest first: a key that was never a member can occupy
at most this much of a replica, whatever path its messages take. An evicted
message that is admissible somewhere comes back by anti-entropy, from a peer that
stored it — and holds the op that admits it, which the same session brings.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from store.records import MsgV1

DEFAULT_MAX_MESSAGES = 4_096
DEFAULT_MAX_BYTES = 8 * 1024 * 1024


@dataclass
class WaitingStats:
    parked: int = 0
    released: int = 0
    evicted: int = 0


class WaitingRoom:
    def __init__(
        self, max_messages: int = DEFAULT_MAX_MESSAGES, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._msgs: OrderedDict[bytes, MsgV1] = OrderedDict()  # msg id -> message, oldest first
        self._by_chat: dict[bytes, set[bytes]] = {}
        self.bytes = 0
        self.stats = WaitingStats()

    def __len__(self) -> int:
        return len(self._msgs)

    def __contains__(self, msg_id: bytes) -> bool:
        return msg_id in self._msgs

    def park(self, msg: MsgV1) -> list[bytes]:
        """Hold ``msg`` (already waiting: nothing); returns the ids evicted, oldest first, to
        make room — ``msg``'s own if it alone is over the bounds."""
        msg_id = msg.msg_id
        if msg_id in self._msgs:
            return []
        self._msgs[msg_id] = msg
        self._by_chat.setdefault(msg.chat_id, set()).add(msg_id)
        self.bytes += len(msg.encoded)
        self.stats.parked += 1
        evicted = []
        while len(self._msgs) > self.max_messages or self.bytes > self.max_bytes:
            evicted.append(next(iter(self._msgs)))
            self._drop(evicted[-1])
            self.stats.evicted += 1
        return evicted

    def release_chats(self, chat_ids: set[bytes]) -> list[MsgV1]:
        """Take out every message waiting in these chats (the caller parks again what its
        new ops still do not admit)."""
        out = []
        for chat in chat_ids:
            for msg_id in sorted(self._by_chat.get(chat, ())):
                out.append(self._msgs[msg_id])
                self._drop(msg_id)
        self.stats.released += len(out)
        return out

    def waiting(self) -> list[MsgV1]:
        return list(self._msgs.values())

    def of_chats(self, chat_ids: set[bytes]) -> list[MsgV1]:
        return [self._msgs[i] for chat in chat_ids for i in sorted(self._by_chat.get(chat, ()))]

    def discard(self, msg_ids: set[bytes]) -> list[bytes]:
        """Drop these messages if they wait (a delete erased them); the ids dropped."""
        dropped = [i for i in sorted(msg_ids) if i in self._msgs]
        for msg_id in dropped:
            self._drop(msg_id)
        return dropped

    def _drop(self, msg_id: bytes) -> None:
        msg = self._msgs.pop(msg_id)
        self.bytes -= len(msg.encoded)
        ids = self._by_chat[msg.chat_id]
        ids.discard(msg_id)
        if not ids:
            del self._by_chat[msg.chat_id]
