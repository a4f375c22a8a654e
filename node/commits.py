"""Wakes the tasks that stream events (``node/api/events.py``) when the store logs some.

The store tells its listeners the newest event position after each write that logged
events, from whatever thread wrote (the writer's worker thread, a sync session's, the
GC's): ``CommitSignal`` hands that over to trio with the run's token, and every task
waiting past an older position wakes. The position is read from the store after the
write, so a wake-up is never lost between a check and a wait.
"""

from __future__ import annotations

import contextlib

import trio

from store.events import EventLog


class CommitSignal:
    def __init__(self, log: EventLog, token: trio.lowlevel.TrioToken) -> None:
        self._log = log
        self._token = token
        self._changed = trio.Event()
        log.add_listener(self._from_writer)

    def _from_writer(self, position: int) -> None:
        with contextlib.suppress(trio.RunFinishedError):  # shutting down: nobody waits
            self._token.run_sync_soon(self._wake)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_past(self, position: int) -> None:
        """Return once the log holds an event after ``position``."""
        while True:
            changed = self._changed
            if self._log.last_position > position:
                return
            await changed.wait()
