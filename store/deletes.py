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
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from rocksdict import BottommostLevelCompaction, CompactOptions, WriteBatch

from store.authz import GroupProof
from store.events import Event, EventKind
from store.hlc import Hlc
from store.keys import (
    CHAT_ID_LEN,
    MSG_ID_LEN,
    bucket_prefix,
    key_by_ref,
    key_hidden,
    referred_end,
    seq_of,
)
from store.kinds import IsAdmin, delete_is_valid, erases
from store.members import MemberStore
from store.messages import MessageStore
from store.ops import MembershipAction, decode_membership_op
from store.records import MsgV1, Role, decode_msg


class DeleteStore(MessageStore, MemberStore):
    _admin_cache: dict[bytes, tuple[bytes | None, dict[bytes, Hlc]]] | None = None
    _delete_chats: set[bytes] | None = None  # chats with a delete (loaded on first use)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # messages keys erased and not compacted yet: written by the applying thread, taken by
        # whoever compacts (the node's erasure task)
        self._uncompacted: list[bytes] = []
        self._uncompacted_lock = threading.Lock()

    def delete_chats(self) -> set[bytes]:
        """The chats that hold a delete: a message elsewhere needs no erasure check."""
        if self._delete_chats is None:
            self._delete_chats = {key[:CHAT_ID_LEN] for key, _ in self.iter_all("deletes")}
        return self._delete_chats

    # --- who may delete others' messages ---

    def admins(self, chat_id: bytes) -> IsAdmin:
        """The chat's creator, and each user from their first admin add on (cached per chat;
        ``forget_admins`` when its member ops grow)."""
        cache = self._admin_cache
        if cache is None:
            cache = self._admin_cache = {}
        known = cache.get(chat_id)
        if known is None:
            known = cache[chat_id] = self._load_admins(chat_id)
        creator, since = known

        def is_admin(user: bytes, hlc: Hlc) -> bool:
            first = since.get(user)
            return user == creator or (first is not None and first <= hlc)

        return is_admin

    def _load_admins(self, chat_id: bytes) -> tuple[bytes | None, dict[bytes, Hlc]]:
        creator: bytes | None = None
        since: dict[bytes, Hlc] = {}
        for _, value in self.iter_prefix("member_ops", chat_id):
            op = decode_membership_op(value[1:])
            if isinstance(op.proof, GroupProof):
                creator = op.proof.creator
            if op.action is MembershipAction.ADD and op.role is Role.ADMIN:
                first = since.get(op.user_id)
                since[op.user_id] = op.hlc if first is None else min(first, op.hlc)
        return creator, since

    def forget_admins(self, chat_ids: set[bytes]) -> None:
        if self._admin_cache is not None:
            for chat in chat_ids:
                self._admin_cache.pop(chat, None)

    # --- storing deletes, erasing ---

    def put_deletes(self, deletes: list[MsgV1]) -> tuple[list[bool], list[bytes]]:
        """Store admissible DELETE messages (one WriteBatch) and erase what the valid ones
        erase: per delete whether it was new, and the ids of the messages erased."""
        held = self.multi_get("seen_delete", [d.msg_id for d in deletes])
        batch = self.new_batch()
        deletes_cf, seen_cf = self._handle["deletes"], self._handle["seen_delete"]
        new: list[bool] = []
        fresh: dict[bytes, MsgV1] = {}
        events: list[Event] = []
        for d, seen in zip(deletes, held, strict=True):
            is_new = seen is None and d.msg_id not in fresh
            new.append(is_new)
            if is_new:
                assert d.ref is not None
                key = key_by_ref(d.chat_id, d.ref, d.msg_id)
                batch.put(key, d.encoded, deletes_cf)
                batch.put(d.msg_id, key, seen_cf)
                fresh[d.msg_id] = d
                events.append((EventKind.DELETE, key))
        erased, rewrite = self._erase(list(fresh.values()), batch)
        if batch.len():
            self.write(batch, events)
            self.delete_chats().update(d.chat_id for d in fresh.values())
        self._note_erased(rewrite)
        return new, [msg_id for msg_id, _ in erased]

    def erase_for_senders(self, pairs: set[tuple[bytes, bytes]]) -> list[bytes]:
        """After member ops made these (chat, user) admins: erase what their deletes erase now."""
        deletes = [
            d
            for chat in {chat for chat, _ in pairs}
            for d in self._deletes_of(chat)
            if (chat, d.sender) in pairs
        ]
        batch = self.new_batch()
        erased, rewrite = self._erase(deletes, batch)
        if batch.len():
            self.write(batch)
        self._note_erased(rewrite)
        return [msg_id for msg_id, _ in erased]

    def erased_on_arrival(self, msgs: list[MsgV1]) -> set[bytes]:
        """The ids among ``msgs`` (not deletes) that a held valid delete erases, or that were
        erased before: they must not be stored."""
        chats = self.delete_chats()
        msgs = [m for m in msgs if m.chat_id in chats]  # no delete in the chat: nothing to do
        marked = self.multi_get("erased", [m.msg_id for m in msgs])
        out = {m.msg_id for m, mark in zip(msgs, marked, strict=True) if mark is not None}
        for msg in msgs:
            if msg.msg_id in out:
                continue
            for ref in (msg.msg_id, msg.ref):
                if ref is not None and self._erased_by_held(msg, ref):
                    out.add(msg.msg_id)
                    break
        return out

    def _erased_by_held(self, msg: MsgV1, ref: bytes) -> bool:
        is_admin = self.admins(msg.chat_id)  # cached per chat
        for _, value in self.iter_prefix("deletes", msg.chat_id + ref):
            d = decode_msg(value, trusted=True)
            if delete_is_valid(d, is_admin) and erases(d, msg):
                return True
        return False

    def _erase(
        self, deletes: list[MsgV1], batch: WriteBatch
    ) -> tuple[list[tuple[bytes, bytes]], list[bytes]]:
        """Add to ``batch`` the erasure of every held message a valid one of ``deletes``
        erases: [(msg id, its messages key)], and the messages keys whose rows (in
        ``messages`` and ``referred``) held what went: ``compact_erased`` rewrites them."""
        erased: dict[bytes, bytes] = {}
        rewrite: list[bytes] = []
        for d in deletes:
            assert d.ref is not None
            if not delete_is_valid(d, self.admins(d.chat_id)):
                continue
            referring = list(self.iter_prefix("refs", d.chat_id + d.ref))
            candidates = [d.ref, *(row[CHAT_ID_LEN + MSG_ID_LEN :] for row, _ in referring)]
            keys = self.multi_get("seen_msg", candidates)
            target = keys[0]  # the held message with the id named, if any
            for msg_id, key in zip(candidates, keys, strict=True):
                if key is None or msg_id in erased:
                    continue
                raw = self.get("messages", key)
                if raw is None:
                    continue
                msg = decode_msg(raw, trusted=True)
                if erases(d, msg):
                    self._erase_one(msg, key, batch)
                    erased[msg_id] = key
            if target is not None:  # its referred rows of what went (all of them if it went)
                referred = self._handle["referred"]
                for _, referrer in referring:
                    if d.ref in erased or referrer in erased.values():
                        batch.delete(target + referrer, referred)  # a row may hold its bytes
                        rewrite.append(target)  # (kept when the delete's claims were false)
        return list(erased.items()), rewrite + list(erased.values())

    def _erase_one(self, msg: MsgV1, key: bytes, batch: WriteBatch) -> None:
        handle = self._handle
        batch.delete(key, handle["messages"])
        batch.delete(msg.msg_id, handle["seen_msg"])
        if msg.ref is not None:
            batch.delete(key_by_ref(msg.chat_id, msg.ref, msg.msg_id), handle["refs"])
        seq = seq_of(key)
        batch.delete(key_hidden(msg.chat_id, seq), handle["hidden"])
        batch.delete(key, handle["event_at"])
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
        by their target's messages key: the same range, to its last row. Returns how many
        messages keys the range had."""
        with self._uncompacted_lock:
            keys, self._uncompacted = sorted(set(self._uncompacted)), []
        if not keys:
            return 0
        self.flush()
        options = CompactOptions()
        options.set_bottommost_level_compaction(BottommostLevelCompaction.force())
        self._cf["messages"].compact_range(keys[0], keys[-1] + b"\x00", options)
        self._cf["referred"].compact_range(keys[0], referred_end(keys[-1]), options)
        return len(keys)

    def _deletes_of(self, chat_id: bytes) -> Iterator[MsgV1]:
        for _, value in self.iter_prefix("deletes", chat_id):
            yield decode_msg(value, trusted=True)

    def deletes_of(self, chat_id: bytes) -> list[MsgV1]:
        """The chat's DELETE messages (valid or not)."""
        return list(self._deletes_of(chat_id))

    def is_erased(self, msg_id: bytes) -> bool:
        return self.get("erased", msg_id) is not None

    # --- sync helpers (the DELETES domain) ---

    def iter_delete_ids(self) -> Iterator[bytes]:
        for delete_id, _ in self.iter_all("seen_delete"):
            yield delete_id

    def get_bucket_delete_ids(self, bucket: int) -> list[bytes]:
        return [i for i, _ in self.iter_prefix("seen_delete", bucket_prefix(bucket))]

    def get_deletes_by_ids(self, ids: list[bytes]) -> list[bytes | None]:
        keys = self.multi_get("seen_delete", ids)
        values = iter(self.multi_get("deletes", [key for key in keys if key]))
        return [next(values) if key else None for key in keys]
