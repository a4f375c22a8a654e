"""The C allocator of a long-running node process: its settings and its figures (glibc only;
elsewhere a no-op and no figures). ``chatsync node run`` applies them; an embedding program
decides for its own process.

- glibc raises its mmap threshold to the size of the largest block freed so far (up to
  32 MiB) and from then on serves such blocks from the heap, where the holes between live
  blocks stay. A node frees many blocks of a few hundred KiB (HTTP bodies, gossip messages of
  up to 1,024 ops, RocksDB's write batches): a lone node ingesting 100,000 messages over HTTP
  held 42 MB of free heap (``fordblks``) and grew +41 MB; with the threshold pinned at
  128 KiB, +17 MB.
- Each thread that allocates gets an arena of its own (up to 8 per core), each with its own
  holes: the sync path (signatures checked in worker threads) left 31-95 MB free in a
  300,000-message catch-up, 9 MB with one arena.
- Free pages inside the heap are resident until ``malloc_trim`` gives them back: every 30 s
  when 16 MB or more are free.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from functools import cache

import trio

# mallopt's parameters (malloc.h); setting the threshold also ends its dynamic raising
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 128 * 1024
TRIM_INTERVAL_S = 30.0
TRIM_MIN_FREE_BYTES = 16 * 1024 * 1024


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


@cache
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallinfo2.restype = _Mallinfo2  # glibc >= 2.33; AttributeError elsewhere
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


def tune_allocator(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Blocks of ``threshold_bytes`` and more served by mmap, for good, and one arena for all
    threads. Call it once, before the threads start: blocks already in the heap stay there.
    True when glibc took both settings."""
    libc = _glibc()
    return (
        libc is not None
        and libc.mallopt(M_MMAP_THRESHOLD, threshold_bytes) == 1
        and libc.mallopt(M_ARENA_MAX, 1) == 1
    )


def trim_heap() -> bool:
    """Give the free pages inside the heap back to the system (``malloc_trim(0)``)."""
    libc = _glibc()
    return libc is not None and libc.malloc_trim(0) == 1


def c_heap_usage() -> dict[str, int]:
    """Bytes of the C allocator, all arenas: in use, free inside the heap (held, not given
    back), and in blocks of their own mapping. Empty without glibc."""
    libc = _glibc()
    if libc is None:
        return {}
    info = libc.mallinfo2()
    return {"c_heap_used": info.uordblks, "c_heap_free": info.fordblks, "c_mapped": info.hblkhd}


def rss_bytes() -> int | None:
    """Resident set size of this process (Linux ``/proc``); None elsewhere."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


async def trim_heap_periodically(
    interval_s: float = TRIM_INTERVAL_S, min_free_bytes: int = TRIM_MIN_FREE_BYTES
) -> None:
    """Every ``interval_s``, give the heap's free pages back if at least ``min_free_bytes``
    are free in it. In a worker thread: it holds the allocator's lock for a few ms."""
    while True:
        await trio.sleep(interval_s)
        if c_heap_usage().get("c_heap_free", 0) >= min_free_bytes:
            await trio.to_thread.run_sync(trim_heap)
