"""The node's one clock: trio's.

Everything in ``node/`` that needs the time asks trio, through a ``Clock``:

* ``now()`` — trio's clock in seconds: deadlines, rate buckets, penalties, durations;
* ``wall_ms()`` — milliseconds since the Unix epoch, for what meets HLC stamps (the
  drift checks, sync sessions, retention cutoffs, traces): the wall-clock time fixed
  once when the clock is made (``Clock.system()``), plus trio's time since.

So a test on trio's ``MockClock`` (``autojump_clock``) moves every timer, bucket and
wall-clock reading of the node together, and nothing here calls ``time.time()`` but
``Clock.system``. A ``Clock`` is made inside ``trio.run`` and holds that run's clock, so
it can also be read from the node's worker threads (a sync session applying records
logs their arrival there). A node's wall clock therefore does not follow later corrections of the
system clock (NTP steps): it runs at trio's monotonic pace from the moment it started.
"""

from __future__ import annotations

import time

import trio


class Clock:
    """``epoch_ms``: the wall-clock milliseconds at trio time 0. ``offset_ms``: a deliberate
    skew added to every ``wall_ms()`` (the simulator's clock faults; a node's ``clock_offset_ms``,
    0 but in ``chatsync chaos``)."""

    def __init__(self, epoch_ms: int, offset_ms: int = 0) -> None:
        self.epoch_ms = epoch_ms
        self.offset_ms = offset_ms
        self._trio_clock = trio.lowlevel.current_clock()  # readable from worker threads too

    @classmethod
    def system(cls, offset_ms: int = 0) -> Clock:
        """A clock whose ``wall_ms()`` is the system's wall clock now (inside ``trio.run``),
        plus ``offset_ms``."""
        return cls(round(time.time() * 1000 - trio.current_time() * 1000), offset_ms)

    def now(self) -> float:
        """Trio's clock, in seconds (monotonic)."""
        return self._trio_clock.current_time()

    def wall_ms(self) -> int:
        """Milliseconds since the Unix epoch, as this node reads them."""
        return self.epoch_ms + self.offset_ms + round(self.now() * 1000)

    def seconds_until(self, wall_ms: int) -> float:
        """Seconds from now until ``wall_ms`` on this clock (negative once it has passed)."""
        return (wall_ms - self.wall_ms()) / 1000
