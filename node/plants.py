"""Planted faults, for ``chatsync chaos`` only (issue 38): bugs a node can be told to have, so
the chaos checker can be shown to catch them. Off by default (``chaos_plant = ""``); a real
node never sets one. Every use is marked ``CHAOS PLANT`` where it takes effect.

* ``ack-before-wal``: the node's writes skip RocksDB's write-ahead log, so an op is
  acknowledged while it lives only in the memtable, and a kill -9 loses it (and the events
  logged with it). A kill cannot lose what reached the WAL file — the page cache outlives the
  process — so this is what acknowledging before the WAL sync looks like to a process kill.
* ``drop-one-in-N`` (N >= 1, e.g. ``drop-one-in-10000``): the writer silently drops the ops
  whose BLAKE3 of their encoding is 0 modulo N, and answers as if it held them already
  (``new`` false), so they are not gossiped either: acknowledged, and on no node.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import blake3

from store.ops import Op, encode_op

ACK_BEFORE_WAL = "ack-before-wal"
_DROP = re.compile(r"drop-one-in-([1-9][0-9]*)")


def check_plant(value: str) -> None:
    """ValueError unless ``value`` is "" or a plant named above."""
    if value not in ("", ACK_BEFORE_WAL) and _DROP.fullmatch(value) is None:
        raise ValueError(
            f"chaos_plant: {value!r} is not one of '', {ACK_BEFORE_WAL!r}, 'drop-one-in-N'"
        )


def drop_every(value: str) -> int:
    """N of ``drop-one-in-N``; 0 for any other value (nothing dropped)."""
    match = _DROP.fullmatch(value)
    return int(match.group(1)) if match else 0


def is_dropped(op: Op, every: int) -> bool:
    digest = blake3.blake3(encode_op(op)).digest(8)
    return every > 0 and int.from_bytes(digest, "big") % every == 0


def apply_dropping(
    ops: list[Op], every: int, apply: Callable[[list[Op]], list[bool]]
) -> list[bool]:
    """``apply`` the ops that are not dropped; per op of ``ops``, whether it changed the store
    (a dropped one: false, as if it were a duplicate)."""
    kept = [not is_dropped(op, every) for op in ops]
    new = iter(apply([op for op, keep in zip(ops, kept, strict=True) if keep]))
    return [next(new) if keep else False for keep in kept]


def skip_wal(db: Any) -> None:
    """``ack-before-wal``: the store's writes no longer go to its WAL (nor sync it)."""
    db.rocks._write_opts.sync = False  # RocksDB refuses a synced write without a WAL
    db.rocks._write_opts.disable_wal = True
