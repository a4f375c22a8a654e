"""Hybrid logical clock (Kulkarni, Demirbas et al., 2014).

A stamp is 48 bits of physical milliseconds and a 16-bit logical counter,
packed into one u64 as ``physical_ms << 16 | logical``. Its big-endian bytes
therefore sort in time order, which the RocksDB key layouts depend on.

The clock never reads the wall clock: every call takes ``physical_ms`` from the
caller (the node passes ``time.time()``, the simulator a virtual clock, tests
whatever they like).

Logical overflow: when 65,535 events share one millisecond the clock moves its
physical part one millisecond ahead and restarts the counter, so stamps stay
strictly increasing and still fit 64 bits. The borrowed millisecond is repaid
as soon as real time catches up.
"""

from __future__ import annotations

from dataclasses import dataclass

from store.errors import ClockDriftError

PHYSICAL_BITS = 48
LOGICAL_BITS = 16
MAX_PHYSICAL = (1 << PHYSICAL_BITS) - 1
MAX_LOGICAL = (1 << LOGICAL_BITS) - 1
MAX_PACKED = (1 << 64) - 1

# The Status protocol discards clocks more than 120 s ahead; a chat network of
# phones and laptops has worse clocks than a datacenter (CockroachDB: 500 ms).
DEFAULT_MAX_OFFSET_MS = 120_000

# The virtual epoch of simulated traces and benchmarks (2026-01-01T00:00Z): a fixed clock
# keeps their runs reproducible.
VIRTUAL_EPOCH_MS = 1_767_225_600_000


@dataclass(frozen=True, order=True, slots=True)
class Hlc:
    """One HLC stamp. Ordering is (physical_ms, logical), same as the packed u64."""

    physical_ms: int
    logical: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.physical_ms <= MAX_PHYSICAL:
            raise ValueError(f"HLC physical_ms out of range: {self.physical_ms}")
        if not 0 <= self.logical <= MAX_LOGICAL:
            raise ValueError(f"HLC logical out of range: {self.logical}")

    def pack(self) -> int:
        return (self.physical_ms << LOGICAL_BITS) | self.logical

    @classmethod
    def unpack(cls, packed: int) -> Hlc:
        if not 0 <= packed <= MAX_PACKED:
            raise ValueError(f"packed HLC out of u64 range: {packed}")
        return cls(packed >> LOGICAL_BITS, packed & MAX_LOGICAL)

    def to_bytes(self) -> bytes:
        return self.pack().to_bytes(8, "big")

    @classmethod
    def from_bytes(cls, data: bytes) -> Hlc:
        if len(data) != 8:
            raise ValueError(f"packed HLC must be 8 bytes, got {len(data)}")
        return cls.unpack(int.from_bytes(data, "big"))


HLC_ZERO = Hlc(0, 0)


def _advance(physical_ms: int, logical: int) -> Hlc:
    """(physical, logical + 1), carrying into physical on counter overflow."""
    if logical < MAX_LOGICAL:
        return Hlc(physical_ms, logical + 1)
    if physical_ms >= MAX_PHYSICAL:
        raise OverflowError("HLC exhausted: physical and logical parts both at maximum")
    return Hlc(physical_ms + 1, 0)


class HlcClock:
    """The local clock of one node. Not thread-safe: one owner ticks it."""

    def __init__(self, *, max_offset_ms: int = DEFAULT_MAX_OFFSET_MS, last: Hlc = HLC_ZERO):
        if max_offset_ms < 0:
            raise ValueError("max_offset_ms must be >= 0")
        self.max_offset_ms = max_offset_ms
        self.last = last

    def now(self, physical_ms: int) -> Hlc:
        """Send/local-event rule: a stamp greater than every stamp seen so far."""
        last = self.last
        physical_ms = min(physical_ms, MAX_PHYSICAL)  # clamp first: past 48 bits, tick logically
        if physical_ms > last.physical_ms:
            stamp = Hlc(physical_ms, 0)
        else:
            stamp = _advance(last.physical_ms, last.logical)
        self.last = stamp
        return stamp

    def check_drift(self, remote: Hlc, physical_ms: int) -> None:
        """Raise ClockDriftError if ``remote`` is more than max_offset ahead of ``physical_ms``."""
        ahead = remote.physical_ms - physical_ms
        if ahead > self.max_offset_ms:
            raise ClockDriftError(
                f"remote HLC {remote.physical_ms} ms is {ahead} ms ahead of local time "
                f"(max offset {self.max_offset_ms} ms)"
            )

    def update(self, remote: Hlc, physical_ms: int) -> Hlc:
        """Receive rule: merge a remote stamp. Leaves the clock unchanged on drift."""
        self.check_drift(remote, physical_ms)
        last = self.last
        top = max(last.physical_ms, remote.physical_ms, physical_ms)
        if top == last.physical_ms and top == remote.physical_ms:
            stamp = _advance(top, max(last.logical, remote.logical))
        elif top == last.physical_ms:
            stamp = _advance(top, last.logical)
        elif top == remote.physical_ms:
            stamp = _advance(top, remote.logical)
        else:
            stamp = Hlc(top, 0)
        self.last = stamp
        return stamp
