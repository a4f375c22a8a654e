"""``BodyLimit``: request bodies over a size refused with a JSON 413 before the app parses them."""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dm3 import rpc
from node.api.errors import error

MAX_BODY_BYTES = 8 * 1024 * 1024
RPC_PATH = "/rpc"  # node/api/dm3.py


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with a JSON 413 before the app parses them.

    The body is read here (it would be read whole for JSON anyway) and replayed to the app.
    """

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        message = f"request body over {self.max_bytes} bytes"
        too_big = (
            JSONResponse(rpc.error_response(rpc.RpcError(rpc.TOO_BIG, f"Too big: {message}")), 413)
            if scope.get("path") == RPC_PATH  # a dm3 client reads JSON-RPC errors there
            else error(413, "body_too_large", f"{message} (dm3 -32011 Too big)")
        )
        too_big.headers["connection"] = "close"  # the rest of the body is not read
        if self._declared_too_big(scope):
            await too_big(scope, receive, send)
            return
        body = await self._read_body(receive)
        if body is None:  # the client went away
            return
        if len(body) > self.max_bytes:
            await too_big(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    def _declared_too_big(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                return True
        return False

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The body, or as soon as it is over the limit what was read of it; None if the
        client went away."""
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return None
            chunk = msg.get("body", b"")
            size += len(chunk)
            chunks.append(chunk)
            if size > self.max_bytes or not msg.get("more_body", False):
                return b"".join(chunks)
