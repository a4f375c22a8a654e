"""Deletes (MESSAGES.md): the DELETES sync domain, and erasing what a valid delete erases.

``deletes[chat | ref | delete id]`` holds every admissible DELETE message — valid
or not yet (an admin add may still arrive) — and ``seen_delete[id]`` indexes them
for sync. ``refs[chat | ref | msg id] = the message's key`` indexes the held
messages that refer to another (put_messages writes it): a delete finds there the
edits and reactions it erases. ``erased[msg id]`` remembers what was erased, so
that a re-post, a gossip copy or a sync frame of it is refused at one lookup.

Erasing a message removes its row, its seen_msg, refs and hidden entries, and
puts its id in ``erased`` — one WriteBatch with the deletes that erase it. RocksDB
keeps a deleted value in older SST files until compaction rewrites them, and in
the write-ahead log until the memtables are flushed: ``compact_erased`` does both
for the erasures since its last call, so that no live file holds the payloads
(MESSAGES.md, "Erased on disk").

Erasing writes the messages' column families (and the hidden index's, the event log's
``event_at``) in the deletes' own WriteBatch: one batch, as the erasure must be atomic with
the delete that makes it. So ``Deletes`` writes those rows through the shared ``Rocks``
rather than through ``Messages``, whose writes each make a batch of their own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from rocksdict import BottommostLevelCompaction, CompactOptions, WriteBatch

from store.events import Event, EventKind, EventLog
from store.keys import (
    CHAT_ID_LEN,
    MESSAGES_KEY_LEN,
    bucket_prefix,
    bucket_range_keys,
    key_by_ref,
    key_hidden,
    referred_end,
    seq_of,
)
from store.kinds import CHANGES_TARGET, IsAdmin
from store.ops import decode_membership_op
from store.plan import AdminState, admin_rule, admin_state_of
from store.records import MsgV1, decode_msg
from store.rocks import Rocks
from store.unread import UnreadCounters
from store.view_rows import ViewRows


class Deletes:
    """The deletes, the erasures they make, and their state: the chats with a delete, each
    chat's admins (cached), the erased keys not compacted yet."""

    def __init__(
        self, rocks: Rocks, log: EventLog, unread: UnreadCounters, views: ViewRows
    ) -> None:
        self._rocks, self._log, self._unread, self._views = rocks, log, unread, views
        self._handle = rocks.handle
        self._admin_cache: dict[bytes, AdminState] | None = None
        self._delete_chats: set[bytes] | None = None  # chats with a delete (loaded on first use)
        # messages keys erased and not compacted yet: written by the applying thread, taken by
        # whoever compacts (the node's erasure task)
        self._uncompacted: list[bytes] = []
        self._uncompacted_lock = threading.Lock()

    def delete_chats(self) -> set[bytes]:
        """The chats that hold a delete: a message elsewhere needs no erasure check."""
        if self._delete_chats is None:
            self._delete_chats = {key[:CHAT_ID_LEN] for key, _ in self._rocks.iter_all("deletes")}
        return self._delete_chats

    # --- who may delete others' messages ---

    def admin_state(self, chat_id: bytes) -> AdminState:
        """The chat's creator and admins (``store.plan``), cached per chat; the writer keeps
        the cache true (``remember_admins``)."""
        cache = self._admin_cache
        if cache is None:
            cache = self._admin_cache = {}
        state = cache.get(chat_id)
        if state is None:
            ops = (
                decode_membership_op(v[1:])
                for _, v in self._rocks.iter_prefix("member_ops", chat_id)
            )
            state = cache[chat_id] = admin_state_of(ops)
        return state

    def forget(self) -> None:
        """Drop the caches (a write that carried their changes failed): loaded again on use."""
        self._admin_cache = None
        self._delete_chats = None

    def remember_admins(self, states: dict[bytes, AdminState]) -> None:
        if self._admin_cache is not None:
            self._admin_cache.update(states)

    def admins(self, chat_id: bytes) -> IsAdmin:
        """Who may delete others' messages in the chat, from when (store.kinds.IsAdmin)."""
        return admin_rule(self.admin_state(chat_id))

    # --- storing deletes, erasing (what store.plan decided) ---

    def write_deletes(
        self, deletes: list[MsgV1], erase: dict[bytes, MsgV1], refused: dict[bytes, bytes]
    ) -> set[bytes]:
        """Store new DELETE messages, erase the held messages ``erase`` names, and remember as
        erased ``refused`` (id -> chat: they came after the delete erasing them) — one
        WriteBatch; returns the messages keys erased (a later write into the same shared
        batch reads them as still held: ``put_messages``' ``erased``)."""
        batch = self._rocks.new_batch()
        deletes_cf, seen_cf = self._handle["deletes"], self._handle["seen_delete"]
        events: list[Event] = []
        for d in deletes:
            assert d.ref is not None
            key = key_by_ref(d.chat_id, d.ref, d.msg_id)
            batch.put(key, d.encoded, deletes_cf)
            batch.put(d.msg_id, key, seen_cf)
            events.append((EventKind.DELETE, key))
        rewrite, erased = self._erase(list(erase.values()), batch)
        for msg_id, chat_id in sorted(refused.items()):
            batch.put(msg_id, chat_id, self._handle["erased"])
        self._log.write(batch, events)
        self.delete_chats().update(d.chat_id for d in deletes)
        self._note_erased(rewrite)
        return erased

    def _erase(self, msgs: list[MsgV1], batch: WriteBatch) -> tuple[list[bytes], set[bytes]]:
        """Add to ``batch`` the erasure of these held messages; returns the messages keys
        whose rows (in ``messages``, ``referred`` and ``views``) held what went —
        ``compact_erased`` rewrites them — and the erased messages' own keys. The view rows
        of the targets of erased edits and reactions are folded again without them
        (``store.view_rows``)."""
        seen = self._rocks.multi_get("seen_msg", [m.msg_id for m in msgs])
        self._unread.void(batch, {m.chat_id for m in msgs})  # what they count may go
        referred = self._handle["referred"]
        rewrite: list[bytes] = []
        refold: dict[bytes, None] = {}  # targets of erased referrers
        for msg, value in zip(msgs, seen, strict=True):
            assert value is not None, "erasing a message not held"
            key = value[:MESSAGES_KEY_LEN]  # (then a shown one's event position: store.events)
            self._erase_one(msg, key, batch)
            rewrite.append(key)
            for row, _ in self._rocks.iter_prefix(
                "referred", key
            ):  # its edits' and reactions' bytes
                batch.delete(row, referred)
            if msg.kind in CHANGES_TARGET and msg.ref is not None:
                target = self._rocks.get("seen_msg", msg.ref)
                if target is not None:  # the target's row holding this one's bytes
                    target = target[:MESSAGES_KEY_LEN]
                    batch.delete(target + key, referred)
                    rewrite.append(target)
                    refold[target] = None
        gone = {value[:MESSAGES_KEY_LEN] for value in seen if value is not None}
        if refold:
            kept: dict[bytes, MsgV1 | None] = {t: None for t in refold if t not in gone}
            self._views.refresh(batch, kept, gone=gone)
        return rewrite, gone

    def _erase_one(self, msg: MsgV1, key: bytes, batch: WriteBatch) -> None:
        handle = self._handle
        batch.delete(key, handle["messages"])
        batch.delete(msg.msg_id, handle["seen_msg"])
        if msg.ref is not None:
            batch.delete(key_by_ref(msg.chat_id, msg.ref, msg.msg_id), handle["refs"])
        seq = seq_of(key)
        batch.delete(key_hidden(msg.chat_id, seq), handle["hidden"])
        batch.delete(key, handle["event_at"])
        batch.delete(key, handle["views"])
        batch.put(msg.msg_id, msg.chat_id, handle["erased"])

    def _note_erased(self, keys: list[bytes]) -> None:
        with self._uncompacted_lock:
            self._uncompacted += keys

    def erasure_pending(self) -> bool:
        """Whether erased payloads may still be in the files (``compact_erased`` removes them)."""
        return bool(self._uncompacted)

    def compact_erased(self) -> int:
        """Flush every CF (so no write-ahead log still needed holds a payload), then compact
        the erased keys' range down to the last level, rewriting it there too: no live file
        keeps their payloads. (Without ``force`` RocksDB may move the file holding a payload
        to the last level untouched, beside the deletion.) One flush and one compaction for
        all the erasures since the last call — they cost ~0.1 s, so the node runs this in a
        task of its own (``node/erasure.py``), never in the writer. ``referred`` rows are keyed
        by their target's messages key: the same range, to its last row; ``views`` rows (an
        erased edit's bytes, folded again) by it alone. Returns how many
        messages keys the range had."""
        with self._uncompacted_lock:
            keys, self._uncompacted = sorted(set(self._uncompacted)), []
        if not keys:
            return 0
        self._rocks.flush()
        options = CompactOptions()
        options.set_bottommost_level_compaction(BottommostLevelCompaction.force())
        self._rocks.cf["messages"].compact_range(keys[0], keys[-1] + b"\x00", options)
        self._rocks.cf["referred"].compact_range(keys[0], referred_end(keys[-1]), options)
        self._rocks.cf["views"].compact_range(keys[0], keys[-1] + b"\x00", options)
        return len(keys)

    def deletes_of(self, chat_id: bytes, ref: bytes = b"") -> list[MsgV1]:
        """The chat's DELETE messages (valid or not); of one target if ``ref`` is given."""
        return [
            decode_msg(value, trusted=True)
            for _, value in self._rocks.iter_prefix("deletes", chat_id + ref)
        ]

    def is_erased(self, msg_id: bytes) -> bool:
        return self._rocks.get("erased", msg_id) is not None

    # --- sync helpers (the DELETES domain) ---

    def iter_delete_ids(self) -> Iterator[bytes]:
        for delete_id, _ in self._rocks.iter_all("seen_delete"):
            yield delete_id

    def get_range_delete_ids(self, start: int, end: int) -> list[bytes]:
        return self._rocks.range_keys("seen_delete", *bucket_range_keys(start, end))

    def chats_of_deletes(self, ids: list[bytes]) -> list[bytes | None]:
        """The chat of each held delete (None: not held): its deletes key starts with it."""
        keys = self._rocks.multi_get("seen_delete", ids)
        return [None if k is None else k[:CHAT_ID_LEN] for k in keys]

    def iter_delete_chats(self) -> Iterator[tuple[bytes, bytes]]:
        """(delete id, chat id) of every held delete (per-shard trees, ``sync.shards``)."""
        for delete_id, key in self._rocks.iter_all("seen_delete"):
            yield delete_id, key[:CHAT_ID_LEN]

    def get_bucket_delete_ids(self, bucket: int) -> list[bytes]:
        return [i for i, _ in self._rocks.iter_prefix("seen_delete", bucket_prefix(bucket))]

    def get_deletes_by_ids(self, ids: list[bytes]) -> list[bytes | None]:
        keys = self._rocks.multi_get("seen_delete", ids)
        values = iter(self._rocks.multi_get("deletes", [key for key in keys if key]))
        return [next(values) if key else None for key in keys]
