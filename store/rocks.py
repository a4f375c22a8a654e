"""Opening RocksDB with seed 002's column families and options; the shared read/write plumbing.

Every CF is compressed (``ChatDbConfig.compression``: seed 002's Zstd, or LZ4, which a node
uses: half the compaction CPU) with a 10 bits/key bloom filter. The CFs that are
scanned by prefix get a fixed-prefix extractor and a memtable prefix bloom
(ratio 0.1); the seen_* sync indexes keep whole-key filtering on so their
point lookups (dedup) still use the bloom filter. Full scans set
``total_order_seek`` because a prefix extractor otherwise lets an iterator
stop at a prefix boundary.

``Rocks`` is one object, given to every row store when ``store.chatdb`` builds them: the
stores share the database and its plumbing, not each other's state. It keeps none of theirs
(caches and locks live in the store that owns them), so a store's state is found in its
own module.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from rocksdict import (
    BlockBasedOptions,
    Cache,
    DBCompressionType,
    Options,
    Rdict,
    ReadOptions,
    SliceTransform,
    WriteBatch,
    WriteOptions,
)

from store.errors import StoreLocked
from store.hlc import DEFAULT_MAX_OFFSET_MS
from store.keys import BUCKET_PREFIX_LEN, CHAT_ID_LEN, USER_ID_LEN, prefix_end
from store.records import DEFAULT_MAX_PAYLOAD

DEFAULT_PATH = "./chatdb-data"

# CF name -> fixed prefix length (None: point lookups only, no prefix extractor).
COLUMN_FAMILIES: dict[str, int | None] = {
    "messages": CHAT_ID_LEN,
    "seen_msg": BUCKET_PREFIX_LEN,
    "chats_meta": None,
    "user_inbox": USER_ID_LEN,
    "members": CHAT_ID_LEN,
    "identity": None,
    "seen_member": BUCKET_PREFIX_LEN,
    "seen_identity": BUCKET_PREFIX_LEN,
    "member_ops": CHAT_ID_LEN,
    "hidden": CHAT_ID_LEN,
    "waiting": None,
    "deletes": CHAT_ID_LEN,
    "seen_delete": BUCKET_PREFIX_LEN,
    "member_index": BUCKET_PREFIX_LEN,  # op id -> user | op: the INDEX domain (member_index)
    # One relation, three ways in: ``refs`` [chat|ref|id] -> key finds what refers to an id
    # (erasure, and a target that arrives late); ``ref_targets`` [id] says that something
    # does; ``referred`` [target key|referrer key] is the same in page order (views).
    "refs": CHAT_ID_LEN,
    "ref_targets": None,  # message id -> b"": some held message refers to it (a page's check)
    "erased": None,
    "referred": CHAT_ID_LEN,  # target key | referrer key: a held edit or reaction (views)
    "views": CHAT_ID_LEN,  # a changed message's key -> what a page shows of it (view_rows)
    "receipts": CHAT_ID_LEN + USER_ID_LEN,  # a chat's receipts by reader (store.reads)
    "events": None,  # position -> kind | a record's key: this node's event log (store.events)
    "event_at": CHAT_ID_LEN,  # a shown message's key -> its event position (store.events)
    "delivered": USER_ID_LEN,  # user | device -> the position its stream acknowledged (feed)
    "unread": CHAT_ID_LEN,  # chat | reader -> position and unread count (store.unread)
}
# CFs of earlier versions: dropped when a database that has them is opened.
RETIRED_COLUMN_FAMILIES = ("user_read_progress",)  # local read seqs, before receipts
SYNC_INDEXES = {"seen_msg", "seen_member", "seen_identity", "seen_delete", "member_index"}
# RocksDB's status text when the LOCK file is held (env/io_posix: another process; its own
# table of files this process locked): rocksdict raises both as a bare ``Exception``
LOCK_HELD = ("While lock file", "lock hold by current process")


@dataclass(frozen=True)
class ChatDbConfig:
    """Seed 002's RocksDB configuration plus the store's input limits."""

    path: str = DEFAULT_PATH
    parallelism: int = field(default_factory=lambda: os.cpu_count() or 2)
    block_cache_mb: int = 512
    memtable_mb: int = 512  # all memtables together
    # one CF's memtable: its prefix bloom (0.1 of it) is allocated up front, so RocksDB's 64 MB
    # default cost ~100 MB of RSS at open over the 16 CFs with a prefix extractor
    cf_memtable_mb: int = 8
    bloom_bits_per_key: int = 10
    memtable_prefix_bloom_ratio: float = 0.1
    log_files_kept: int = 5
    max_wal_mb: int = 64  # flush memtables once the WAL holds this much: bounds recovery and disk
    write_sync: bool = False  # the WAL still gives crash safety; True = durable acks
    max_payload: int = DEFAULT_MAX_PAYLOAD
    max_offset_ms: int = DEFAULT_MAX_OFFSET_MS
    meta_cache_size: int = 65_536
    # one of COMPRESSION; a database written with another opens fine (blocks name their own)
    compression: str = "zstd"

    def __post_init__(self) -> None:
        check_compression(self.compression)


# Block compression of every CF. Applying 1,000,000 messages to an empty store, RocksDB's
# flushes and compactions cost 16.0 us of CPU per message with Zstd, 7.9 with LZ4 (files 6 %
# larger), 4.9 with none (2.1x larger).
COMPRESSION = {
    "zstd": DBCompressionType.zstd,
    "lz4": DBCompressionType.lz4,
    "none": DBCompressionType.none,
}


def check_compression(name: str, setting: str = "compression") -> None:
    """ValueError unless ``name`` is one of COMPRESSION (``setting``: what the error calls it)."""
    if name not in COMPRESSION:
        raise ValueError(f"{setting} {name!r}: one of {', '.join(sorted(COMPRESSION))}")


def _cf_options(config: ChatDbConfig, cache: Cache, name: str) -> Options:
    opts = Options(raw_mode=True)
    opts.set_compression_type(COMPRESSION[config.compression]())
    opts.set_write_buffer_size(config.cf_memtable_mb * 1024 * 1024)
    table = BlockBasedOptions()
    table.set_bloom_filter(config.bloom_bits_per_key, False)
    table.set_block_cache(cache)
    opts.set_block_based_table_factory(table)
    prefix = COLUMN_FAMILIES.get(name)
    if prefix is not None:
        opts.set_prefix_extractor(SliceTransform.create_fixed_prefix(prefix))
        opts.set_memtable_prefix_bloom_ratio(config.memtable_prefix_bloom_ratio)
        opts.set_memtable_whole_key_filtering(name in SYNC_INDEXES)
    return opts


def _db_options(config: ChatDbConfig, cache: Cache) -> Options:
    opts = _cf_options(config, cache, "default")
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.increase_parallelism(config.parallelism)
    opts.set_db_write_buffer_size(config.memtable_mb * 1024 * 1024)
    opts.set_keep_log_file_num(config.log_files_kept)
    opts.set_max_total_wal_size(config.max_wal_mb * 1024 * 1024)
    return opts


def _existing_column_families(path: str) -> list[str] | None:
    """The CFs of the database at ``path`` (None: there is none yet)."""
    if not (Path(path) / "CURRENT").exists():
        return None
    return list(Rdict.list_cf(path))


class Rocks:
    """Owns the Rdict, its CF views (``cf``) and handles (``handle``), and the plumbing every
    row store shares: batches, writes, gets, multi-gets and scans. Row stores are given it
    (``store.chatdb`` builds them); none inherits from it, and none keeps state here.

    Not thread-safe for writes: one writer task owns a ChatDb (ARCHITECTURE.md).
    """

    def __init__(self, config: ChatDbConfig | None = None, *, path: str | Path | None = None):
        if config is None:
            config = ChatDbConfig()
        if path is not None:
            config = ChatDbConfig(**{**config.__dict__, "path": str(path)})
        self.config = config
        Path(config.path).mkdir(parents=True, exist_ok=True)
        cache = Cache(config.block_cache_mb * 1024 * 1024)
        existing = _existing_column_families(config.path)
        retired = [name for name in existing or () if name in RETIRED_COLUMN_FAMILIES]
        # CFs a database of an earlier version lacks: created empty now, filled by ChatDb
        self.created_families = frozenset(() if existing is None else COLUMN_FAMILIES) - set(
            existing or ()
        )
        try:
            self._db = Rdict(
                config.path,
                _db_options(config, cache),
                column_families={
                    name: _cf_options(config, cache, name) for name in [*COLUMN_FAMILIES, *retired]
                },
            )
        except Exception as exc:  # rocksdict raises Exception itself: RocksDB's status text
            if any(text in str(exc) for text in LOCK_HELD):
                raise StoreLocked(f"{config.path}: {exc}") from exc
            raise
        for name in retired:  # RocksDB opens a database only with all its CFs: open, then drop
            self._db.drop_column_family(name)
        self.cf = {name: self._db.get_column_family(name) for name in COLUMN_FAMILIES}
        self.handle = {name: self._db.get_column_family_handle(name) for name in COLUMN_FAMILIES}
        self._shared: WriteBatch | None = None  # EventLog.one_write's batch, while it runs
        self._write_opts = WriteOptions()
        self._write_opts.sync = config.write_sync
        self.closed = False

    # --- lifecycle ---

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for view in self.cf.values():
            view.close()
        self.cf.clear()
        self.handle.clear()
        self._db.close()

    def memory_usage(self) -> dict[str, int]:
        """Bytes RocksDB holds in memory: memtables (all CFs), block cache, table readers
        (index and filter blocks outside the cache)."""

        def total(prop: str) -> int:
            return sum(view.property_int_value(prop) or 0 for view in self.cf.values())

        return {
            "memtables": total("rocksdb.cur-size-all-mem-tables"),
            "block_cache": self._db.property_int_value("rocksdb.block-cache-usage") or 0,
            "table_readers": total("rocksdb.estimate-table-readers-mem"),
        }

    def flush(self) -> None:
        for view in self.cf.values():
            view.flush()

    def compact(self) -> None:
        """Compact every CF: range tombstones are only reclaimed on disk by compaction."""
        for view in self.cf.values():
            view.compact_range(None, None)

    # --- plumbing shared by the row stores ---

    def new_batch(self) -> WriteBatch:
        """A new batch — or, inside ``EventLog.one_write``, the one batch every store adds to."""
        shared = self._shared
        return shared if shared is not None else WriteBatch(raw_mode=True)

    def write(self, batch: WriteBatch) -> None:
        """Write ``batch`` as it is (``store.events.EventLog.write`` logs events with it); the
        shared batch of ``EventLog.one_write`` is written once, at the end of the block."""
        if batch is self._shared:
            return
        self._db.write(batch, self._write_opts)

    def share_batch(self) -> WriteBatch:
        if self._shared is not None:
            raise RuntimeError("one_write blocks do not nest")
        self._shared = WriteBatch(raw_mode=True)
        return self._shared

    def unshare_batch(self) -> None:
        self._shared = None

    def is_shared(self, batch: WriteBatch) -> bool:
        return batch is self._shared

    def iter_prefix(
        self, cf: str, prefix: bytes, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) of every key starting with ``prefix``, in key order (or reversed)."""
        return self.iter_range(cf, prefix, prefix_end(prefix), reverse=reverse)

    def range_keys(self, cf: str, start: bytes, end: bytes | None) -> list[bytes]:
        """The keys ``start <= key < end`` (end None: to the last key), in key order: one call
        into rocksdict a key (``keys``), where ``iter_range`` makes four (valid, key, value,
        next) — a sync region's ids read in half the time (~0.17 against ~0.35 us an id)."""
        opts = ReadOptions()
        opts.set_total_order_seek(True)
        if end is not None:
            opts.set_iterate_upper_bound(end)
        keys = self.cf[cf].keys(from_key=start, read_opt=opts)
        return list(cast(Iterator[bytes], keys))  # raw mode: bytes

    def ranges_keys(self, cf: str, bounds: Sequence[tuple[bytes, bytes | None]]) -> list[bytes]:
        """Per range ``(start, end)`` of ``bounds`` (ascending, disjoint; end None: to the last
        key) its keys concatenated, in key order: one iterator moving forward, a seek a range.
        A sync region's changed buckets are ~1,000 ranges of ~16 keys: a ``range_keys`` each
        (options, iterator, seek) cost ~11 us a range in a session, the seek alone ~2."""
        opts = ReadOptions()
        opts.set_total_order_seek(True)
        if bounds and bounds[-1][1] is not None:
            opts.set_iterate_upper_bound(bounds[-1][1])
        it = self.cf[cf].iter(opts)
        seek, key, step = it.seek, it.key, it.next  # key(): None once past the last
        out: list[bytes] = []
        for start, end in bounds:
            seek(start)
            got: list[bytes] = []
            k = key()
            while k is not None and (end is None or k < end):
                got.append(k)
                step()
                k = key()
            out.append(b"".join(got))
        return out

    def iter_all(self, cf: str) -> Iterator[tuple[bytes, bytes]]:
        return self.iter_range(cf, b"", None)

    def iter_range(
        self, cf: str, start: bytes, end: bytes | None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) for start <= key < end (end None: to the last key).

        The lower bound is enforced here, not by ReadOptions: rocksdict 0.3.x's
        ``set_iterate_lower_bound`` stores the *upper* bound (options.rs), so it
        would drop ``end`` and let a reverse scan run into the previous prefix.
        """
        opts = ReadOptions()
        opts.set_total_order_seek(True)
        if end is not None:
            opts.set_iterate_upper_bound(end)
        it = self.cf[cf].iter(opts)
        if not reverse:
            it.seek(start)
            while it.valid():
                yield it.key(), it.value()
                it.next()
            return
        it.seek_to_last()
        while it.valid():
            key = it.key()
            if key < start:
                return
            yield key, it.value()
            it.prev()

    def items(
        self, cf: str, start: bytes, end: bytes | None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        """``iter_range``'s rows from rocksdict's own iterator (one call per row, not four),
        bounded above by ``end``; reversed, it runs from the last key below ``end`` and does
        *not* stop at ``start``: the caller stops at the first key below it.

        A generator, so that ``end`` lives as long as the iteration: rocksdict 0.3.x's
        ``set_iterate_upper_bound`` keeps no reference to the bound's bytes, and an iterator
        that outlives them runs to a bound that is no longer there (seen: a forward scan of a
        chat stopping after 10 of its 194 rows; ``iter_values`` has the same rule).
        """
        opts = ReadOptions()
        opts.set_total_order_seek(True)
        if end is not None:
            opts.set_iterate_upper_bound(end)
        rows = self.cf[cf].items(
            backwards=reverse, from_key=None if reverse else start, read_opt=opts
        )
        yield from cast(Iterator[tuple[bytes, bytes]], rows)  # raw mode: bytes
        del end  # (held to here)

    def items_in(
        self, cf: str, start: bytes, end: bytes | None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        """``items`` as rocksdict's own iterator, no generator between (a history page: a
        Python frame resumed per row was a sixth of it). The caller keeps ``end`` alive
        while it iterates (see ``items``)."""
        opts = ReadOptions()
        opts.set_total_order_seek(True)
        if end is not None:
            opts.set_iterate_upper_bound(end)
        rows = self.cf[cf].items(
            backwards=reverse, from_key=None if reverse else start, read_opt=opts
        )
        return cast(Iterator[tuple[bytes, bytes]], rows)  # raw mode: bytes

    def iter_values(self, cf: str, start: bytes, end: bytes | None) -> Iterator[bytes]:
        """The values of start <= key < end in key order: ``iter_range`` without the keys,
        one call per row into rocksdict instead of four (the unread scan). The caller keeps
        ``end`` alive while it iterates (see ``items``)."""
        opts = ReadOptions()
        opts.set_total_order_seek(True)
        if end is not None:
            opts.set_iterate_upper_bound(end)
        values: Iterator[bytes] = self.cf[cf].values(from_key=start, read_opt=opts)
        return values

    def multi_get(self, cf: str, keys: list[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        if len(keys) == 1:  # a point get costs a third of a multi_get of one
            return [self.cf[cf].get(keys[0])]
        values = self.cf[cf].get(cast(Any, keys))  # one multi_get call for the whole list
        return cast(list[bytes | None], values)

    def get(self, cf: str, key: bytes) -> bytes | None:
        value: bytes | None = self.cf[cf].get(key)
        return value
