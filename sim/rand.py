"""Deterministic randomness: every draw is a hash of (seed, ids), never a PRNG's hidden state.

A run must come out the same on one executor or fifty, whatever order Spark runs
its tasks in, so no draw may depend on how many draws came before it. Each
decision hashes what identifies it — the seed, a purpose tag and the ids of the
things involved (op, receiver, round, node) — with BLAKE3, or, on the hot path
(one draw per op and receiver), with a SplitMix64 finaliser over a per-op key
that BLAKE3 derived once.
"""

from __future__ import annotations

import blake3

MASK64 = (1 << 64) - 1
_TWO64 = float(1 << 64)


def derive(seed: int, tag: str, *parts: int | bytes | str) -> bytes:
    """32 bytes of BLAKE3 over (seed, tag, parts), each part length-prefixed."""
    hasher = blake3.blake3(seed.to_bytes(8, "big", signed=False) + tag.encode())
    for part in parts:
        if isinstance(part, int):
            data = part.to_bytes(8, "big", signed=True)
        elif isinstance(part, str):
            data = part.encode()
        else:
            data = part
        hasher.update(len(data).to_bytes(4, "big") + data)
    return hasher.digest()


def h64(seed: int, tag: str, *parts: int | bytes | str) -> int:
    """A 64-bit hash of (seed, tag, parts)."""
    return int.from_bytes(derive(seed, tag, *parts)[:8], "big")


def unit(seed: int, tag: str, *parts: int | bytes | str) -> float:
    """A uniform draw in [0, 1) from (seed, tag, parts)."""
    return h64(seed, tag, *parts) / _TWO64


def mix64(key: int, salt: int) -> int:
    """SplitMix64 finaliser of ``key ^ salt``: cheap per-receiver draws from one per-op key."""
    z = (key ^ (salt * 0x9E3779B97F4A7C15)) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def mix_unit(key: int, salt: int) -> float:
    return mix64(key, salt) / _TWO64
