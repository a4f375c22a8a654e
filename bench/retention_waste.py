"""Part 2 of ``chatsync bench retention``: what sessions waste when GC cycles and clocks differ.

Two ``MemoryReplica`` (A and B) receive one stream of real signed messages at
``rate`` msgs/s, delivered to both as gossip would (a ``loss`` fraction misses
one of the two, drawn once per message so every case sees the same losses).
Messages carry their author's HLC = true time. Every ``period_s`` both nodes
run their GC and then A and B sync once (``sync.loopback.run_session``; A
initiates at even sync moments, B at odd ones), each side with
``SyncConfig(cutoff_ms=its last GC cutoff)``; the session negotiates the later
of the two.

  A: clock = true time; GC right before the sync moment T: cutoff T - W.
  B: clock = true time + skew s; its last GC ran lag Δ before T (true time):
     cutoff (T - Δ + s) - W.  (Δ < period: B's GC runs once per period too.)

So at every sync moment the cutoffs differ by s - Δ: the side with the earlier
cutoff still holds the records between the two cutoffs, which the other side
has aged out — the *disagreement window*. A session must ship none of them
(the soft filter), must bring both sides into agreement on everything newer
than the later cutoff (the records a lost gossip left on one side only), must
end, and its extra cost must stay bounded by the window — no record bodies,
only hashes, cells and wants for the differing buckets — and not grow with time.
The baseline is the same session when both GC at the same instant (s = Δ = 0):
the same stream and losses, sync moment by sync moment. Nothing here asserts a
time.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from store.hlc import VIRTUAL_EPOCH_MS, Hlc
from store.keys import bucket_of
from store.records import MsgV1, blake3_id, decode_msg
from store.signing import key_from_seed
from sync.errors import RemoteProtocolError
from sync.frames import Domain, Hello, Transfer, decode_frame
from sync.loopback import run_session
from sync.merkle import MerkleTree
from sync.protocol import KINDS, SyncConfig
from sync.replica import MemoryReplica, Record

AUTHORS = 8
CHATS = 16
BIG = 1 << 30  # frame limits when the bench decodes frames it only observes


@dataclass(frozen=True)
class WasteParams:
    rate: float = 20.0  # stream, msgs/s
    window_s: float = 60.0  # retention window W
    period_s: float = 360.0  # sync moments and GC cycles; every lag must be below it
    sessions: int = 6  # sync moments per case
    skews_s: tuple[float, ...] = (0.0, 1.0, 10.0, 60.0, 120.0)  # B's clock ahead by s
    lags_s: tuple[float, ...] = (0.0, 30.0, 300.0)  # B's last GC ran Δ before the sync moment
    losses: tuple[float, ...] = (0.0, 0.01)  # gossip loss: fraction reaching one side only
    payload: int = 100
    seed: int = 1
    max_frames: int = 10_000  # a session longer than this "does not terminate"

    def check(self) -> None:
        if not 0 < self.rate <= 1000:
            raise ValueError(f"rate must be in (0, 1000] msgs/s (one HLC ms each), got {self.rate}")
        if self.window_s <= 0 or self.sessions < 1:
            raise ValueError("window and sessions must be positive")
        if any(lag < 0 or lag >= self.period_s for lag in self.lags_s):
            raise ValueError(f"every GC lag must be in [0, period = {self.period_s} s)")
        if any(not 0 <= loss < 1 for loss in self.losses):
            raise ValueError("losses must be in [0, 1)")


@dataclass
class Stream:
    msgs: list[MsgV1]
    times: list[int]  # HLC physical ms, increasing
    draws: list[float]  # a message is lost when its draw < loss ...
    sides: list[int]  # ... and then misses replica 0 (A) or 1 (B)
    moments: list[int]  # sync moments (true time, ms)
    sign_s: float


def make_stream(params: WasteParams, advance: Callable[[int], None] = lambda n: None) -> Stream:
    """Every message the cases need, signed up front (not timed)."""
    w_ms = int(params.window_s * 1000)
    lead = w_ms + int(max(params.lags_s) * 1000) + int(max(0.0, -min(params.skews_s)) * 1000)
    first = VIRTUAL_EPOCH_MS + lead + 1_000  # the oldest cutoff at the first sync moment >= epoch
    moments = [first + k * int(params.period_s * 1000) for k in range(params.sessions)]
    rng = random.Random(f"{params.seed}:waste")
    keys = [key_from_seed(blake3_id(b"bench-retention-user", bytes([i]))) for i in range(AUTHORS)]
    chats = [blake3_id(b"bench-retention-chat", bytes([i])) for i in range(CHATS)]
    stream = Stream([], [], [], [], moments, 0.0)
    start = perf_counter()
    i = 0
    while (ms := VIRTUAL_EPOCH_MS + 1 + int(i * 1000 / params.rate)) <= moments[-1]:
        msg = MsgV1.create(
            keys[i % AUTHORS], rng.choice(chats), Hlc(ms, 0), rng.randbytes(params.payload)
        )
        _ = msg.msg_id  # hash now, not inside a session
        stream.msgs.append(msg)
        stream.times.append(ms)
        stream.draws.append(rng.random())
        stream.sides.append(rng.randrange(2))
        i += 1
        if i % 1000 == 0:
            advance(1000)
    advance(i % 1000)
    stream.sign_s = perf_counter() - start
    return stream


def stream_size(params: WasteParams) -> int:
    """How many messages ``make_stream`` signs (for a progress bar)."""
    w_ms = int(params.window_s * 1000)
    lead = w_ms + int(max(params.lags_s) * 1000) + int(max(0.0, -min(params.skews_s)) * 1000)
    last = VIRTUAL_EPOCH_MS + lead + 1_000 + (params.sessions - 1) * int(params.period_s * 1000)
    return int((last - VIRTUAL_EPOCH_MS - 1) * params.rate / 1000) + 1


class FrameWatch:
    """Decodes every frame of a session and counts the message bodies shipped, old or not."""

    def __init__(self, cutoff_ms: int) -> None:
        self.cutoff_ms = cutoff_ms
        self.expired: list[dict[str, Any]] = []
        self.fresh = 0

    def __call__(self, sender: str, data: bytes) -> None:
        frame = decode_frame(data, max_frame=BIG, max_ids=BIG)
        if isinstance(frame, Hello):  # a closing HELLO carries its pass's last pushes
            blobs = frame.records.get(Domain.MESSAGES, [])
        elif isinstance(frame, Transfer) and Domain.MESSAGES in frame.sections:
            blobs = frame.sections[Domain.MESSAGES].records
        else:
            return
        for blob in blobs:
            msg = decode_msg(blob)
            if msg.hlc.physical_ms <= self.cutoff_ms:
                self.expired.append(
                    {"by": sender, "id": msg.msg_id.hex(), "physical_ms": msg.hlc.physical_ms}
                )
            else:
                self.fresh += 1


def run_waste_case(
    stream: Stream, params: WasteParams, skew_s: float, lag_s: float, loss: float
) -> dict[str, Any]:
    """One (skew, lag, loss): the whole timeline, one session per sync moment."""
    w_ms, skew_ms, lag_ms = int(params.window_s * 1000), int(skew_s * 1000), int(lag_s * 1000)
    # the sync engine alone (admit_all): what GC and the cutoffs cost set reconciliation;
    # the stream's chats have no member ops, and who may post is not what is measured here
    a, b = MemoryReplica(admit_all=True), MemoryReplica(admit_all=True)
    msgs, times = stream.msgs, stream.times
    delivered = 0
    sessions: list[dict[str, Any]] = []
    for k, now in enumerate(stream.moments):
        to_a: list[Record] = []
        to_b: list[Record] = []
        while delivered < len(msgs) and times[delivered] <= now:  # gossip up to the sync moment
            lost = stream.draws[delivered] < loss
            if not (lost and stream.sides[delivered] == 0):
                to_a.append(msgs[delivered])
            if not (lost and stream.sides[delivered] == 1):
                to_b.append(msgs[delivered])
            delivered += 1
        a.apply(Domain.MESSAGES, to_a)
        b.apply(Domain.MESSAGES, to_b)
        cut_a = now - w_ms
        cut_b = now - lag_ms + skew_ms - w_ms
        # B's GC ran at T - Δ, before the gossip of (T - Δ, T]: expire_messages also refuses
        # what arrives after it, so running it now leaves B with the same records.
        a.expire_messages(cut_a)
        b.expire_messages(cut_b)
        sessions.append(_sync_moment(stream, params, k, now, a, b, cut_a, cut_b))
    return {
        "skew_s": skew_s,
        "lag_s": lag_s,
        "loss": loss,
        "cutoff_gap_s": (skew_ms - lag_ms) / 1000,
        "sessions": sessions,
    }


def _sync_moment(
    stream: Stream,
    params: WasteParams,
    k: int,
    now: int,
    a: MemoryReplica,
    b: MemoryReplica,
    cut_a: int,
    cut_b: int,
) -> dict[str, Any]:
    later, earlier = max(cut_a, cut_b), min(cut_a, cut_b)
    ms_of = {m.msg_id: m.hlc.physical_ms for m in (*a.messages.values(), *b.messages.values())}
    trees_ok = all(
        r.tree(Domain.MESSAGES) == MerkleTree.from_ids(r.messages) for r in (a, b)
    )  # GC took exactly the expired ids out of each tree
    only = set(a.messages) ^ set(b.messages)
    window = [i for i in only if ms_of[i] <= later]
    times = stream.times
    # Records between the two cutoffs (and not from the future): what the earlier side may hold.
    bound = max(
        0, bisect.bisect_right(times, min(later, now)) - bisect.bisect_right(times, earlier)
    )
    a_starts = k % 2 == 0
    initiator, responder = (a, b) if a_starts else (b, a)
    watch = FrameWatch(later)
    start = perf_counter()
    error = None
    try:
        result = run_session(
            initiator,
            responder,
            now_ms=now,
            salt_seed=f"bench-retention:{k}".encode(),
            config=SyncConfig(cutoff_ms=cut_a if a_starts else cut_b),
            responder_config=SyncConfig(cutoff_ms=cut_b if a_starts else cut_a),
            max_frames=params.max_frames,
            on_frame=watch,
        )
    except (RuntimeError, RemoteProtocolError) as exc:  # did not end, or ended in an error
        error = f"{type(exc).__name__}: {exc}"
    wall = perf_counter() - start
    newer_a = {i for i, m in a.messages.items() if m.hlc.physical_ms > later}
    newer_b = {i for i, m in b.messages.items() if m.hlc.physical_ms > later}
    expected = max(0, bisect.bisect_right(times, now) - bisect.bisect_right(times, later))
    row: dict[str, Any] = {
        "k": k,
        "now_ms": now,
        "initiator": "A" if a_starts else "B",
        "cutoff_a": cut_a,
        "cutoff_b": cut_b,
        "held": [len(a.messages), len(b.messages)],
        "window_records": len(window),
        "window_bound": bound,
        "window_buckets": len({bucket_of(i) for i in window}),
        "fresh_differences": len(only) - len(window),
        "error": error,
        "wall_ms": wall * 1000,
        "expired_shipped": len(watch.expired),
        "expired_examples": watch.expired[:5],
        "fresh_shipped": watch.fresh,
        "agree_newer": newer_a == newer_b and len(newer_a) == expected,
        "newer_expected": expected,
        "no_resurrection": all(m.hlc.physical_ms > cut_a for m in a.messages.values())
        and all(m.hlc.physical_ms > cut_b for m in b.messages.values()),
        "trees_match_records": trees_ok
        and all(r.tree(Domain.MESSAGES) == MerkleTree.from_ids(r.messages) for r in (a, b)),
    }
    if error is None:
        ini, resp = result.initiator.stats, result.responder.stats
        kinds = {kind: ini.bytes_sent[kind] + ini.bytes_received[kind] for kind in KINDS}
        row.update(
            reconciliation_bytes=ini.reconciliation_bytes(),
            total_bytes=sum(kinds.values()),
            bytes_by_kind=kinds,
            round_trips=ini.round_trips,
            passes=ini.passes,
            frames=result.frames,
            records_shipped=ini.records_sent + resp.records_sent,
            rejected_old=ini.rejected_old + resp.rejected_old,
            converged=result.converged,
        )
    row["failures"] = _failures(row)
    return row


def _failures(row: dict[str, Any]) -> list[str]:
    out = []
    if row["error"]:
        out.append(f"session {row['k']}: {row['error']}")
    if row["expired_shipped"]:
        out.append(f"session {row['k']}: {row['expired_shipped']} expired records shipped")
    if not row["agree_newer"]:
        out.append(f"session {row['k']}: replicas disagree on records newer than the later cutoff")
    if not row["no_resurrection"]:
        out.append(f"session {row['k']}: a replica holds a record at or before its own cutoff")
    if not row["trees_match_records"]:
        out.append(f"session {row['k']}: a Merkle tree differs from one rebuilt from its records")
    return out


def summarize(cases: list[dict[str, Any]]) -> None:
    """Per case: averages, the baseline (s = Δ = 0 at the same loss) and the ratios, in place."""
    baselines = {c["loss"]: c["sessions"] for c in cases if c["skew_s"] == 0 and c["lag_s"] == 0}
    for case in cases:
        rows = case["sessions"]
        base = baselines.get(case["loss"])
        ok = [r for r in rows if r["error"] is None]
        by_dir = {
            d: [r["reconciliation_bytes"] for r in ok if r["initiator"] == d] for d in ("A", "B")
        }
        waste = [
            r["reconciliation_bytes"] - b["reconciliation_bytes"]
            for r, b in zip(rows, base or [], strict=False)
            if r["error"] is None and b["error"] is None
        ]
        ratios = [
            r["reconciliation_bytes"] / b["reconciliation_bytes"]
            for r, b in zip(rows, base or [], strict=False)
            if r["error"] is None and b["error"] is None and b["reconciliation_bytes"]
        ]
        window = sum(r["window_records"] for r in ok)
        case["summary"] = {
            "window_records_mean": _mean([r["window_records"] for r in rows]),
            "window_bound_mean": _mean([r["window_bound"] for r in rows]),
            "window_buckets_mean": _mean([r["window_buckets"] for r in rows]),
            "fresh_differences_mean": _mean([r["fresh_differences"] for r in rows]),
            "bytes_mean": _mean([r["reconciliation_bytes"] for r in ok]),
            "bytes_a_initiates": _mean(by_dir["A"]),
            "bytes_b_initiates": _mean(by_dir["B"]),
            "bytes_max": max((r["reconciliation_bytes"] for r in ok), default=None),
            "bodies_bytes_mean": _mean([r["bytes_by_kind"]["records"] for r in ok]),
            "same_direction_spread": max(
                (max(v) / min(v) for v in by_dir.values() if v and min(v) > 0), default=None
            ),
            "baseline_bytes_mean": None
            if base is None
            else _mean([r["reconciliation_bytes"] for r in base if r["error"] is None]),
            "ratio_to_baseline_mean": _mean(ratios),
            "waste_bytes_mean": _mean(waste),
            "waste_bytes_per_window_record": sum(waste) / window if window else None,
            "passes_max": max((r["passes"] for r in ok), default=None),
            "frames_max": max((r["frames"] for r in ok), default=None),
            "round_trips_max": max((r["round_trips"] for r in ok), default=None),
            "records_shipped": sum(r["records_shipped"] for r in ok),
            "fresh_shipped": sum(r["fresh_shipped"] for r in rows),
            "expired_shipped": sum(r["expired_shipped"] for r in rows),
            "rejected_old": sum(r["rejected_old"] for r in ok),
            "agree_newer": all(r["agree_newer"] for r in rows),
            "converged": sum(bool(r.get("converged")) for r in ok),
            "wall_ms_max": max(r["wall_ms"] for r in rows),
        }
        case["failures"] = [f for r in rows for f in r["failures"]]


def _mean(values: list[Any]) -> float | None:
    return sum(values) / len(values) if values else None


def run_waste(
    params: WasteParams,
    stream: Stream,
    advance: Callable[[str], None] = lambda what: None,
) -> list[dict[str, Any]]:
    """Every (loss, skew, lag) case, the baseline first at each loss."""
    cases = []
    grid = [(0.0, 0.0)] + [
        (s, lag) for s in params.skews_s for lag in params.lags_s if (s, lag) != (0.0, 0.0)
    ]
    for loss in params.losses:
        for skew, lag in grid:
            advance(f"waste loss={loss:g} skew={skew:g}s lag={lag:g}s")
            cases.append(run_waste_case(stream, params, skew, lag, loss))
    summarize(cases)
    return cases


def grid_size(params: WasteParams) -> int:
    pairs = {(s, lag) for s in params.skews_s for lag in params.lags_s} | {(0.0, 0.0)}
    return len(pairs) * len(params.losses)
