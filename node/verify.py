"""Signature checks of big sync frames in worker processes: most of what a catch-up costs.

A sync session hands each TRANSFER frame's messages here (``SyncConfig.verify_messages``).
libsodium's ed25519 check releases the GIL, so they were checked on threads first; but the
node's other threads hold the GIL for long stretches (decoding; RocksDB keeps it through a
whole WriteBatch), the checking threads waited for it between signatures, and a catch-up of
1,000,000 messages kept this 2-core machine only ~80 % busy. In worker processes the checks
wait for no one: 52-54 s for that catch-up against 58-66 s with two threads, the machine
95 % busy (the same 4 peers in the same runs).

The workers are spawned (the node runs threads: forking it is unsafe) at the first frame of
``MIN_PARALLEL`` messages or more, and exit once none has come for ``idle_s``: a node at rest
has none (~20 MB each while they live). Small frames are checked in the calling thread. A
worker that dies (killed, out of memory) costs time, not correctness: the frame is checked
in the calling thread and the next one starts new workers.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from store.errors import BadSignature, InvalidInput
from store.records import MsgV1, SignatureParts, check_signature
from sync.protocol import verify_each

log = logging.getLogger(__name__)

MIN_PARALLEL = 64  # fewer messages than this: shipping them costs more than it saves
IDLE_S = 10.0  # workers exit after this long without a frame to check


def check_signatures(parts: list[SignatureParts]) -> list[str | None]:
    """In a worker: per message, why its signature is refused (None: it verifies)."""
    out: list[str | None] = []
    for item in parts:
        try:
            check_signature(*item)
            out.append(None)
        except BadSignature as exc:
            out.append(str(exc))
    return out


class ProcessVerifier:
    def __init__(self, processes: int, idle_s: float = IDLE_S) -> None:
        self.processes = processes
        self.idle_s = idle_s
        self._pool: ProcessPoolExecutor | None = None
        self._busy = 0  # calls using the pool now
        self._last_used = 0.0
        self._closed = False
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)

    def __call__(self, msgs: Sequence[MsgV1]) -> list[InvalidInput | None]:
        if self.processes < 2 or len(msgs) < MIN_PARALLEL:
            return verify_each(msgs)
        pool = self._acquire()
        if pool is None:  # closed: the node is stopping
            return verify_each(msgs)
        try:
            n = self.processes * 2  # a few slices each: one slow slice does not hold the frame
            slices = [[m.signature_parts() for m in msgs[i::n]] for i in range(n)]
            answers = list(pool.map(check_signatures, slices))
        except BrokenProcessPool as exc:
            log.warning("signature workers failed (%s): checking this frame here", exc)
            self._discard(pool)
            return verify_each(msgs)
        finally:
            self._release()
        # slice i holds messages i, i + n, ...: interleave the answers back
        out: list[InvalidInput | None] = [None] * len(msgs)
        for i, reasons in enumerate(answers):
            out[i::n] = [None if r is None else BadSignature(r) for r in reasons]
        return out

    def running(self) -> bool:
        """Whether the workers are up (they start with a big frame, stop when idle)."""
        with self._lock:
            return self._pool is not None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            self._wake.notify_all()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _acquire(self) -> ProcessPoolExecutor | None:
        with self._lock:
            if self._closed:
                return None
            if self._pool is None:
                context = multiprocessing.get_context("spawn")
                self._pool = ProcessPoolExecutor(self.processes, mp_context=context)
                threading.Thread(
                    target=self._stop_when_idle, name="verify-idle", daemon=True
                ).start()
            self._busy += 1
            self._last_used = time.monotonic()
            return self._pool

    def _release(self) -> None:
        with self._lock:
            self._busy -= 1
            self._last_used = time.monotonic()

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
                self._wake.notify_all()
        pool.shutdown(wait=False, cancel_futures=True)

    def _stop_when_idle(self) -> None:
        """The pool's watcher: shuts it down once nothing used it for ``idle_s``."""
        with self._lock:
            pool = self._pool
            while self._pool is pool and pool is not None:
                idle = time.monotonic() - self._last_used
                if self._busy == 0 and idle >= self.idle_s:
                    self._pool = None
                    break
                self._wake.wait(timeout=max(0.05, self.idle_s - idle))
            else:
                return  # closed or discarded: whoever did it shut the pool down
        pool.shutdown(wait=True)
