"""Signature checks of big sync frames in worker processes: most of what a catch-up costs.

A sync session hands each TRANSFER frame's messages here (``SyncConfig.verify_messages``).
libsodium's ed25519 check releases the GIL, so they were checked on threads first; but the
node's other threads hold the GIL for long stretches (decoding; RocksDB keeps it through a
whole WriteBatch), the checking threads waited for it between signatures, and a catch-up of
1,000,000 messages kept this 2-core machine only ~80 % busy. In worker processes the checks
wait for no one: 52-54 s for that catch-up against 58-66 s with two threads, the machine
95 % busy (the same 4 peers in the same runs).

The workers (``python -m node.signature_worker``, fresh interpreters: the node runs threads,
forking it is unsafe; not multiprocessing, whose resource tracker process would outlive them)
start at the first frame of ``MIN_PARALLEL`` messages or more and exit once none has come
for ``idle_s``: a node at rest has none (~20 MB each while they live). One frame at a time
uses them, split in as many slices; small frames, and every frame with ``processes`` 0, are
checked in the calling thread. A worker that dies (killed, out of memory) costs time, not
correctness: the frame is checked in the calling thread and the next one starts new workers.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, cast

from node.signature_worker import read_frame, write_frame
from store.errors import BadSignature, InvalidInput
from store.ingress import verify_each
from store.records import MsgV1

log = logging.getLogger(__name__)

MIN_PARALLEL = 64  # fewer messages than this: shipping them costs more than it saves
IDLE_S = 10.0  # workers exit after this long without a frame to check
WORKER_MODULE = "node.signature_worker"  # run as python -m: how a worker is told apart


class _Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", WORKER_MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def send(self, value: object) -> None:
        write_frame(cast(IO[bytes], self.proc.stdin), value)

    def receive(self) -> list[str | None]:
        return cast(list[str | None], read_frame(cast(IO[bytes], self.proc.stdout)))

    def stop(self, *, kill: bool = False) -> None:
        """Close its stdin (it exits) and reap it; ``kill``: it may be stuck or dead."""
        if kill:
            self.proc.kill()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass  # a dead worker's pipe: nothing left to flush
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ProcessVerifier:
    def __init__(self, processes: int, idle_s: float = IDLE_S) -> None:
        self.processes = processes
        self.idle_s = idle_s
        self._workers: list[_Worker] = []
        self._using = threading.Lock()  # one frame at a time uses the workers
        self._last_used = 0.0
        self._closed = False
        self._watching = False

    def __call__(self, msgs: Sequence[MsgV1]) -> list[InvalidInput | None]:
        if self.processes < 1 or len(msgs) < MIN_PARALLEL:
            return verify_each(msgs)
        with self._using:
            if self._closed:  # the node is stopping
                return verify_each(msgs)
            try:
                answers = self._check(msgs)
            except (OSError, EOFError, ValueError) as exc:  # a worker died or did not start
                log.warning("signature workers failed (%r): checking this frame here", exc)
                self._stop_workers(kill=True)
                return verify_each(msgs)
            finally:
                self._last_used = time.monotonic()
        # slice i holds messages i, i + n, ...: interleave the answers back
        n = len(answers)
        out: list[InvalidInput | None] = [None] * len(msgs)
        for i, reasons in enumerate(answers):
            out[i::n] = [None if r is None else BadSignature(r) for r in reasons]
        return out

    def running(self) -> bool:
        """Whether the workers are up (they start with a big frame, stop when idle)."""
        return bool(self._workers)

    def close(self) -> None:
        with self._using:
            self._closed = True
            self._stop_workers()

    def _check(self, msgs: Sequence[MsgV1]) -> list[list[str | None]]:
        """Under ``_using``: each worker checks one slice, all at once."""
        if not self._workers:
            self._workers = [_Worker() for _ in range(self.processes)]
            if not self._watching:
                self._watching = True
                threading.Thread(
                    target=self._stop_when_idle, name="verify-idle", daemon=True
                ).start()
        n = len(self._workers)
        for i, worker in enumerate(self._workers):
            worker.send([m.signature_parts() for m in msgs[i::n]])
        return [worker.receive() for worker in self._workers]

    def _stop_workers(self, *, kill: bool = False) -> None:
        workers, self._workers = self._workers, []
        for worker in workers:
            worker.stop(kill=kill)

    def _stop_when_idle(self) -> None:
        """Stops the workers once no frame used them for ``idle_s``; ends with the verifier."""
        while not self._closed:
            time.sleep(min(1.0, self.idle_s / 4))
            if not self._workers or time.monotonic() - self._last_used < self.idle_s:
                continue
            with self._using:
                if time.monotonic() - self._last_used >= self.idle_s:
                    self._stop_workers()
        self._watching = False
