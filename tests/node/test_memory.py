"""node/memory.py: glibc's settings taken, and what they change (in a fresh process each:
the settings are process-wide and a heap already shaped stays so)."""

from __future__ import annotations

import json
import subprocess
import sys

from node.memory import c_heap_usage, rss_bytes, trim_heap

# Every script below starts with this. ``holes`` allocates ``count`` blocks of ``size`` bytes,
# each followed by a small block that stays, and frees the big ones: the small ones keep the
# heap from shrinking from its top.
HOLES_BETWEEN_SMALL_BLOCKS = """
import ctypes
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def holes(count, size):
    big, small = [], []
    for _ in range(count):
        big.append(libc.malloc(size))
        small.append(libc.malloc(64))
        ctypes.memset(big[-1], 1, size)
    for block in big:
        libc.free(block)
    return small
"""

# Frees one 256 KiB block first (glibc raises its mmap threshold above it): without the
# pinned threshold the 400 big blocks are cut from the heap and their space stays there,
# free but held.
CHURN = """
import json, sys
from node.memory import c_heap_usage, tune_allocator
if sys.argv[1] == "tuned":
    assert tune_allocator()
libc.free(libc.malloc(256 * 1024))
kept = holes(400, 256 * 1024)
print(json.dumps(c_heap_usage()))
"""


# 100 MB of 64 KiB holes (under the threshold: in the heap): only a trim gives their pages back.
HOLES = """
import json, trio
from node.memory import c_heap_usage, rss_bytes, trim_heap_periodically
kept = holes(1600, 64 * 1024)
before = rss_bytes()
async def one_round():
    with trio.move_on_after(0.5):
        await trim_heap_periodically(interval_s=0.1, min_free_bytes=16 * 1024 * 1024)
trio.run(one_round)
print(json.dumps({"before": before, "after": rss_bytes(), **c_heap_usage()}))
"""


def run_script(script: str, *args: str) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", HOLES_BETWEEN_SMALL_BLOCKS + script, *args],
        capture_output=True,
        text=True,
        check=True,
    )
    figures: dict[str, int] = json.loads(out.stdout)
    return figures


def churn(mode: str) -> dict[str, int]:
    return run_script(CHURN, mode)


def test_pinned_threshold_keeps_freed_big_blocks_out_of_the_heap() -> None:
    untuned, tuned = churn("default"), churn("tuned")
    assert untuned["c_heap_free"] > 50 * 1024 * 1024  # most of 400 x 256 KiB held, free
    assert tuned["c_heap_free"] < 4 * 1024 * 1024  # unmapped on free


def test_the_trim_loop_gives_free_heap_pages_back() -> None:
    figures = run_script(HOLES)
    assert figures["c_heap_free"] > 90 * 1024 * 1024  # still free: the heap keeps its holes
    assert figures["before"] - figures["after"] > 80 * 1024 * 1024  # but not resident


def test_figures_and_trim_in_this_process() -> None:
    heap = c_heap_usage()
    assert set(heap) == {"c_heap_used", "c_heap_free", "c_mapped"}
    assert heap["c_heap_used"] > 0
    rss = rss_bytes()
    assert rss is not None and rss > heap["c_heap_used"] // 2
    trim_heap()  # answers whether pages were released; either is fine here
