"""The retention model the simulator uses until it can call the real retention code.

Kept to this one module so that swapping in ``store``/``node`` retention later
touches nothing else. The model:

* A node's **cutoff** at local time ``now`` is ``now - retention`` rounded down to
  the GC grain ``grain_ms``, but never below ``horizon``, the highest cutoff its
  GC has ever run at (a node remembers how far it has collected, so a clock
  stepping back cannot lower it). The grain matters for cost: with an exact
  ``now - retention``, two replicas that collected a second apart differ by a
  second's worth of messages, and every session between them spends a descent
  on a difference the soft filter then refuses to ship (SYNC.md, "Retention
  hook"). Rounded cutoffs make replicas whose clocks agree collect exactly the
  same messages. ``grain_ms = 1`` is the exact rule.
* **GC** deletes every message whose HLC physical time is ``<= cutoff`` from the
  replica and takes it out of the message tree (``MerkleTree.remove``); the
  horizon moves up to the cutoff.
* **Soft filter**: sessions run with ``SyncConfig(cutoff_ms=cutoff)`` (the
  protocol neither lists, ships nor accepts older messages) and gossip ingress
  refuses messages at or below the cutoff.
* A message at or below a node's horizon that gets stored again is
  **resurrected**; the checker counts those.
"""

from __future__ import annotations

from typing import Protocol


class Collectable(Protocol):
    horizon: int

    def collect_messages(self, cutoff_ms: int) -> int: ...


def cutoff(now_ms: int, retention_ms: int, horizon: int, grain_ms: int = 1) -> int:
    raw = now_ms - retention_ms
    return max(raw - raw % grain_ms, horizon)


def too_old(physical_ms: int, cutoff_ms: int) -> bool:
    return physical_ms <= cutoff_ms


def run_gc(replica: Collectable, now_ms: int, retention_ms: int, grain_ms: int = 1) -> int:
    """One GC run at local time ``now_ms``: delete aged messages, raise the horizon."""
    limit = cutoff(now_ms, retention_ms, replica.horizon, grain_ms)
    removed = replica.collect_messages(limit)
    replica.horizon = limit
    return removed
