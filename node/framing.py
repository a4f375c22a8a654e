"""Length-prefixed frames over a byte stream, with a maximum frame size.

``FrameStream`` is what the sync service needs: a frame read whole, or in two steps
(``read_length`` then ``read_body``) so a reader can size its patience to the frame
the peer announced. ``TrioFrames`` adapts any trio stream (a u32 prefix) so tests can
run sessions over ``trio.testing.memory_stream_pair`` with the autojump clock; its
errors are mapped once, here, to ``StreamClosed`` (``node/errors.py``); a length over
the limit is ``FrameTooLarge``, raised before any of the frame is read. Over libp2p
the same is ``node.p2p.streams.Libp2pFrames`` (a varint prefix, as libp2p's msgio).
"""

from __future__ import annotations

from typing import Protocol

import trio

from node.errors import TRIO_STREAM_ERRORS, FrameTooLarge, StreamClosed, map_exceptions

__all__ = ["FrameStream", "FrameTooLarge", "StreamClosed", "TrioFrames"]


class FrameStream(Protocol):
    async def read_frame(self) -> bytes: ...

    async def read_length(self) -> int:
        """The next frame's length (FrameTooLarge over the limit)."""
        ...

    async def read_body(self, size: int) -> bytes:
        """The frame whose length ``read_length`` returned."""
        ...

    async def write_frame(self, data: bytes) -> None: ...

    async def aclose(self) -> None: ...


class TrioFrames:
    def __init__(self, stream: trio.abc.Stream, max_frame: int) -> None:
        self.stream = stream
        self.max_frame = max_frame
        self._buffer = bytearray()

    async def _read_exactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            with map_exceptions({TRIO_STREAM_ERRORS: StreamClosed}):
                chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise StreamClosed("end of stream")
            self._buffer += chunk
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    async def read_frame(self) -> bytes:
        return await self.read_body(await self.read_length())

    async def read_length(self) -> int:
        size = int.from_bytes(await self._read_exactly(4), "big")
        if size > self.max_frame:
            raise FrameTooLarge(f"frame of {size} bytes over the limit of {self.max_frame}")
        return size

    async def read_body(self, size: int) -> bytes:
        return await self._read_exactly(size)

    async def write_frame(self, data: bytes) -> None:
        with map_exceptions({TRIO_STREAM_ERRORS: StreamClosed}):
            await self.stream.send_all(len(data).to_bytes(4, "big") + data)

    async def aclose(self) -> None:
        await self.stream.aclose()
