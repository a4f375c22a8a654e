"""``--trace-out``: a node records the ops its clients submit as a simulator trace (SIM.md).

Only ops that were valid and new here are recorded, at the node's wall-clock time,
as node 0 of a one-node trace; ``chatsync sim merge`` joins several nodes'
recordings into one trace that ``chatsync sim run`` replays. Ops a node received
from peers are not recorded: they are some other node's recording.

A Parquet file is readable only once its footer is written (``close``, at a clean
shutdown). A node that restarts carries the events of its earlier file over into
the new one; a file left unreadable by a crash (kill -9) is moved aside as
``*.broken`` and recording starts afresh.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from node.config import NodeConfig
from store import trace as tr
from store.ops import Op

log = logging.getLogger(__name__)

KEEP_FOREVER_MS = 100 * 365 * 86_400_000  # retention_days = 0


class OpRecorder:
    def __init__(self, path: str | Path, config: NodeConfig, now_ms: int) -> None:
        self.path = Path(path)
        earlier = self._earlier_events()
        header = tr.TraceHeader(
            nodes=1,
            source="recorded",
            start_ms=now_ms,
            max_offset_ms=config.max_offset_ms,
            retention_ms=int(config.retention_days * 86_400_000) or KEEP_FOREVER_MS,
            anti_entropy_ms=max(1, int(config.sync_interval_s * 1000)),
            command=f"chatsync node run --data {config.data} --trace-out {self.path}",
        )
        self._writer = tr.TraceWriter(self.path, header)
        for row in earlier:
            t_ms, node = row.pop("t_ms"), row.pop("node")
            row.pop("seq")
            self._writer.op_row(t_ms, node, row)
        self.recorded = 0

    def _earlier_events(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        try:
            rows: list[dict[str, Any]] = tr.read_trace(self.path).table.to_pylist()
        except Exception as exc:  # no footer (the node was killed), or not a trace at all
            broken = self.path.with_suffix(self.path.suffix + ".broken")
            log.warning("trace %s unreadable (%s): moved to %s", self.path, exc, broken)
            self.path.replace(broken)
            return []
        log.info("trace %s: continuing after its %d events", self.path, len(rows))
        return rows

    def record(self, now_ms: int, ops: list[Op]) -> None:
        for op in ops:
            self._writer.op(now_ms, 0, op)
        self.recorded += len(ops)

    def close(self) -> None:
        self._writer.close()
        log.info("trace %s: %d ops recorded", self.path, self.recorded)
