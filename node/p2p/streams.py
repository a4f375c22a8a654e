"""libp2p streams, as the node uses them: our exceptions only, and handlers that cannot
end the process.

``Libp2pStream`` wraps a py-libp2p stream (``INetStream``); ``Libp2pFrames`` gives
length-prefixed frames over one (a varint prefix, as libp2p's msgio), the ``FrameStream``
the sync service drives (``node/framing.py``). Every call maps py-libp2p's errors once
(``node/p2p/errors.py``). py-libp2p 0.8.1 ends the whole ``trio.run`` when a stream
handler raises: ``safe_handler`` resets the stream instead.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

from libp2p.abc import INetStream
from libp2p.io.msgio import VarIntLengthMsgReadWriter
from libp2p.io.utils import read_exactly

from node.p2p.errors import LIBP2P_ERRORS, stream_errors

log = logging.getLogger(__name__)

UNKNOWN_PEER = "unknown"


class Libp2pStream:
    """A stream to or from a peer; fails with ``StreamClosed`` / ``StreamReset``."""

    def __init__(self, stream: INetStream) -> None:
        self.raw = stream

    @property
    def peer_id(self) -> str:
        """The remote peer's id (base58), or "unknown" if the stream lost its connection."""
        return peer_id_of(self.raw)

    async def read(self, n: int) -> bytes:
        """Up to ``n`` bytes; b"" at the end of the stream."""
        with stream_errors():
            return await self.raw.read(n)

    async def write(self, data: bytes) -> None:
        with stream_errors():
            await self.raw.write(data)

    async def close(self) -> None:
        """Close our side; a stream already gone is nothing to close."""
        with contextlib.suppress(*LIBP2P_ERRORS):
            await self.raw.close()

    async def reset(self) -> None:
        """Reset the stream (it may be gone already: nothing to do then)."""
        with contextlib.suppress(*LIBP2P_ERRORS):
            await self.raw.reset()

    def frames(self, max_frame: int) -> Libp2pFrames:
        return Libp2pFrames(self.raw, max_frame)


class Libp2pFrames:
    """Length-prefixed frames over a py-libp2p stream (``node.framing.FrameStream``)."""

    def __init__(self, stream: INetStream, max_frame: int) -> None:
        self.stream = stream
        self._rw = VarIntLengthMsgReadWriter(stream, max_msg_size=max_frame)

    async def read_frame(self) -> bytes:
        return await self.read_body(await self.read_length())

    async def read_length(self) -> int:
        with stream_errors():  # over the limit: FrameTooLarge, before any of the body is read
            size: int = await self._rw.next_msg_len()
        return size

    async def read_body(self, size: int) -> bytes:
        with stream_errors():
            data: bytes = await read_exactly(self.stream, size)
        return data

    async def write_frame(self, data: bytes) -> None:
        with stream_errors():
            await self._rw.write_msg(data)

    async def aclose(self) -> None:
        with contextlib.suppress(*LIBP2P_ERRORS):  # an already-reset stream: nothing to do
            await self.stream.close()


StreamHandler = Callable[[Libp2pStream], Awaitable[None]]
RawHandler = Callable[[INetStream], Awaitable[None]]


def safe_handler(name: str, handler: StreamHandler, on_error: Callable[[str], None]) -> RawHandler:
    """py-libp2p's handler for ``handler``: an exception ends that stream, never the process."""

    async def wrapped(stream: INetStream) -> None:
        try:
            await handler(Libp2pStream(stream))
        except Exception as exc:  # must never raise: py-libp2p would end the process
            log.warning("%s handler failed: %s: %s", name, type(exc).__name__, exc)
            on_error(type(exc).__name__)
            await reset_quietly(stream)

    return wrapped


async def reset_quietly(stream: INetStream) -> None:
    """Reset a failed stream, which may be gone already (a handler that must return)."""
    with contextlib.suppress(Exception):
        await stream.reset()


def peer_id_of(stream: INetStream) -> str:
    try:
        return str(stream.muxed_conn.peer_id)
    except AttributeError:
        return UNKNOWN_PEER
