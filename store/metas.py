"""Each chat's ChatMeta (``chats_meta``), cached: the single writer is the only one who changes it.

A row store that changes a chat's meta puts it in its own WriteBatch (``put``) and, once that
batch is written, tells the cache (``remember``, never before: a failed write must not leak).
Most reads of a meta — the newest message of a chat list entry, the last seq a put continues
from — then cost no RocksDB read.
"""

from __future__ import annotations

from collections.abc import Iterator

from rocksdict import WriteBatch

from store.records import ChatMeta, decode_chat_meta
from store.rocks import Rocks


class Metas:
    def __init__(self, rocks: Rocks) -> None:
        self._rocks = rocks
        self._get = rocks.get
        self._handle = rocks.handle
        self._cache: dict[bytes, ChatMeta] = {}
        self._cache_size = rocks.config.meta_cache_size

    def load(self, chat_id: bytes) -> ChatMeta:
        """The chat's meta (an empty one for a chat not stored yet)."""
        meta = self._cache.get(chat_id)
        if meta is None:
            raw = self._get("chats_meta", chat_id)
            meta = decode_chat_meta(raw) if raw is not None else ChatMeta()
        return meta

    def forget(self) -> None:
        """Drop the cache (a write that carried its changes failed): reads go to disk again."""
        self._cache.clear()

    def remember(self, metas: dict[bytes, ChatMeta]) -> None:
        """Cache ``metas`` after their batch was written (never before: a failed write must not leak)."""
        if len(self._cache) + len(metas) > self._cache_size:
            self._cache.clear()
        self._cache.update(metas)

    def remember_one(self, chat_id: bytes, meta: ChatMeta) -> None:
        """``remember({chat_id: meta})`` without building the dict (put_message)."""
        cache = self._cache
        if len(cache) >= self._cache_size:
            cache.clear()
        cache[chat_id] = meta

    def put(self, batch: WriteBatch, metas: dict[bytes, ChatMeta]) -> None:
        for chat_id, meta in metas.items():
            batch.put(chat_id, meta.encode(), self._handle["chats_meta"])

    def get(self, chat_id: bytes) -> ChatMeta | None:
        """The chat's stored meta, read from RocksDB (None: no such chat)."""
        raw = self._get("chats_meta", chat_id)
        return None if raw is None else decode_chat_meta(raw)

    def chat_ids(self) -> Iterator[bytes]:
        """Every stored chat's id, in key order."""
        for chat_id, _ in self._rocks.iter_all("chats_meta"):
            yield chat_id
