"""``chatsync bench store``: ChatDb beside raw rocksdict and SQLite (RFC-0005), in one run.

Writes (msgs/s; every store in a fresh directory; opening and closing are not timed):
  ChatDb   ``put_messages`` per batch of B, and ``put_message`` one at a time;
  raw      the same writes as bare rocksdict WriteBatches on ChatDb's own Rdict,
           column families and WriteOptions: messages[key] = MsgV1 bytes and
           seen_msg[id] = key | event position per message, chats_meta[chat] =
           ChatMeta bytes once per chat per WriteBatch, and the WriteBatch's one
           events row (the same bytes: exactly what put_messages and put_message
           write) — the machine's limit for these writes. Batched, also with the
           chats_meta put repeated for every message (3 puts per message);
           ``raw_no_log``: without the events row and the positions (seen_msg[id] =
           key: the entries ChatDb wrote before its event log, this baseline before);
  SQLite   RFC-0005's schema with all its indexes; one transaction per batch / per message.
Reads (on the batched runs' ChatDb and SQLite databases, reopened):
  range    whole chats walked backward in pages of 50 with cursors (pages/s), against
           RFC-0005's backward pagination query and a variant ordered by server_timestamp;
  list     ``list_user_chats`` against an SQLite query over group_members + read_progress.
Before the reads are timed both stores must give the same unread counts, and every
range reader must page the same messages, so both sides answer the same question.

The contenders run interleaved, not one after the other: a batch (or 100 single
writes, a chat walk, a chat-list call) for each in turn, the order rotating, each
step timed on its own. On a shared, noisy machine every contender then meets the
same disturbances, and the ratios hold even when the absolute figures wobble.
Nothing here asserts a time.
"""

from __future__ import annotations

import gc
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Sequence
from contextlib import closing
from functools import partial
from pathlib import Path
from time import perf_counter
from typing import Any, Protocol, TypeVar

from rich.console import Console
from rich.progress import Progress
from rocksdict import WriteBatch

from bench import sqlite_rfc5 as sql
from bench.console import bench_console, bench_progress, save_report, tracked
from bench.machine import loadavg
from bench.store_data import Rate, Rates, StoreBenchParams
from bench.store_report import build_report, machine_info, print_report
from bench.workload import Workload, about, about_messages, keys_by_user, make_workload
from store import ChatDb, ChatKind, Direction, InboxEntry, MessageKind, MsgV1
from store.events import POSITION_LEN, SEGMENT, EventKind
from store.hlc import VIRTUAL_EPOCH_MS
from store.keys import MESSAGES_KEY_LEN
from store.kinds import Claims
from store.plan import ADMIT_ALL
from sync.replica import DbReplica

T = TypeVar("T")
_SHOWN_HEAD = bytes((EventKind.MESSAGE, MESSAGES_KEY_LEN))  # a shown message's event head
SQLITE_FILE = "messages.sqlite"
SINGLE_STEP = 100  # one-at-a-time writes per turn: the order rotates often enough to even out
Step = Callable[[T], tuple[int, int]]  # one timed step on one item -> (counted units, items)


# --- entry point ---------------------------------------------------------------------------


def run_store_bench(params: StoreBenchParams, console: Console | None = None) -> dict[str, Any]:
    """Run every measurement, print the table, save and return the JSON document."""
    console = console or bench_console(log_width=120)
    base = params.data or Path(tempfile.mkdtemp(prefix="chatsync-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    load_before = loadavg()
    try:
        with bench_progress(console, label_width=48) as progress:
            workload = _make_workload(params, progress)
            gc.collect()
            gc.freeze()  # the workload lives to the end: keep it out of timed collections
            try:
                rates = _measure_writes(params, workload, base, progress)
                plans = _measure_reads(params, workload, base, rates, progress)
            finally:
                gc.unfreeze()
    finally:
        if params.data is None:
            shutil.rmtree(base, ignore_errors=True)
    report = build_report(params, rates, plans, machine_info(load_before), __doc__ or "")
    print_report(console, params, report)
    save_report(console, report, params.out)
    return report


def _make_workload(params: StoreBenchParams, progress: Progress) -> Workload:
    task = progress.add_task("signing messages (not timed)", total=params.messages)
    workload = make_workload(
        params.messages,
        params.chats,
        params.payload,
        advance=lambda n: progress.advance(task, n),
    )
    progress.remove_task(task)
    return workload


def interleave(
    steps: dict[str, Step[T]], items: Sequence[T], unit: str, progress: Progress, label: str
) -> dict[str, Rate]:
    """Every step on every item, the contenders' order rotating per item; time per contender."""
    names = list(steps)
    spent = dict.fromkeys(names, 0.0)
    counts = dict.fromkeys(names, 0)
    got = dict.fromkeys(names, 0)
    for i, item in enumerate(tracked(progress, label, items)):
        turn = i % len(names)
        for name in names[turn:] + names[:turn]:
            start = perf_counter()
            count, n_items = steps[name](item)
            spent[name] += perf_counter() - start
            counts[name] += count
            got[name] += n_items
    return {name: Rate(counts[name], spent[name], unit, got[name]) for name in names}


# --- writes --------------------------------------------------------------------------------


class Writer(Protocol):
    def put(self, lo: int, hi: int, *, each: bool) -> None:
        """Store workload messages lo..hi-1: as one batch, or one at a time (``each``)."""

    def close(self) -> None: ...


class ChatDbWriter:
    """ChatDb.put_messages for a batch, put_message for each message."""

    def __init__(self, path: Path, wl: Workload) -> None:
        self.db, self.msgs = ChatDb(path=path), wl.msgs

    def put(self, lo: int, hi: int, *, each: bool) -> None:
        if not each:
            self.db.put_messages(self.msgs[lo:hi])
            return
        for msg in self.msgs[lo:hi]:
            self.db.put_message(msg)

    def close(self) -> None:
        self.db.close()


class RawWriter:
    """put_messages' writes as bare WriteBatches on a ChatDb's Rdict, CF handles and options.

    The bytes are made before the timed steps: a message's seen_msg value holds the event
    position ChatDb gives it in a fresh store (the n-th message written: n), its events
    part the head and key ``store.events`` logs, joined into the WriteBatch's one events row.
    ``meta_each``: put chats_meta for every message, not once per chat per WriteBatch.
    ``log``: False writes no events row and seen_msg[id] = key (the entries before the log).
    """

    def __init__(
        self, path: Path, wl: Workload, *, meta_each: bool = False, log: bool = True
    ) -> None:
        self.db = ChatDb(path=path)
        rocks = self.db.rocks
        self.rdict, self.opts = rocks._db, rocks._write_opts
        handle = rocks.handle
        self.cfs = (handle["messages"], handle["seen_msg"], handle["chats_meta"], handle["events"])
        self.rows, self.metas, self.meta_each, self.log = wl.raw_rows, wl.meta_bytes, meta_each, log
        self.seen = [
            key + seen_position(n) if log else key for n, (key, *_) in enumerate(self.rows, 1)
        ]
        self.parts = [_SHOWN_HEAD + key for key, *_ in self.rows] if log else []

    def put(self, lo: int, hi: int, *, each: bool) -> None:
        if not each:
            self.rdict.write(self._batch(lo, hi), self.opts)
            return
        for n in range(lo, hi):
            self.rdict.write(self._batch(n, n + 1), self.opts)

    def _batch(self, lo: int, hi: int) -> WriteBatch:
        messages_cf, seen_cf, meta_cf, events_cf = self.cfs
        batch = WriteBatch(raw_mode=True)
        chats = set()
        for (key, value, msg_id, chat), seen in zip(
            self.rows[lo:hi], self.seen[lo:hi], strict=True
        ):
            batch.put(key, value, messages_cf)
            batch.put(msg_id, seen, seen_cf)
            if self.meta_each:
                batch.put(chat, self.metas[chat], meta_cf)
            else:
                chats.add(chat)
        for chat in chats:
            batch.put(chat, self.metas[chat], meta_cf)
        if self.log:  # the WriteBatch's events row: its first position -> its events
            batch.put(seen_position(lo + 1), SEGMENT + b"".join(self.parts[lo:hi]), events_cf)
        return batch

    def close(self) -> None:
        self.db.close()


def seen_position(position: int) -> bytes:
    """An event position as ``store.events`` writes it (8 bytes, big-endian)."""
    return position.to_bytes(POSITION_LEN, "big")


class SqliteWriter:
    """RFC-0005 inserts: one transaction for a batch, or one per message."""

    def __init__(self, path: Path, wl: Workload) -> None:
        self.conn, self.rows = sql.connect(path / SQLITE_FILE), wl.sql_rows
        sql.create_schema(self.conn)

    def put(self, lo: int, hi: int, *, each: bool) -> None:
        if not each:
            sql.insert_batch(self.conn, self.rows[lo:hi])
            return
        for row in self.rows[lo:hi]:
            sql.insert_one(self.conn, row)

    def close(self) -> None:
        self.conn.close()


class NodePathWriter:
    """The node's write path, ``DbReplica.apply_ops``: messages, Merkle tree, chat lists.

    The chats' member ops are applied first (not timed), so both contenders keep the same
    members' chat lists. ``check``: under the message rule (store/access.py); otherwise
    ``admit_all`` — the same path without the check, as before it.
    """

    def __init__(self, path: Path, wl: Workload, *, check: bool) -> None:
        self.db, self.msgs = ChatDb(path=path), wl.msgs
        self.replica = DbReplica(self.db, admit_all=not check)
        self.replica.apply_ops(wl.member_ops)

    def put(self, lo: int, hi: int, *, each: bool) -> None:
        if not each:
            self.replica.apply_ops(self.msgs[lo:hi])
            return
        for msg in self.msgs[lo:hi]:
            self.replica.apply_ops([msg])

    def close(self) -> None:
        self.db.close()


WRITERS: dict[str, Callable[[Path, Workload], Writer]] = {
    "node_open": partial(NodePathWriter, check=False),
    "node_checked": partial(NodePathWriter, check=True),
    "chatdb": ChatDbWriter,
    "raw": RawWriter,
    "raw_no_log": partial(RawWriter, log=False),
    "raw_3_per_msg": partial(RawWriter, meta_each=True),
    "sqlite": SqliteWriter,
}


def _measure_writes(
    params: StoreBenchParams, wl: Workload, base: Path, progress: Progress
) -> Rates:
    """Batched then one-at-a-time writes, every writer in its own fresh directory."""
    single = min(params.single, params.messages)
    node_path = ["node_open", "node_checked"]
    runs = (
        ("write_batched", params.messages, False, [w for w in WRITERS if w not in node_path]),
        ("write_single", single, True, ["chatdb", "raw", "raw_no_log", "sqlite"]),  # raw_3 = raw
        ("node_batched", params.messages, False, node_path),
        ("node_single", single, True, node_path),
    )
    rates: Rates = {}
    for op, n, each, names in runs:
        writers = {name: WRITERS[name](_fresh(base / f"{op}-{name}"), wl) for name in names}
        try:
            step = min(params.batch, SINGLE_STEP) if each else params.batch
            steps: dict[str, Step[int]] = {
                name: partial(_write_step, writer, n, step, each)
                for name, writer in writers.items()
            }
            starts = range(0, n, step)
            label = f"{op}: {', '.join(names)}"
            rates[op] = interleave(steps, starts, "msgs", progress, label)
        finally:
            for writer in writers.values():
                writer.close()
        if each or op == "node_batched":  # the reads use write_batched's ChatDb and SQLite
            for name in names:
                shutil.rmtree(base / f"{op}-{name}", ignore_errors=True)
    return rates


def _write_step(writer: Writer, n: int, batch: int, each: bool, lo: int) -> tuple[int, int]:
    hi = min(lo + batch, n)
    writer.put(lo, hi, each=each)
    return hi - lo, 0


# --- reads ---------------------------------------------------------------------------------


def _measure_reads(
    params: StoreBenchParams, wl: Workload, base: Path, rates: Rates, progress: Progress
) -> dict[str, list[str]]:
    """Range walks and chat lists on the batched databases; returns SQLite's query plans."""
    page, users = params.page, wl.users
    with (
        ChatDb(path=base / "write_batched-chatdb") as db,
        closing(sql.connect(base / "write_batched-sqlite" / SQLITE_FILE)) as conn,
    ):
        walks: dict[str, Step[bytes]] = {
            "chatdb": partial(walk_chatdb, db, page),
            "sqlite": partial(walk_sqlite, conn, page, sql.PAGE_RFC),
            "sqlite_by_timestamp": partial(walk_sqlite, conn, page, sql.PAGE_BY_TIMESTAMP),
        }
        chats = wl.chat_ids[: params.range_chats]
        # The ChatDb walks read one database: untimed, warm every chat's blocks for both, or
        # the second to walk a chat would find them cached by the first.
        for chat in chats:
            walk_chatdb(db, page, chat)
        rates["range"] = interleave(walks, chats, "pages", progress, "range walks (chats)")
        # the hidden-index check on its own: two contenders, so each goes first on every other
        # chat (among four, one would follow the other three times in four, in warm caches)
        pair: dict[str, Step[bytes]] = {
            "checked": partial(walk_chatdb, db, page),
            "unchecked": partial(walk_chatdb_unfiltered, db, page),
        }
        rates["range_check"] = interleave(pair, chats, "pages", progress, "range walks, check")
        paged = {rate.items for op in ("range", "range_check") for rate in rates[op].values()}
        _check_same(len(paged), 1, f"messages paged per reader {sorted(paged)}")
        # after the walks: the receipts are messages of the chats, which SQLite has not
        setup_chat_lists(db, wl)
        setup_sqlite_lists(conn, wl)
        for user in users:
            _check_same(_chatdb_unread(db, user, page), _sqlite_unread(conn, user, page), "unread")
        lists: dict[str, Step[bytes]] = {
            "chatdb": partial(list_chatdb, db, page),
            "sqlite": partial(list_sqlite, conn, page),
        }
        calls = [users[i % len(users)] for i in range(params.list_calls)]
        rates["list_user_chats"] = interleave(lists, calls, "calls", progress, "chat lists")
        _measure_kinds(params, wl, db, chats, rates, progress)
        return _plans(conn, wl, page)


KIND_EVERY = 10  # every 10th message gets an edit and a reaction
DELETES = 1_000  # deletes measured in batches (at most a tenth of the messages), and a tenth
# as many one at a time; each turn's erasures are compacted once (as the node does each second)
DELETE_BATCH = 100


def _measure_kinds(
    params: StoreBenchParams,
    wl: Workload,
    db: ChatDb,
    chats: list[bytes],
    rates: Rates,
    progress: Progress,
) -> None:
    """MESSAGES.md's costs on the batched ChatDb: the folded history page beside the raw one
    (edits and reactions added first, not timed), then deletes/s with the erase."""
    edits = about_messages(wl, MessageKind.EDIT, KIND_EVERY, lambda m: b"edited " + m.payload)
    reactions = about_messages(wl, MessageKind.REACTION, KIND_EVERY, lambda m: b"\x01+1")
    db.put_messages(edits + reactions)
    walks: dict[str, Step[bytes]] = {
        "raw": partial(walk_chatdb, db, params.page),
        "folded": partial(walk_folded, db, params.page),
    }
    for chat in chats:  # warm both (see _measure_reads)
        walk_folded(db, params.page, chat)
    rates["folded_range"] = interleave(walks, chats, "pages", progress, "folded history walks")
    claims = about_messages(wl, MessageKind.DELETE, 1, lambda m: Claims.of(m).encode())
    # targets without edits or reactions of their own: every delete erases one message
    deletes = min(DELETES, len(wl.msgs) // 10)
    targets = [d for n, d in enumerate(claims) if n % KIND_EVERY][: deletes + deletes // 10]
    batched, single = targets[:deletes], targets[deletes:]
    step = DELETE_BATCH // 10  # single deletes per turn, so both end together
    parts = [
        (batched[i : i + DELETE_BATCH], single[n * step : (n + 1) * step])
        for n, i in enumerate(range(0, len(batched), DELETE_BATCH))
    ]
    steps: dict[str, Step[tuple[list[MsgV1], list[MsgV1]]]] = {
        "batched": lambda part: _erase_all(db, part[0], DELETE_BATCH),
        "single": lambda part: _erase_all(db, part[1], 1),
    }
    rates["deletes"] = interleave(steps, parts, "deletes", progress, "deletes with the erase")
    for rate in rates["deletes"].values():
        _check_same(rate.items, rate.count, "messages erased per delete")


def _erase_all(db: ChatDb, deletes: list[MsgV1], batch: int) -> tuple[int, int]:
    """Store the deletes ``batch`` at a time (planned and carried out, members not asked:
    ``ADMIT_ALL``), then compact what they erased once (as the node's erasure task does,
    once a second): (deletes, messages they erased)."""
    erased = 0
    for i in range(0, len(deletes), batch):
        erased += len(db.apply_ops(deletes[i : i + batch], rules=ADMIT_ALL).erase)
    db.compact_erased()
    return len(deletes), erased


def walk_folded(db: ChatDb, page: int, chat: bytes) -> tuple[int, int]:
    """``walk_chatdb`` over the folded history (store/views.py): (pages, messages)."""
    return _walk(db.folded_range, page, chat)


def setup_chat_lists(db: ChatDb, wl: Workload) -> None:
    """Every chat into its members' inboxes, and each member's signed read receipt up to the
    message at ``wl.read_seq`` (stamped a logical tick after it)."""
    keys = keys_by_user()
    by_chat: dict[bytes, list[MsgV1]] = {chat: [] for chat in wl.chat_ids}
    for msg in wl.msgs:
        by_chat[msg.chat_id].append(msg)
    receipts = []
    for c, chat in enumerate(wl.chat_ids):
        meta = db.get_chat_meta(chat)
        if meta is None:
            continue
        last = db.get_message(meta.last_msg_id)
        assert last is not None
        entry = InboxEntry(
            chat, ChatKind.GROUP, meta.last_ts, meta.last_msg_id, last.sender, meta.last_seq
        )
        db.upsert_inbox_for_members(chat, wl.members[chat], entry)
        for m, user in enumerate(wl.members[chat]):
            if (seq := wl.read_seq(c, m)) > 0:
                read = by_chat[chat][seq - 1]
                position = read.hlc.to_bytes()
                receipts.append(about(keys[user], read, MessageKind.READ_RECEIPT, position))
    db.put_messages(receipts)


def setup_sqlite_lists(conn: sqlite3.Connection, wl: Workload) -> None:
    """The same members and read positions as group_members and read_progress rows."""
    members, progress = [], []
    for c, chat in enumerate(wl.chat_ids):
        for m, user in enumerate(wl.members[chat]):
            members.append((chat.hex(), user.hex(), VIRTUAL_EPOCH_MS // 1000))
            if (seq := wl.read_seq(c, m)) > 0:
                progress.append((user.hex(), chat.hex(), wl.timestamps[chat][seq - 1]))
    sql.insert_members(conn, members, progress)


def walk_chatdb(db: ChatDb, page: int, chat: bytes) -> tuple[int, int]:
    """One chat newest to oldest, ``page`` messages a page, by next_cursor: (pages, messages)."""
    return _walk(db.range, page, chat)


def _walk(pages_of: Callable[..., Any], page: int, chat: bytes) -> tuple[int, int]:
    pages = items = 0
    cursor: str | None = None
    while True:
        result = pages_of(chat, cursor, limit=page, direction=Direction.BACKWARD)
        pages += 1
        items += len(result.items)
        if (cursor := result.next_cursor) is None:
            return pages, items


def walk_chatdb_unfiltered(db: ChatDb, page: int, chat: bytes) -> tuple[int, int]:
    """``walk_chatdb`` on the range path as it was before the hidden index: the same code with
    the per-page lookup of the chat's hidden messages taken out."""
    db.hidden.__dict__["seqs"] = _no_hidden  # what ``Messages.range`` asks
    try:
        return walk_chatdb(db, page, chat)
    finally:
        del db.hidden.__dict__["seqs"]


def _no_hidden(chat_id: bytes) -> set[int]:
    return set()


def walk_sqlite(conn: sqlite3.Connection, page: int, query: str, chat: bytes) -> tuple[int, int]:
    """The same walk with ``query``, fetching one row more than a page to learn has_more."""
    rfc = query == sql.PAGE_RFC
    cursor: object = sql.FIRST_ID if rfc else sql.FIRST_TIMESTAMP
    cursor_col = 0 if rfc else 3  # id, or server_timestamp
    pages = items = 0
    while True:
        rows = conn.execute(query, (chat.hex(), cursor, page + 1)).fetchall()
        pages += 1
        items += min(len(rows), page)
        if len(rows) <= page:
            return pages, items
        cursor = rows[page - 1][cursor_col]


def list_chatdb(db: ChatDb, page: int, user: bytes) -> tuple[int, int]:
    return 1, len(db.list_user_chats(user, limit=page).items)


def list_sqlite(conn: sqlite3.Connection, page: int, user: bytes) -> tuple[int, int]:
    return 1, len(conn.execute(sql.LIST_USER_CHATS, (user.hex(), page)).fetchall())


def _chatdb_unread(db: ChatDb, user: bytes, page: int) -> dict[str, int]:
    chats = db.list_user_chats(user, limit=page).items
    return {item.entry.chat_id.hex(): item.unread for item in chats}


def _sqlite_unread(conn: sqlite3.Connection, user: bytes, page: int) -> dict[str, int]:
    rows = conn.execute(sql.LIST_USER_CHATS, (user.hex(), page)).fetchall()
    return {row[0]: row[4] for row in rows}


def _check_same(ours: object, theirs: object, what: str) -> None:
    if ours != theirs:
        raise RuntimeError(f"ChatDb and SQLite disagree on {what}: {ours!r} != {theirs!r}")


def _plans(conn: sqlite3.Connection, wl: Workload, page: int) -> dict[str, list[str]]:
    chat, user = wl.chat_ids[0].hex(), wl.users[0].hex()
    return {
        "page_rfc": sql.query_plan(conn, sql.PAGE_RFC, (chat, sql.FIRST_ID, page + 1)),
        "page_by_timestamp": sql.query_plan(
            conn, sql.PAGE_BY_TIMESTAMP, (chat, sql.FIRST_TIMESTAMP, page + 1)
        ),
        "list_user_chats": sql.query_plan(conn, sql.LIST_USER_CHATS, (user, page)),
    }


# --- helpers -------------------------------------------------------------------------------


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path
