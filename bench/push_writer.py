"""The push benchmark's writer: ``rate`` ops/s posted to one node over HTTP, on a steady schedule.

It runs in a process of its own (``WriterProcess``: a spawned worker, warmed up before the
first load), so the thousand WebSockets of the harness never hold up its clock, nor it theirs.
Every ``tick_ms`` one ``POST /ops`` carries the tick's share of the rate (a late writer merges
the ticks it owes into one POST, up to ``MAX_OPS_PER_POST``), the messages spread round robin
over the authors so no author's rate limit bites. Each message is signed just before its POST
with one HLC clock shared by all authors — its physical ms the wall clock when it was made,
every stamp distinct, so a node's arrival log (``GET /debug/latency?arrivals=1``, keyed by
packed HLC) names each op — and the writer notes when each POST started and when the node
acknowledged it (wall seconds: one clock on one machine).
"""

from __future__ import annotations

import base64
import math
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context

from bench.poster import Poster
from store import HlcClock, MsgV1
from store.ops import op_kind
from store.signing import SigningKey, key_from_seed

MAX_OPS_PER_POST = 1000  # the API takes at most 1,024 ops per request


@dataclass(frozen=True)
class WriterPlan:
    url: str  # the node posted to
    seeds: tuple[bytes, ...]  # the authors' signing key seeds (members of the chat)
    chat_id: bytes
    rate: float  # ops/s
    seconds: float
    tick_ms: int
    start_at: float  # wall s of tick 0 (a writer ready later starts at once)
    payload: int  # bytes per message
    tag: str  # in every payload: which run made it


@dataclass
class WriterResult:
    """Per op, in post order: its id, packed HLC, POST start and acknowledgement (wall s; nan:
    refused or never acknowledged)."""

    ids: list[str] = field(default_factory=list)  # hex
    hlcs: list[int] = field(default_factory=list)
    post_s: list[float] = field(default_factory=list)
    ack_s: list[float] = field(default_factory=list)
    posts: int = 0
    busy: int = 0  # 503 answers (write queue full), retried
    errors: int = 0
    late_ticks: int = 0  # ticks that began more than a tick late
    max_late_s: float = 0.0
    started_at: float = 0.0
    ended_at: float = 0.0
    cpu_s: float = 0.0  # the writer process's CPU over the load

    @property
    def acknowledged(self) -> int:
        return sum(1 for a in self.ack_s if not math.isnan(a))


def run_writer(plan: WriterPlan) -> WriterResult:
    """Offer ``plan.rate`` ops/s for ``plan.seconds``; return what was posted, and when."""
    keys = [key_from_seed(seed) for seed in plan.seeds]
    clock = HlcClock()
    result = WriterResult()
    tick_s = plan.tick_ms / 1000
    ticks = max(1, math.ceil(plan.seconds / tick_s))
    total = round(plan.rate * ticks * tick_s)
    filler = f"{plan.tag} ".encode()
    cpu0 = time.process_time()
    start = max(plan.start_at, time.time())
    result.started_at = start
    made = 0
    k = 0
    poster = Poster(plan.url)
    try:
        while made < total:
            due_at = start + k * tick_s
            wait = due_at - time.time()
            if wait > 0:
                time.sleep(wait)
            elif -wait > tick_s:
                result.late_ticks += 1
                result.max_late_s = max(result.max_late_s, -wait)
            # every tick due by now (at least this one): their ops in one POST
            k = max(k + 1, math.floor((time.time() - start) / tick_s) + 1)
            due = min(total, round(plan.rate * min(k, ticks) * tick_s))
            while made < due:
                count = min(due - made, MAX_OPS_PER_POST)
                _post(poster, plan, keys, clock, filler, made, count, result)
                made += count
    finally:
        poster.close()
    result.busy, result.errors = poster.busy, poster.errors
    result.ended_at = time.time()
    result.cpu_s = time.process_time() - cpu0
    return result


def _post(
    poster: Poster,
    plan: WriterPlan,
    keys: list[SigningKey],
    clock: HlcClock,
    filler: bytes,
    first: int,
    count: int,
    result: WriterResult,
) -> None:
    fragments: list[str] = []
    for n in range(first, first + count):
        body = (filler + b"%08d " % n) * (plan.payload // (len(filler) + 9) + 1)
        msg = MsgV1.create(
            keys[n % len(keys)],
            plan.chat_id,
            clock.now(int(time.time() * 1000)),
            body[: plan.payload],
        )
        data = base64.urlsafe_b64encode(msg.encoded).decode()
        fragments.append(f'{{"kind":{int(op_kind(msg))},"data":"{data}"}}')
        result.ids.append(msg.msg_id.hex())
        result.hlcs.append(msg.hlc.pack())
    started = time.time()
    acked = time.time() if poster.post(fragments) else math.nan
    result.posts += 1
    result.post_s.extend([started] * count)
    result.ack_s.extend([acked] * count)


def _ready() -> bool:
    return True


class WriterProcess:
    """One spawned worker process that runs ``run_writer`` on demand (warmed up: imported)."""

    def __init__(self) -> None:
        self._pool = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"))
        self._pool.submit(_ready).result(timeout=120)

    def run(self, plan: WriterPlan) -> WriterResult:
        return self._pool.submit(run_writer, plan).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> WriterProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
