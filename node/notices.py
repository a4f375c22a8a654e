"""What strangers make us log, kept to one line per subject and reason per interval.

Each event is counted (a Prometheus counter labelled by reason) — cheap and bounded —
but logged only once per ``(subject, reason)`` per ``interval_s``: 300 peers that
lack a protocol, or a flood of refused connections, must not flood the log. The
keys are capped (``TokenBuckets``' LRU), so fresh subjects cost bounded memory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from node.limits import TokenBuckets
from node.metrics import Metrics

MAX_SUBJECTS = 10_000


class Notices:
    """Count every event under ``metric{reason=...}``; log it once per subject, reason and interval."""

    def __init__(
        self,
        metrics: Metrics,
        metric: str,
        help: str,
        *,
        interval_s: float,
        now: Callable[[], float],
        logger: logging.Logger,
    ) -> None:
        self.metrics = metrics
        self.metric = metric
        self.help = help
        self.now = now
        self.logger = logger
        self._once = TokenBuckets(1 / interval_s, 1.0, max_keys=MAX_SUBJECTS)

    def count(self, reason: str) -> None:
        """Count ``reason`` without a line (an event nobody needs to read about)."""
        self.metrics.inc(self.metric, reason=reason, help=self.help)

    def note(self, subject: str, reason: str, message: str, *args: object) -> None:
        """Count ``reason``; log ``message % args`` unless this subject logged it lately."""
        self.count(reason)
        if self._once.take(f"{subject}\0{reason}", 1.0, self.now()):
            self.logger.info(message, *args)
