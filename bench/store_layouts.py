"""``chatsync bench store-layouts``: issue 39's folded page against the store's other goals.

A folded page shows content messages (NEW, REPLY) with their edits and reactions folded in;
the raw page is the op log, every kind in (hlc, seq) order. In ``messages`` the two orders
share one copy, so a folded page steps over the other kinds. What each way out costs, side
by side on ``chatsync bench store``'s workload (an edit and a reaction on every 10th message):

  writes   ChatDb's batched ``put_messages`` with and without a second copy of each content
           row (a WriteBatch into a CF of its own: what a content-only scan beside the op log
           needs), and SQLite (RFC-0005) — msgs/s, interleaved per batch;
  fold     ChatDb's raw page, its content scan alone (``range`` with kinds) and its folded
           page — µs per page: the fold is what the view rows of a page's changed messages add;
  layouts  plain rocksdict stores holding ChatDb's ``messages`` rows with its CF options,
           compacted: "one" (today: every kind in one CF) and "apart" (content in one CF, the
           other kinds in another), each read for its op-log page (apart: the content's next
           rows and the others in their span, merged by key) and its content scan, every row
           made a ``StoredMsg`` by the store's own ``_items`` — µs per page.

Every walk of a kind pages the same messages (checked before the figures are kept). The
folded page a layout would give is estimated as its content scan plus ChatDb's fold. Nothing
here asserts a time.
"""

from __future__ import annotations

import gc
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import islice, takewhile
from pathlib import Path
from typing import Any, cast

from rich.console import Console
from rich.progress import Progress
from rocksdict import Cache, Rdict, ReadOptions, WriteBatch

from bench.console import bench_console, bench_progress, save_report
from bench.store_bench import (
    KIND_EVERY,
    ChatDbWriter,
    SqliteWriter,
    Step,
    Writer,
    _walk,
    _write_step,
    interleave,
    walk_chatdb,
    walk_folded,
)
from bench.store_data import Rate
from bench.workload import Workload, about_messages, make_workload
from store import ChatDb, Direction, MessageKind
from store.keys import key_messages, prefix_end
from store.kinds import CONTENT
from store.messages import RangePage, _items
from store.records import KIND_AT, STAMP_AT
from store.rocks import ChatDbConfig, _cf_options

_CONTENT = frozenset(int(kind) for kind in CONTENT)
Row = tuple[bytes, bytes]
Page = Callable[[bytes, bytes], tuple[int, bytes | None]]  # (chat, end) -> (items, next end)


@dataclass(frozen=True)
class LayoutParams:
    messages: int = 200_000
    chats: int = 100
    payload: int = 200
    batch: int = 1000
    page: int = 50
    walked: int = 25  # chats walked whole, three times each per contender
    out: Path = Path("bench-results/store_layouts.json")


class CopyingWriter(ChatDbWriter):
    """``put_messages``, then each content row again into a CF of its own (one WriteBatch;
    the keys ChatDb gives the messages in a fresh store, made before the timed steps)."""

    def __init__(self, path: Path, wl: Workload) -> None:
        super().__init__(path, wl)
        rocks = self.db.rocks
        self.rdict, self.write_opts = rocks._db, rocks._write_opts
        options = _cf_options(rocks.config, Cache(8 << 20), "messages")
        self.rdict.create_column_family("content_copy", options)
        self.cf = self.rdict.get_column_family_handle("content_copy")
        seqs: dict[bytes, int] = {}
        self.keys = []
        for msg in self.msgs:
            seqs[msg.chat_id] = seq = seqs.get(msg.chat_id, 0) + 1
            self.keys.append(key_messages(msg.chat_id, msg.hlc.pack(), seq))

    def put(self, lo: int, hi: int, *, each: bool) -> None:
        super().put(lo, hi, each=each)
        batch = WriteBatch(raw_mode=True)
        for key, msg in zip(self.keys[lo:hi], self.msgs[lo:hi], strict=True):
            if msg.kind in CONTENT:
                batch.put(key, msg.encoded, self.cf)
        self.rdict.write(batch, self.write_opts)

    def copies(self) -> int:
        return sum(1 for _ in self.rdict.get_column_family("content_copy").keys())  # noqa: SIM118


def run_store_layouts(params: LayoutParams, console: Console | None = None) -> dict[str, Any]:
    """Every measurement, printed and saved; returns the JSON document."""
    console = console or bench_console(log_width=120)
    base = Path(tempfile.mkdtemp(prefix="chatsync-layouts-"))
    try:
        with bench_progress(console, label_width=40) as progress:
            wl = make_workload(params.messages, params.chats, params.payload)
            gc.collect()
            gc.freeze()  # the workload lives to the end: keep it out of timed collections
            try:
                report = _measure(params, wl, base, progress)
            finally:
                gc.unfreeze()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    _print(console, params, report)
    save_report(console, report, params.out)
    return report


def _measure(params: LayoutParams, wl: Workload, base: Path, progress: Progress) -> dict[str, Any]:
    chatdb = ChatDbWriter(base / "chatdb", wl)
    copying = CopyingWriter(base / "copy", wl)
    (base / "sqlite").mkdir()
    sqlite = SqliteWriter(base / "sqlite", wl)
    writers: dict[str, Writer] = {
        "chatdb": chatdb,
        "chatdb_content_copy": copying,
        "sqlite": sqlite,
    }
    steps: dict[str, Step[int]] = {
        name: partial(_write_step, writer, params.messages, params.batch, False)
        for name, writer in writers.items()
    }
    starts = range(0, params.messages, params.batch)
    writes = interleave(steps, starts, "msgs", progress, "writes, batched")
    copies = copying.copies()
    copying.close()
    sqlite.close()
    db = chatdb.db
    edits = about_messages(wl, MessageKind.EDIT, KIND_EVERY, lambda m: b"edited " + m.payload)
    reactions = about_messages(wl, MessageKind.REACTION, KIND_EVERY, lambda m: b"\x01+1")
    db.put_messages(edits + reactions)
    chats = wl.chat_ids[: params.walked]
    fold = _fold(db, params.page, chats, progress)
    rows = list(db.rocks.iter_all("messages"))
    config = db.rocks.config
    db.close()
    layouts = _layouts(base, rows, config, params.page, chats, progress)
    items = {name: rate.items for name, rate in {**fold, **layouts}.items()}
    for kind in (
        ["raw", "one_raw", "apart_raw"],
        ["content_scan", "folded", "one_content", "apart_content"],
    ):
        if len({items[name] for name in kind}) != 1:
            raise AssertionError(
                f"the walks page different messages: { {n: items[n] for n in kind} }"
            )
    per_s = {name: rate.per_s for name, rate in writes.items()}
    return {
        "benchmark": "store-layouts",
        "params": {k: str(v) if isinstance(v, Path) else v for k, v in vars(params).items()},
        "content_copies": copies,
        "writes_msgs_per_s": per_s,
        "writes_vs_sqlite": {
            n: per_s[n] / per_s["sqlite"] for n in ("chatdb", "chatdb_content_copy")
        },
        "chatdb_page_us": _us(fold),
        "layout_page_us": _us(layouts),
        "items": items,
    }


def _us(rates: dict[str, Rate]) -> dict[str, float]:
    return {name: 1e6 / rate.per_s for name, rate in rates.items()}


def _fold(db: ChatDb, page: int, chats: list[bytes], progress: Progress) -> dict[str, Rate]:
    """ChatDb's raw page, its content scan alone and its folded page, walked interleaved."""

    def content_scan(
        chat: bytes, cursor: str | None, limit: int, direction: Direction
    ) -> RangePage:
        return db.messages.range(chat, cursor, limit, direction, kinds=CONTENT, replies=[])

    walks: dict[str, Step[bytes]] = {
        "raw": lambda chat: walk_chatdb(db, page, chat),
        "content_scan": lambda chat: _walk(content_scan, page, chat),
        "folded": lambda chat: walk_folded(db, page, chat),
    }
    return _walked(walks, chats, progress, "ChatDb pages")


def _walked(
    walks: dict[str, Step[bytes]], chats: list[bytes], progress: Progress, label: str
) -> dict[str, Rate]:
    """Every walk over every chat three times, interleaved, after one untimed warm-up each."""
    for chat in chats:
        for walk in walks.values():
            walk(chat)
    return interleave(walks, chats * 3, "pages", progress, label)


def _layouts(
    base: Path,
    rows: list[Row],
    config: ChatDbConfig,
    page: int,
    chats: list[bytes],
    progress: Progress,
) -> dict[str, Rate]:
    """ChatDb's ``messages`` rows in the two layouts (compacted, reopened), their pages walked."""
    one = _fill(base / "one", ["messages"], rows, config)
    apart = _fill(base / "apart", ["content", "others"], rows, config)
    try:
        messages = one.get_column_family("messages")
        content, others = apart.get_column_family("content"), apart.get_column_family("others")

        def one_content(chat: bytes, end: bytes) -> tuple[int, bytes | None]:
            return _page((r for r in _rows(messages, chat, end) if _is_content(r[1])), page)

        pages: dict[str, Page] = {
            "one_raw": lambda chat, end: _page(_rows(messages, chat, end), page),
            "one_content": one_content,
            "apart_raw": lambda chat, end: _merged(content, others, chat, end, page),
            "apart_content": lambda chat, end: _page(_rows(content, chat, end), page),
        }
        walks = {name: _walker(pages_of) for name, pages_of in pages.items()}
        return _walked(walks, chats, progress, "layout pages")
    finally:
        for rdict in (one, apart):
            rdict.close()


def _fill(path: Path, cfs: list[str], rows: list[Row], config: ChatDbConfig) -> Rdict:
    """A store of ``rows`` (content into the first CF, the other kinds into the second)."""
    rdict = _open(path, cfs, config)
    handles = [rdict.get_column_family_handle(cf) for cf in cfs]
    for i in range(0, len(rows), 1000):
        batch = WriteBatch(raw_mode=True)
        for key, value in rows[i : i + 1000]:
            batch.put(key, value, handles[0 if len(cfs) == 1 or _is_content(value) else 1])
        rdict.write(batch)
    rdict.flush()
    for cf in cfs:
        rdict.get_column_family(cf).compact_range(None, None)
    del handles
    rdict.close()
    gc.collect()  # (the handles' last references: the store's lock is then free to reopen)
    return _open(path, cfs, config)


def _open(path: Path, cfs: list[str], config: ChatDbConfig) -> Rdict:
    options = _cf_options(config, Cache(config.block_cache_mb << 20), "messages")
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    return Rdict(str(path), options=options, column_families=dict.fromkeys(cfs, options))


def _is_content(value: bytes) -> bool:
    return value[KIND_AT[value[STAMP_AT]]] in _CONTENT  # kind_of, inlined (a call per row)


def _rows(cf: Rdict, chat: bytes, end: bytes) -> Iterator[Row]:
    """A chat's rows below ``end``, newest first (a reverse scan runs into the chat before)."""
    options = ReadOptions()
    options.set_total_order_seek(True)
    options.set_iterate_upper_bound(end)
    rows = cast(Iterator[Row], cf.items(backwards=True, read_opt=options))  # raw mode: bytes
    return takewhile(lambda row: row[0] >= chat, rows)


def _page(rows: Iterator[Row], page: int) -> tuple[int, bytes | None]:
    got = list(islice(rows, page + 1))
    return len(_items(got[:page])), got[page - 1][0] if len(got) > page else None


def _merged(
    content: Rdict, others: Rdict, chat: bytes, end: bytes, page: int
) -> tuple[int, bytes | None]:
    """The op-log page of the apart layout: the content's next rows bound how far back the
    page reaches; the other kinds' rows in that span are merged in by key."""
    got = list(islice(_rows(content, chat, end), page + 1))
    low = got[-1][0] if len(got) > page else chat
    more = list(takewhile(lambda row: row[0] >= low, _rows(others, chat, end)))
    return _page(iter(sorted(got + more, reverse=True) if more else got), page)


def _walker(pages_of: Page) -> Step[bytes]:
    def walk(chat: bytes) -> tuple[int, int]:
        end, pages, items = prefix_end(chat), 0, 0
        assert end is not None  # (only a chat id of all 0xff bytes has no end)
        while True:
            n, last = pages_of(chat, end)
            pages, items = pages + 1, items + n
            if last is None:
                return pages, items
            end = last

    return walk


def _print(console: Console, params: LayoutParams, report: dict[str, Any]) -> None:
    w, vs = report["writes_msgs_per_s"], report["writes_vs_sqlite"]
    f, p = report["chatdb_page_us"], report["layout_page_us"]
    fold = f["folded"] - f["content_scan"]
    console.print(
        f"chatsync bench store-layouts — {params.messages:,} msgs, {params.chats} chats,"
        f" an edit and a reaction on every {KIND_EVERY}th"
    )
    console.print(
        f"writes, batches of {params.batch}, msgs/s: ChatDb {w['chatdb']:,.0f}"
        f" ({vs['chatdb']:.2f}x SQLite); with a copy of each content row"
        f" {w['chatdb_content_copy']:,.0f} ({vs['chatdb_content_copy']:.2f}x);"
        f" SQLite {w['sqlite']:,.0f} (goal: >= 3x)"
    )
    console.print(
        f"ChatDb, us a page: raw {f['raw']:.1f}, content scan {f['content_scan']:.1f},"
        f" folded {f['folded']:.1f} — the fold {fold:.1f}; folded / raw"
        f" {f['raw'] / f['folded']:.2f} (goal: >= 0.8)"
    )
    console.print(
        f"layouts, us a page: one CF: op log {p['one_raw']:.1f}, content {p['one_content']:.1f};"
        f" content apart: op log (merged) {p['apart_raw']:.1f}"
        f" ({p['apart_raw'] / p['one_raw']:.2f}x one CF's: the history page's cost),"
        f" content {p['apart_content']:.1f}"
    )
    estimates = (
        ("one CF (today)", "one_raw", "one_content"),
        ("content apart", "apart_raw", "apart_content"),
        ("content copied (the op log as today)", "one_raw", "apart_content"),
    )
    for name, raw, content in estimates:
        estimate = p[raw] / (p[content] + fold)
        console.print(
            f"  {name}: folded page (content scan + the fold) / op-log page {estimate:.2f}"
        )
