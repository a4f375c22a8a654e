"""Signature checks spread over threads: what a catch-up spends most of its time on.

libsodium's ed25519 verification releases the GIL, so a frame's messages checked
in ``threads`` slices run on as many cores (1.8-1.9x with 2 threads on this 2-core
machine). A sync session hands each TRANSFER frame's messages here
(``SyncConfig.verify_messages``); small frames are checked in the calling thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from store.errors import InvalidInput
from store.records import MsgV1
from sync.protocol import verify_each

MIN_PARALLEL = 64  # fewer messages than this: threads cost more than they save


class ParallelVerifier:
    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._pool = (
            ThreadPoolExecutor(threads, thread_name_prefix="verify") if threads > 1 else None
        )

    def __call__(self, msgs: Sequence[MsgV1]) -> list[InvalidInput | None]:
        if self._pool is None or len(msgs) < MIN_PARALLEL:
            return verify_each(msgs)
        slices = [msgs[i :: self.threads] for i in range(self.threads)]
        results = list(self._pool.map(verify_each, slices))
        # slice i holds messages i, i + threads, ...: interleave the answers back
        out: list[InvalidInput | None] = [None] * len(msgs)
        for i, answers in enumerate(results):
            out[i :: self.threads] = answers
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
