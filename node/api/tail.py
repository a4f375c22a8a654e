"""The end of this node's event log, read and serialized once for every stream.

A thousand streams at the log's end would each read the new events from RocksDB (a thread
hop each) and build the same JSON for each event. Instead ``LogTail`` reads what the store
logged since it last looked — once, whoever asks first — decodes it and serializes each event
once (``event_json``), and keeps the newest ``KEEP``. A stream that is behind that window
reads its own feed from the store (``Feeds.feed``). What each user may read is decided
per stream by the feed's own rule (``store.feed.Reader``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

import trio

from store.chat_reads import ChatReads
from store.events import EventKind
from store.feed import FeedEvent

KEEP = 8192  # events held: about a minute of a busy node's log
READ = 4096  # events read from the store at once


@dataclass(frozen=True, slots=True)
class TailEvent:
    position: int
    kind: EventKind
    chat_id: bytes
    about: bytes | None  # a member event's user
    msg_id: bytes | None  # a message event's message
    json: str  # the event as every stream sends it


class LogTail:
    def __init__(self, reads: ChatReads, event_json: Callable[[FeedEvent], str]) -> None:
        self._reads, self._event_json = reads, event_json
        self._floor = reads.last_position  # the tail serves positions after this
        self._read_to = self._floor
        self._events: list[TailEvent] = []
        self._positions: list[int] = []
        self._lock = trio.Lock()

    async def after(self, position: int) -> tuple[list[TailEvent], int] | None:
        """The events after ``position`` and the position they go up to, or None if the tail
        no longer holds them all (the stream then reads the store)."""
        if position < self._floor:
            return None
        if self._read_to < self._reads.last_position:
            async with self._lock:  # one reader for all the streams
                while self._read_to < self._reads.last_position:
                    await self._read()
        if position < self._floor:
            return None
        start = bisect_right(self._positions, position)
        return self._events[start:], self._read_to

    async def _read(self) -> None:
        page = await trio.to_thread.run_sync(self._reads.log_page, self._read_to, READ)
        for event in page.events:
            msg_id = event.msg.msg_id if event.kind is EventKind.MESSAGE and event.msg else None
            json = self._event_json(event)
            self._events.append(
                TailEvent(event.position, event.kind, event.chat_id, event.about, msg_id, json)
            )
            self._positions.append(event.position)
        self._read_to = page.position
        if len(self._events) > KEEP:
            cut = len(self._events) - KEEP
            self._floor = self._positions[cut - 1]
            del self._events[:cut], self._positions[:cut]
        gone_from = {
            e.chat_id for e in page.events if e.kind in (EventKind.DELETE, EventKind.HIDDEN)
        }
        if gone_from:
            await self._forget_gone(gone_from)

    async def _forget_gone(self, chats: set[bytes]) -> None:
        """Drop the held copies of messages of ``chats`` erased or hidden since they were read:
        a stream not past them yet gets them no more (the store's feed would not give them),
        and no erased payload stays in memory."""
        ids = [e.msg_id for e in self._events if e.chat_id in chats and e.msg_id is not None]
        shown = await trio.to_thread.run_sync(self._reads.shown_messages, ids)
        gone = {msg_id for msg_id, is_shown in zip(ids, shown, strict=True) if not is_shown}
        if gone:
            kept = [e for e in self._events if e.msg_id not in gone]
            self._events, self._positions = kept, [e.position for e in kept]
