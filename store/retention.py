"""Retention GC on ChatDb: by age (``retention_days``) and by size (``max_storage_mb``), oldest first.

One GC cycle with cutoff ``c`` (every decision takes ``now_ms``; see RETENTION.md):

1. ``db.expire_before_ms = c``: from now on ``put_messages`` refuses messages with
   ``hlc.physical_ms <= c`` — a replay by gossip or sync cannot resurrect them.
2. ``trim_chats``: per chat whose oldest message is expired, one ``delete_range``
   over the HLC prefix of the messages CF; a chat whose newest shown content message
   expired gets its ``chats_meta`` last-message fields and its members' inbox entries reset.
3. ``expire_seen``: the aged ``seen_msg`` entries, found in one scan and deleted in
   batches; the same ids leave the replica's Merkle tree in the same step (``Expiry``
   sequences 2 and 3, whoever drives them).
4. ``compact``: range tombstones only free disk once compacted.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

from store.hlc import LOGICAL_BITS
from store.keys import MSG_ID_LEN, extract_hlc_physical_from_seen_value
from store.records import ChatKind, InboxEntry

if TYPE_CHECKING:  # a ChatDb is passed in; this module imports no rocksdict itself
    from store.chatdb import ChatDb

DAY_MS = 86_400_000


@dataclass(frozen=True)
class RetentionPolicy:
    retention_days: float = 0.0  # 0 = keep forever
    max_storage_mb: int = 0  # 0 = unlimited

    def age_cutoff(self, now_ms: int) -> int | None:
        """Messages with hlc.physical_ms <= this are expired by age (None: keep forever)."""
        if self.retention_days <= 0:
            return None
        return now_ms - int(self.retention_days * DAY_MS)

    def cutoff(self, db: ChatDb, now_ms: int) -> int | None:
        """The GC cutoff now: the later of the age cutoff and the size cutoff."""
        candidates = [self.age_cutoff(now_ms)]
        if self.max_storage_mb > 0:
            candidates.append(
                size_cutoff(
                    db, max_bytes=self.max_storage_mb * 1024 * 1024, used_bytes=storage_bytes(db)
                )
            )
        present = [c for c in candidates if c is not None]
        return max(present) if present else None


def storage_bytes(db: ChatDb) -> int:
    """Bytes of data on disk: SST files and the WAL (RocksDB's info LOG files are not data).

    RocksDB deletes files in its background threads (obsolete SSTs after a compaction, old
    WALs): one listed here may be gone when we look at its size, and then counts 0.
    """
    total = 0
    for f in Path(db.config.path).iterdir():
        if f.suffix in (".sst", ".log"):
            with contextlib.suppress(FileNotFoundError):
                total += f.stat().st_size
    return total


def size_cutoff(db: ChatDb, *, max_bytes: int, used_bytes: int) -> int | None:
    """A cutoff that expires the oldest messages covering the excess over ``max_bytes``.

    Assumes messages take the space in proportion to their number (payload sizes
    vary, so a cycle may land a little over or under; the next cycle corrects).
    """
    if max_bytes <= 0 or used_bytes <= max_bytes:
        return None
    times = sorted(physical for _, physical in db.iter_msg_ids())
    if not times:
        return None
    k = max(1, math.ceil(len(times) * (used_bytes - max_bytes) / used_bytes))
    return times[min(k, len(times)) - 1]


def trim_chats(db: ChatDb, cutoff_ms: int) -> list[bytes]:
    """delete_range the expired messages of every chat that has any; the chats trimmed."""
    db.expire_before_ms = max(db.expire_before_ms or cutoff_ms, cutoff_ms)
    trimmed = []
    for chat_id in db.metas.chat_ids():
        first = next(db.rocks.iter_prefix("messages", chat_id), None)
        if first is None or int.from_bytes(first[0][32:40], "big") >> LOGICAL_BITS > cutoff_ms:
            continue
        db.range_delete_old_messages(chat_id, cutoff_ms)
        trimmed.append(chat_id)
        meta = db.load_meta(chat_id)  # its newest shown content message, if it has one
        if meta.last_msg_id != bytes(MSG_ID_LEN) and meta.last_msg_ts >> LOGICAL_BITS <= cutoff_ms:
            reset_preview(db, chat_id)  # it expired, and all content before it
    return trimmed


def reset_preview(db: ChatDb, chat_id: bytes) -> None:
    """No shown content message of the chat is left (what may remain refers to some): its
    meta and inbox entries point at nothing now."""
    meta = replace(db.load_meta(chat_id), last_ts=0, last_msg_id=bytes(MSG_ID_LEN), last_msg_ts=0)
    batch = db.rocks.new_batch()
    db.metas.put(batch, {chat_id: meta})
    db.rocks.write(batch)
    db.metas.remember({chat_id: meta})
    members = db.list_members(chat_id)
    if members:
        entry = InboxEntry(chat_id, ChatKind.GROUP, 0, bytes(MSG_ID_LEN), bytes(20), meta.last_seq)
        db.upsert_inbox_for_members(chat_id, members, entry)


def iter_seen_aged(db: ChatDb, cutoff_ms: int) -> Iterator[bytes]:
    """Msg ids whose HLC physical_ms <= cutoff, in one pass (the iterator reads a snapshot)."""
    for msg_id, key in db.rocks.iter_all("seen_msg"):
        physical = extract_hlc_physical_from_seen_value(key)
        if physical is None or physical <= cutoff_ms:
            yield msg_id


def expire_seen(aged: Iterator[bytes], db: ChatDb, batch: int) -> list[bytes]:
    """Delete the next ``batch`` aged seen_msg entries; their ids (empty when done)."""
    ids = list(islice(aged, batch))
    if ids:
        db.delete_seen_msg_batch(ids)
    return ids


class Expiry:
    """One GC cycle's writes as steps (2 and 3 above), the only place they are sequenced:
    ``trim_chats``, then ``next_batch`` until it returns nothing; ``on_expired`` is told
    of each batch's ids in the same step (a replica takes them out of its Merkle tree).
    ``run`` takes every step at once (tests, benchmarks, ``DbReplica.expire_messages``);
    the node's GC hands each step to its writer, so that writes interleave."""

    def __init__(
        self,
        db: ChatDb,
        cutoff_ms: int,
        batch: int = 10_000,
        on_expired: Callable[[list[bytes]], None] | None = None,
    ) -> None:
        self.db = db
        self.cutoff_ms = cutoff_ms
        self.batch = batch
        self.on_expired = on_expired
        self._aged: Iterator[bytes] | None = None

    def trim_chats(self) -> list[bytes]:
        return trim_chats(self.db, self.cutoff_ms)

    def next_batch(self) -> list[bytes]:
        """The next batch of aged messages out (their ids; empty when the cycle is done)."""
        if self._aged is None:
            self._aged = iter_seen_aged(self.db, self.cutoff_ms)
        ids = expire_seen(self._aged, self.db, self.batch)
        if ids and self.on_expired is not None:
            self.on_expired(ids)
        return ids

    def run(self) -> tuple[int, list[bytes]]:
        """Every step: (chats trimmed, ids expired)."""
        trimmed = len(self.trim_chats())
        expired: list[bytes] = []
        while ids := self.next_batch():
            expired += ids
        return trimmed, expired


@dataclass
class GcResult:
    cutoff_ms: int | None
    chats_trimmed: int = 0
    messages_expired: int = 0


def gc_messages(
    db: ChatDb, cutoff_ms: int | None, *, batch: int = 10_000
) -> tuple[GcResult, list[bytes]]:
    """A whole cycle at once, on a store without trees (tests, benchmarks)."""
    if cutoff_ms is None:
        return GcResult(cutoff_ms), []
    trimmed, expired = Expiry(db, cutoff_ms, batch).run()
    return GcResult(cutoff_ms, trimmed, len(expired)), expired
