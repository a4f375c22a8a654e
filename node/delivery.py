"""Stream acknowledgements: each device's delivered position (``store.feed``), kept in memory
and written to the store once a second in one batch for every stream — a thousand streams
acknowledging each frame would otherwise cost a write and a thread hop each — by the node's
one writer (``node/writer.py``), like every write. A crash loses at most the last second of
them: those devices show the message as pending until they ack again."""

from __future__ import annotations

from functools import partial

import trio

from node.writer import DbWriter

FLUSH_S = 1.0


class Acks:
    def __init__(self, writer: DbWriter) -> None:
        self._writer = writer
        self._pending: dict[tuple[bytes, str], int] = {}

    def ack(self, user_id: bytes, device: str, position: int) -> None:
        key = (user_id, device)
        if position > self._pending.get(key, 0):
            self._pending[key] = position

    async def flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, {}
            await self._writer.call(partial(self._writer.db.acknowledge, pending))

    async def run(self) -> None:
        """Write what came in, each second; what is left when cancelled, last."""
        try:
            while True:
                await trio.sleep(FLUSH_S)
                await self.flush()
        finally:
            with trio.CancelScope(shield=True):
                await self.flush()
