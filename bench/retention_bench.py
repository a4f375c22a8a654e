"""``chatsync bench retention``: retention GC on a real ChatDb, and what GC meets in sync.

1. **Age GC** (RETENTION.md, node/gc.py). N messages over C chats, HLCs evenly
   spread over ``retention_days / (1 - aged_fraction)`` days up to ``now``, so
   ``aged_fraction`` of them are older than the cutoff ``now - retention_days``;
   a few *dormant* chats get only aged messages (GC empties them). The messages
   are built unsigned (a zero signature): ``ChatDb.put_messages`` does not
   verify signatures — ingress (node, sync) does — so the store does the same
   work as with signed ones, and 10^6 signatures (~2 min) are not spent on it.
   They are written with ``put_messages`` in batches (timed), flushed, and then
   GC'd as the node does it: ``trim_chats`` (one ``delete_range`` per chat),
   then ``iter_seen_aged`` + ``expire_seen`` in batches, each batch's ids taken
   out of a ``DbReplica``'s Merkle tree, then ``db.compact()``. Disk is
   ``store.retention.storage_bytes`` (SST files and WAL; the JSON also has the
   split, and the info LOG / MANIFEST / OPTIONS bytes it leaves out). Checked:
   exactly the aged messages removed (count and XOR of their ids), nothing older
   than the cutoff left in seen_msg or in any chat (paged with ``range``),
   nothing newer lost, chats_meta pointing at each chat's newest message (zero
   for emptied chats), the maintained tree equal to one rebuilt from the DB,
   and a replay of aged messages refused.
2. **Size GC**: a copy of the same DB (taken before the age GC) with
   ``RetentionPolicy(max_storage_mb=about half its size)``: the cutoff, the
   messages removed against ``size_cutoff``'s estimate, the size after
   compaction against the cap.
3. **Waste** when GC cycles and clocks differ: see ``bench/retention_waste.py``.

Nothing here asserts a time.
"""

from __future__ import annotations

import gc
import math
import random
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.console import (
    bench_console,
    bench_progress,
    byte_size,
    check_mark,
    red_unless,
    save_report,
)
from bench.machine import loadavg, machine_info
from bench.retention_waste import WasteParams, grid_size, make_stream, run_waste, stream_size
from store import ChatDb, Direction, Hlc, MsgV1
from store.hlc import VIRTUAL_EPOCH_MS
from store.messages import MAX_PAGE_LIMIT
from store.records import MessageKind, blake3_id
from store.retention import (
    DAY_MS,
    RetentionPolicy,
    expire_seen,
    iter_seen_aged,
    storage_bytes,
    trim_chats,
)
from store.signing import SIGNATURE_LEN, key_from_seed, public_key, user_id_from_key
from sync.frames import Domain
from sync.merkle import MerkleTree
from sync.replica import DbReplica

MIB = 1024 * 1024
USERS = 16
ZERO_SIG = bytes(SIGNATURE_LEN)
NO_ID = bytes(32)


@dataclass(frozen=True)
class RetentionBenchParams:
    messages: int = 1_000_000
    chats: int = 1_000
    aged_fraction: float = 0.9
    dormant_fraction: float = 0.05  # chats that only get aged messages (emptied by GC)
    retention_days: float = 30.0
    payload: int = 200
    batch: int = 2_000  # messages per put_messages
    gc_batch: int = 10_000  # seen_msg ids per expire_seen step (the node's default)
    size_run: bool = True
    size_fraction: float = 0.5  # the size cap as a fraction of the DB size
    replay_sample: int = 1_000  # aged messages offered again after GC
    seed: int = 1
    waste: WasteParams = field(default_factory=WasteParams)
    out: Path = Path("bench-results/retention.json")
    data: Path | None = None  # None: a temporary directory, removed afterwards

    def check(self) -> None:
        if self.messages < 1 or self.chats < 1 or self.batch < 1 or self.gc_batch < 1:
            raise ValueError("messages, chats, batch and gc_batch must be positive")
        if not 0 < self.aged_fraction < 1 or self.retention_days <= 0:
            raise ValueError("aged_fraction must be in (0, 1) and retention_days > 0")
        if self.span_ms < self.messages:
            raise ValueError("the time span is too short for one ms per message")
        self.waste.check()

    @property
    def span_ms(self) -> int:
        return int(self.retention_days * DAY_MS / (1 - self.aged_fraction))


# --- the corpus: unsigned messages, generated batch by batch, remembered only as checks ---------


@dataclass
class Corpus:
    """What the GC must leave: generated alongside the messages, never read from the DB."""

    now_ms: int
    cutoff_ms: int
    chats: list[bytes]
    dormant: list[bytes]
    aged: int = 0
    aged_xor: int = 0  # XOR of the aged ids: the removed ids must XOR to the same
    recent: set[bytes] = field(default_factory=set)
    recent_per_chat: Counter[bytes] = field(default_factory=Counter)
    replay: list[MsgV1] = field(default_factory=list)
    generate_s: float = 0.0


def plan_corpus(params: RetentionBenchParams) -> Corpus:
    now = VIRTUAL_EPOCH_MS + params.span_ms
    cutoff = RetentionPolicy(params.retention_days).age_cutoff(now)
    assert cutoff is not None
    chats = [blake3_id(b"bench-retention-chat", i.to_bytes(4, "big")) for i in range(params.chats)]
    dormant = min(params.chats - 1, int(params.chats * params.dormant_fraction))
    return Corpus(now, cutoff, chats, chats[params.chats - dormant :] if dormant else [])


def message_batches(params: RetentionBenchParams, corpus: Corpus) -> Iterator[list[MsgV1]]:
    """The messages in HLC order, ``batch`` at a time; ``corpus`` records what must survive."""
    rng = random.Random(f"{params.seed}:gc")
    authors = []
    for i in range(USERS):
        key = public_key(key_from_seed(blake3_id(b"bench-retention-user", bytes([i]))))
        authors.append((user_id_from_key(key), key))
    n, span, size = params.messages, params.span_ms, params.payload
    active = corpus.chats[: len(corpus.chats) - len(corpus.dormant)]
    expected_aged = int(n * params.aged_fraction)
    stride = max(1, expected_aged // max(1, params.replay_sample))
    for lo in range(0, n, params.batch):
        start = perf_counter()
        hi = min(n, lo + params.batch)
        blob = rng.randbytes(size * (hi - lo))  # incompressible, like end-to-end encrypted text
        out = []
        for i in range(lo, hi):
            ms = VIRTUAL_EPOCH_MS + 1 + i * span // n
            aged = ms <= corpus.cutoff_ms
            pool = corpus.chats if aged else active
            chat = pool[rng.randrange(len(pool))]
            sender, key = authors[rng.randrange(USERS)]
            at = (i - lo) * size
            msg = MsgV1(
                chat, sender, Hlc(ms, 0), MessageKind.NEW, blob[at : at + size], None, key, ZERO_SIG
            )
            msg_id = msg.msg_id
            if aged:
                if corpus.aged % stride == 0 and len(corpus.replay) < params.replay_sample:
                    corpus.replay.append(msg)
                corpus.aged += 1
                corpus.aged_xor ^= int.from_bytes(msg_id, "big")
            else:
                corpus.recent.add(msg_id)
                corpus.recent_per_chat[chat] += 1
            out.append(msg)
        corpus.generate_s += perf_counter() - start
        yield out


# --- 1. age GC ----------------------------------------------------------------------------------


def write_corpus(
    db: ChatDb, params: RetentionBenchParams, corpus: Corpus, progress: Progress
) -> dict[str, Any]:
    task = progress.add_task("write: generate + put_messages", total=params.messages)
    write_s = 0.0
    for batch in message_batches(params, corpus):
        start = perf_counter()
        db.put_messages(batch)
        write_s += perf_counter() - start
        progress.advance(task, len(batch))
    start = perf_counter()
    db.flush()
    flush_s = perf_counter() - start
    return {
        "generate_s": corpus.generate_s,
        "write_s": write_s,
        "write_msgs_per_s": params.messages / write_s if write_s else None,
        "flush_s": flush_s,
        "disk_after_flush": disk_usage(db),
    }


def disk_usage(db: ChatDb) -> dict[str, int]:
    """``storage_bytes`` (total) and its parts, SST files and WAL (*.log); ``other``: not counted."""
    parts = {"sst": 0, "wal": 0, "other": 0}
    for f in Path(db.config.path).rglob("*"):
        if f.is_file():
            kind = {".sst": "sst", ".log": "wal"}.get(f.suffix, "other")
            parts[kind] += f.stat().st_size
    return {"total": storage_bytes(db), **parts}


def run_age_gc(
    db: ChatDb, params: RetentionBenchParams, corpus: Corpus, progress: Progress
) -> dict[str, Any]:
    """The node's GC cycle (node/gc.py), step by step and timed, then the checks."""
    cutoff = corpus.cutoff_ms
    disk_before = disk_usage(db)  # reopened: what the node's GC finds
    start = perf_counter()
    replica = DbReplica(db)  # what a node builds when it starts
    tree_build_s = perf_counter() - start

    start = perf_counter()
    trimmed = trim_chats(db, cutoff)
    trim_s = perf_counter() - start

    task = progress.add_task("GC: expire seen_msg + tree", total=corpus.aged)
    aged = iter_seen_aged(db, cutoff)
    seen_s = tree_s = 0.0
    removed = batches = 0
    xor = 0
    while True:
        start = perf_counter()
        ids = expire_seen(aged, db, params.gc_batch)
        seen_s += perf_counter() - start
        start = perf_counter()
        replica.remove_from_tree(ids)
        tree_s += perf_counter() - start
        if not ids:
            break
        removed += len(ids)
        batches += 1
        for msg_id in ids:  # not timed: the check that exactly the aged ids went
            xor ^= int.from_bytes(msg_id, "big")
        progress.advance(task, len(ids))
    disk_after_gc = disk_usage(db)
    progress.add_task("compaction", total=None)
    start = perf_counter()
    db.compact()
    compact_s = perf_counter() - start
    disk_after = disk_usage(db)
    # The next cycle at the same cutoff: nothing to expire, but the same scans (steady state).
    start = perf_counter()
    trim_chats(db, cutoff)
    again = iter_seen_aged(db, cutoff)
    repeat_removed = 0
    while ids := expire_seen(again, db, params.gc_batch):
        replica.remove_from_tree(ids)
        repeat_removed += len(ids)
    repeat_s = perf_counter() - start
    start = perf_counter()
    checks = verify_age_gc(db, replica, corpus, removed, xor)
    rebuild_s = checks.pop("tree_rebuild_from_survivors_s")
    checks["repeat_cycle_removed"] = repeat_removed
    checks["ok"] = checks["ok"] and repeat_removed == 0
    verify_s = perf_counter() - start
    return {
        "tree_build_s": tree_build_s,
        "trim_chats_s": trim_s,
        "chats_trimmed": len(trimmed),
        "seen_expiry_s": seen_s,
        "tree_remove_s": tree_s,
        "gc_batches": batches,
        "gc_s": trim_s + seen_s + tree_s,
        "messages_removed": removed,
        "messages_expected": corpus.aged,
        "disk_before": disk_before["total"],
        "disk_after_gc": disk_after_gc["total"],
        "compact_s": compact_s,
        "disk_after_compaction": disk_after["total"],
        "disk_detail": {
            "gc_start": disk_before,
            "after_gc": disk_after_gc,
            "after_compaction": disk_after,
        },
        "repeat_cycle_s": repeat_s,
        "tree_rebuild_from_survivors_s": rebuild_s,
        "verify_s": verify_s,
        "checks": checks,
    }


def verify_age_gc(
    db: ChatDb, replica: DbReplica, corpus: Corpus, removed: int, removed_xor: int
) -> dict[str, Any]:
    cutoff = corpus.cutoff_ms
    ids: set[bytes] = set()
    older_in_index = 0
    for msg_id, physical in db.iter_msg_ids():
        ids.add(msg_id)
        older_in_index += physical <= cutoff
    older_in_chats = foreign = count_mismatch = meta_mismatch = paged = 0
    for chat in corpus.chats:
        cursor, count, newest = None, 0, NO_ID
        while True:
            page = db.range(chat, cursor, limit=MAX_PAGE_LIMIT, direction=Direction.FORWARD)
            for item in page.items:
                count += 1
                older_in_chats += item.msg.hlc.physical_ms <= cutoff
                newest = item.msg.msg_id
                foreign += newest not in corpus.recent
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        paged += count
        count_mismatch += count != corpus.recent_per_chat[chat]
        meta = db.get_chat_meta(chat)
        if meta is not None and meta.last_msg_id != newest:
            meta_mismatch += 1
    dormant_emptied = sum(
        (meta := db.get_chat_meta(chat)) is not None and meta.last_msg_id == NO_ID
        for chat in corpus.dormant
    )
    start = perf_counter()
    rebuilt = MerkleTree.from_ids(ids)
    rebuild_s = perf_counter() - start
    tree = replica.tree(Domain.MESSAGES)
    results = db.put_messages(corpus.replay)  # gossip or sync offering aged messages again
    refused = sum(r.expired for r in results)
    still = sum(1 for _ in db.iter_msg_ids())
    checks: dict[str, Any] = {
        "removed_equals_expected": removed == corpus.aged,
        "removed_ids_are_the_aged": removed_xor == corpus.aged_xor,
        "older_left_in_seen_msg": older_in_index,
        "older_left_in_chats": older_in_chats,
        "newer_lost": len(corpus.recent - ids),
        "unexpected_ids": len(ids - corpus.recent) + foreign,
        "messages_paged": paged,
        "chats_with_wrong_count": count_mismatch,
        "chats_meta_wrong": meta_mismatch,
        "dormant_chats_emptied": f"{dormant_emptied}/{len(corpus.dormant)}",
        "tree_equals_rebuild": tree == rebuilt and tree.root() == rebuilt.root(),
        "tree_count": tree.count,
        "tree_rebuild_from_survivors_s": rebuild_s,
        "replay_refused": f"{refused}/{len(results)}",
        "replay_stored": still - len(ids),
    }
    checks["ok"] = (
        checks["removed_equals_expected"]
        and checks["removed_ids_are_the_aged"]
        and older_in_index == older_in_chats == 0
        and checks["newer_lost"] == checks["unexpected_ids"] == 0
        and count_mismatch == meta_mismatch == 0
        and dormant_emptied == len(corpus.dormant)
        and checks["tree_equals_rebuild"]
        and refused == len(results)
        and checks["replay_stored"] == 0
    )
    return checks


# --- 2. size GC --------------------------------------------------------------------------------


def run_size_gc(db: ChatDb, params: RetentionBenchParams, corpus: Corpus) -> dict[str, Any]:
    """RetentionPolicy(max_storage_mb = size_fraction of the DB): how much goes, how close to the cap."""
    used = storage_bytes(db)
    cap_mb = max(1, round(used * params.size_fraction / MIB))
    cap = cap_mb * MIB
    policy = RetentionPolicy(max_storage_mb=cap_mb)
    start = perf_counter()
    cutoff = policy.cutoff(db, corpus.now_ms)
    cutoff_s = perf_counter() - start
    n = params.messages
    expected = max(1, math.ceil(n * (used - cap) / used)) if used > cap else 0
    out: dict[str, Any] = {
        "disk_before": used,
        "cap_mb": cap_mb,
        "cap_bytes": cap,
        "cutoff_ms": cutoff,
        "cutoff_s": cutoff_s,
        "messages_expected": expected,
    }
    if cutoff is None:
        out.update(messages_removed=0, ok=expected == 0)
        return out
    start = perf_counter()
    replica = DbReplica(db)
    tree_build_s = perf_counter() - start
    start = perf_counter()
    expired = replica.expire_messages(cutoff, params.gc_batch)
    gc_s = perf_counter() - start
    disk_after_gc = storage_bytes(db)
    start = perf_counter()
    db.compact()
    compact_s = perf_counter() - start
    after = storage_bytes(db)
    ids: set[bytes] = set()
    older = 0
    for msg_id, physical in db.iter_msg_ids():
        ids.add(msg_id)
        older += physical <= cutoff
    tree_ok = replica.tree(Domain.MESSAGES) == MerkleTree.from_ids(ids)
    out.update(
        tree_build_s=tree_build_s,
        gc_s=gc_s,
        messages_removed=len(expired),
        messages_left=len(ids),
        older_left=older,
        disk_after_gc=disk_after_gc,
        compact_s=compact_s,
        disk_after_compaction=after,
        after_over_cap=after / cap,
        under_cap=after <= cap,
        tree_equals_rebuild=tree_ok,
    )
    out["ok"] = len(expired) == expected and len(ids) == n - expected and not older and tree_ok
    return out


# --- entry point -------------------------------------------------------------------------------


def run_retention_bench(
    params: RetentionBenchParams, console: Console | None = None
) -> dict[str, Any]:
    """Run all three parts, print the tables, save and return the JSON document."""
    params.check()
    console = console or bench_console(log_width=220)
    base = params.data or Path(tempfile.mkdtemp(prefix="chatsync-bench-retention-"))
    base.mkdir(parents=True, exist_ok=True)
    load_before = loadavg()
    started = perf_counter()
    corpus = plan_corpus(params)
    age_path, size_path = base / "age", base / "size"
    for path in (age_path, size_path):
        shutil.rmtree(path, ignore_errors=True)
    size: dict[str, Any] | None = None
    try:
        with bench_progress(console, label_width=44) as progress:
            db = ChatDb(path=age_path)
            try:
                written = write_corpus(db, params, corpus, progress)
            finally:
                db.close()
            if params.size_run:  # the same DB, before GC, for the size-based run
                shutil.copytree(age_path, size_path)
            with ChatDb(path=age_path) as db:
                age = {**written, **run_age_gc(db, params, corpus, progress)}
            shutil.rmtree(age_path, ignore_errors=True)
            if params.size_run:
                progress.add_task("size-based GC", total=None)
                with ChatDb(path=size_path) as db:
                    size = run_size_gc(db, params, corpus)
                shutil.rmtree(size_path, ignore_errors=True)
            corpus.replay.clear()
            corpus.recent.clear()
            gc.collect()
            sign = progress.add_task("waste: signing the stream", total=stream_size(params.waste))
            stream = make_stream(params.waste, lambda k: progress.advance(sign, k))
            grid = progress.add_task("waste grid", total=grid_size(params.waste))

            def advance(what: str) -> None:
                progress.update(grid, description=what)
                progress.advance(grid)

            cases = run_waste(params.waste, stream, advance)
    finally:
        if params.data is None:
            shutil.rmtree(base, ignore_errors=True)
    report = _report(params, corpus, age, size, stream.sign_s, len(stream.msgs), cases)
    report["machine"] = machine_info(load_before)
    report["elapsed_s"] = perf_counter() - started
    _print(console, report)
    save_report(console, report, params.out)
    return report


# --- report ------------------------------------------------------------------------------------


def _report(
    params: RetentionBenchParams,
    corpus: Corpus,
    age: dict[str, Any],
    size: dict[str, Any] | None,
    sign_s: float,
    stream_messages: int,
    cases: list[dict[str, Any]],
) -> dict[str, Any]:
    failures: list[dict[str, Any]] = []
    if not age["checks"]["ok"]:
        failures.append({"part": "age_gc", "what": "a check failed", "checks": age["checks"]})
    if size is not None and not size["ok"]:
        failures.append({"part": "size_gc", "what": "a check failed"})
    for c in cases:
        for f in c["failures"]:
            failures.append({"part": "waste", "skew_s": c["skew_s"], "lag_s": c["lag_s"],
                             "loss": c["loss"], "what": f})  # fmt: skip
    age_doc = {
        "messages": params.messages,
        "chats": params.chats,
        "batch": params.batch,
        "dormant_chats": len(corpus.dormant),
        "now_ms": corpus.now_ms,
        "cutoff_ms": corpus.cutoff_ms,
        "retention_days": params.retention_days,
        "span_days": params.span_ms / DAY_MS,
        "signatures": "zero (unsigned): ChatDb.put_messages does not verify signatures",
        **age,
        "reclaimed_fraction": 1 - age["disk_after_compaction"] / age["disk_before"],
    }
    return {
        "benchmark": "retention",
        "params": _jsonable(asdict(params)),
        "gc": age_doc,
        "size_gc": size,
        "waste": {
            "stream_messages": stream_messages,
            "sign_s": sign_s,
            "cases": cases,
        },
        "findings": _findings(params.waste, cases),
        "failures": failures,
        "notes": (__doc__ or "") + "\n" + (_waste_doc() or ""),
    }


def _waste_doc() -> str | None:
    from bench import retention_waste

    return retention_waste.__doc__


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _findings(params: WasteParams, cases: list[dict[str, Any]]) -> list[str]:
    """What the waste grid shows, in words (the figures are in the cases)."""
    out = []
    expired = sum(c["summary"]["expired_shipped"] for c in cases)
    rejected = sum(c["summary"]["rejected_old"] for c in cases)
    out.append(
        f"{expired} expired records shipped and {rejected} rejected as old over "
        f"{sum(len(c['sessions']) for c in cases)} sessions"
    )
    windowed = [c for c in cases if c["summary"]["window_records_mean"]]
    if windowed:
        worst = max(c["summary"]["passes_max"] or 0 for c in windowed)
        per = [
            c["summary"]["waste_bytes_per_window_record"]
            for c in windowed
            if c["summary"]["waste_bytes_per_window_record"] is not None
        ]
        if per:
            out.append(
                f"sessions with a disagreement window: at most {worst} passes; waste "
                f"{min(per):.0f}-{max(per):.0f} B per record in the window (no bodies)"
            )
    twice = [c for c in windowed if c["loss"] > 0 and (c["summary"]["passes_max"] or 0) >= 3]
    if twice:
        out.append(
            "with gossip loss, a session that moves fresh records needs a second pass to "
            "confirm, and that pass descends into the window's buckets again (then a final "
            "HELLO): the window is paid twice per session"
        )
    a_b = []
    for c in windowed:  # the side with the earlier cutoff holds the window
        s = c["summary"]
        holder, other = (
            (s["bytes_b_initiates"], s["bytes_a_initiates"])
            if c["cutoff_gap_s"] < 0
            else (s["bytes_a_initiates"], s["bytes_b_initiates"])
        )
        if holder and other:
            a_b.append(holder / other)
    if a_b:
        out.append(
            f"when the side holding the window (the earlier cutoff) initiates, the peer "
            f"asks for the window's ids (32 B wants each, refused by the soft filter): "
            f"{min(a_b):.2f}-{max(a_b):.2f}x the bytes of the other direction"
        )
    if any(s >= params.window_s for s in params.skews_s):
        out.append(
            "a clock ahead by >= the retention window gives a cutoff at or after now: that "
            "node keeps nothing and receives nothing; its peers keep their records (the "
            "later cutoff only filters what travels)"
        )
    return out


# --- printing ----------------------------------------------------------------------------------


def _print(console: Console, report: dict[str, Any]) -> None:
    g = report["gc"]
    console.print(_gc_table(g))
    console.print(_checks_table(g["checks"]))
    if report["size_gc"] is not None:
        console.print(_size_table(report["size_gc"]))
    p = report["params"]["waste"]
    console.print(_waste_table(report["waste"]["cases"], p))
    for f in report["findings"]:
        console.print(f"• {f}")
    if report["failures"]:
        console.print(f"[red bold]{len(report['failures'])} failure(s):[/]")
        for f in report["failures"]:
            console.print(f"  [red]{f}[/]")
    else:
        console.print("[green]correctness: every check held[/]")
    m = report["machine"]
    console.print(
        f"{m['cpu_count']} CPUs, Python {m['python']}, load {m['loadavg_before']} -> "
        f"{m['loadavg_after']}, whole run {report['elapsed_s']:.0f} s"
    )


def _gc_table(g: dict[str, Any]) -> Table:
    table = Table(
        title=f"chatsync bench retention — age GC of {g['messages']:,} messages over "
        f"{g['chats']:,} chats ({g['messages_expected']:,} older than the cutoff "
        f"now - {g['retention_days']:g} days)",
        caption="messages unsigned (zero signature): ChatDb.put_messages does not verify "
        "signatures; disk = store.retention.storage_bytes (SST files + WAL)",
    )
    table.add_column("step")
    table.add_column("time", justify="right")
    table.add_column("figures", justify="left")
    before = g["disk_before"]
    rows = [
        ("generate messages (not a store cost)", g["generate_s"], ""),
        ("write: put_messages", g["write_s"],
         f"batches of {g['batch']:,}{_rate(g['write_msgs_per_s'])}"),
        ("flush", g["flush_s"], f"disk after flush {_mb(g['disk_after_flush']['total'])} "
         f"(WAL {_mb(g['disk_after_flush']['wal'])}); reopened for GC "
         f"(background compaction settled): {_mb(before)}"),
        ("tree build from the DB (node start)", g["tree_build_s"], ""),
        ("GC: trim_chats (delete_range per chat)", g["trim_chats_s"],
         f"{g['chats_trimmed']:,} chats trimmed"),
        ("GC: seen_msg expiry (scan + batched deletes)", g["seen_expiry_s"],
         f"{g['gc_batches']:,} batches"),
        ("GC: Merkle tree removals", g["tree_remove_s"],
         f"{g['messages_removed']:,} ids, "
         f"{g['tree_remove_s'] / max(1, g['messages_removed']) * 1e6:.1f} µs each "
         f"(MerkleTree.from_ids over the {g['checks']['tree_count']:,} left: "
         f"{g['tree_rebuild_from_survivors_s']:.2f} s)"),
        ("[bold]GC total[/]", g["gc_s"],
         f"{g['messages_removed']:,} removed / {g['messages_expected']:,} expected; "
         f"disk after GC {_mb(g['disk_after_gc'])} ({_pct(g['disk_after_gc'], before)}; "
         f"WAL {_mb(g['disk_detail']['after_gc']['wal'])})"),
        ("compaction (db.compact())", g["compact_s"],
         f"disk after {_mb(g['disk_after_compaction'])} "
         f"({_pct(g['disk_after_compaction'], before)}; "
         f"{g['reclaimed_fraction'] * 100:.1f} % reclaimed)"),
        ("next GC cycle, nothing to expire (scans only)", g["repeat_cycle_s"],
         f"{g['checks']['tree_count']:,} messages left, "
         f"{g['repeat_cycle_s'] / max(1, g['checks']['tree_count']) * 1e6:.2f} µs per message"),
        ("checks (not a GC cost)", g["verify_s"], ""),
    ]  # fmt: skip
    for step, seconds, figures in rows:
        table.add_row(step, f"{seconds:,.2f} s", figures)
    return table


def _checks_table(checks: dict[str, Any]) -> Table:
    table = Table(title="age GC correctness")
    table.add_column("check")
    table.add_column("value", justify="right")
    good = {
        "removed_equals_expected": True,
        "removed_ids_are_the_aged": True,
        "older_left_in_seen_msg": 0,
        "older_left_in_chats": 0,
        "newer_lost": 0,
        "unexpected_ids": 0,
        "chats_with_wrong_count": 0,
        "chats_meta_wrong": 0,
        "tree_equals_rebuild": True,
        "replay_stored": 0,
        "repeat_cycle_removed": 0,
    }
    for key, value in checks.items():
        if key == "ok":
            continue
        bad = key in good and value != good[key]
        text = (
            f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
        )
        table.add_row(key.replace("_", " "), f"[red]{text}[/]" if bad else text)
    table.add_row("[bold]all hold[/]", check_mark(checks["ok"]))
    return table


def _size_table(s: dict[str, Any]) -> Table:
    table = Table(
        title=f"size-based GC: RetentionPolicy(max_storage_mb={s['cap_mb']}) on a copy of the "
        f"DB ({_mb(s['disk_before'])})",
        caption="size_cutoff assumes space in proportion to message count; the next cycle corrects",
    )
    for col in ("cutoff", "removed / expected", "GC", "compaction", "after GC", "after compaction",
                "vs cap", "tree = rebuild", "ok"):  # fmt: skip
        table.add_column(col, justify="right")
    if s["cutoff_ms"] is None:
        table.add_row("none (under the cap)", "0", "", "", "", "", "", "", "✓" if s["ok"] else "✗")
        return table
    table.add_row(
        f"{s['cutoff_s']:.2f} s",
        f"{s['messages_removed']:,} / {s['messages_expected']:,}",
        f"{s['gc_s']:.2f} s",
        f"{s['compact_s']:.2f} s",
        _mb(s["disk_after_gc"]),
        _mb(s["disk_after_compaction"]),
        f"{s['after_over_cap'] * 100:.0f} % of cap",
        "✓" if s["tree_equals_rebuild"] else "[red]✗[/]",
        check_mark(s["ok"]),
    )
    return table


def _waste_table(cases: list[dict[str, Any]], p: dict[str, Any]) -> Table:
    table = Table(
        title=f"waste when GC cycles and clocks differ — stream {p['rate']:g} msgs/s, window "
        f"W = {p['window_s']:g} s, a GC + one session every {p['period_s']:g} s, "
        f"{p['sessions']} sessions per row (A and B initiate in turn)",
        caption="gap = B's cutoff - A's = s - Δ; window = records one side holds at or before "
        "the later cutoff (bound: stream records between the cutoffs); bytes = reconciliation "
        "(both directions, bodies excluded) per session; waste = bytes - baseline (s = Δ = 0, "
        "same stream and losses); shipped = bodies of fresh records (expired: must be 0); "
        "spread = max/min bytes over the sessions one side initiated (flat: about 1)",
    )
    for col in (
        "loss", "skew s", "GC lag Δ", "gap", "window (bound)", "buckets", "fresh diffs",
        "bytes A→ | B→", "baseline", "× base", "waste/rec", "bodies", "passes", "frames",
        "shipped", "expired", "rejected", "agree", "spread",
    ):  # fmt: skip
        table.add_column(col, justify="right", no_wrap=True)
    for c in cases:
        s = c["summary"]
        table.add_row(
            f"{c['loss'] * 100:g} %",
            f"{c['skew_s']:g} s",
            f"{c['lag_s']:g} s",
            f"{c['cutoff_gap_s']:+g} s",
            f"{s['window_records_mean']:,.0f} ({s['window_bound_mean']:,.0f})",
            f"{s['window_buckets_mean']:,.0f}",
            f"{s['fresh_differences_mean']:,.1f}",
            f"{byte_size(s['bytes_a_initiates'])} | {byte_size(s['bytes_b_initiates'])}",
            byte_size(s["baseline_bytes_mean"]),
            "—" if s["ratio_to_baseline_mean"] is None else f"{s['ratio_to_baseline_mean']:,.1f}x",
            "—"
            if s["waste_bytes_per_window_record"] is None
            else f"{s['waste_bytes_per_window_record']:,.0f} B",
            byte_size(s["bodies_bytes_mean"]),
            str(s["passes_max"]),
            str(s["frames_max"]),
            f"{s['fresh_shipped']:,}",
            red_unless(str(s["expired_shipped"]), s["expired_shipped"] == 0),
            str(s["rejected_old"]),
            red_unless("yes" if s["agree_newer"] else "NO", s["agree_newer"]),
            "—" if s["same_direction_spread"] is None else f"{s['same_direction_spread']:.2f}",
        )
    return table


def _mb(value: int) -> str:
    return f"{value / 1e6:,.1f} MB"


def _pct(value: int, of: int) -> str:
    return f"{value / of * 100:.0f} % of before" if of else "—"


def _rate(per_s: float | None) -> str:
    return "" if per_s is None else f", {per_s:,.0f} msgs/s"


__all__ = ["RetentionBenchParams", "WasteParams", "run_retention_bench"]
