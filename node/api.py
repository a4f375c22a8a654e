"""The HTTP API (FastAPI on hypercorn's trio worker). Errors are JSON: {"code", "message"}."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from pydantic import BaseModel, Field

from store.errors import InvalidInput
from store.ops import Op, decode_op

if TYPE_CHECKING:
    from trio_typing import TaskStatus

    from node.node import Node


MAX_OPS_PER_REQUEST = 1024


class OpIn(BaseModel):
    kind: int = Field(
        description="1 PutMessage (MsgV1), 2 MembershipOp, 3 PutIdentity (IdentityRecord)"
    )
    data: str = Field(description="the op's canonical CBOR, URL-safe base64")


class OpsIn(BaseModel):
    ops: list[OpIn] = Field(max_length=MAX_OPS_PER_REQUEST)


class PeerIn(BaseModel):
    peer_id: str = Field(max_length=100)


def error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"code": code, "message": message}, status_code=status)


def b64decode(value: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError) as exc:
        raise InvalidInput(f"not URL-safe base64: {exc}", reason="bad_base64") from None


def create_app(node: Node) -> FastAPI:
    app = FastAPI(title="chatsync node", version="0.1.0")

    @app.exception_handler(InvalidInput)
    async def invalid_input(request: Request, exc: InvalidInput) -> JSONResponse:
        return error(413 if exc.reason in {"too_large", "oversize"} else 400, exc.reason, str(exc))

    @app.post("/ops", status_code=201)
    async def submit_ops(body: OpsIn) -> dict[str, Any]:
        """Submit signed ops; answered once written (durable mode: once in the WAL)."""
        ops: list[Op] = [
            decode_op(op.kind, b64decode(op.data), max_payload=node.config.max_payload)
            for op in body.ops
        ]
        new = await node.submit_ops(ops)
        return {"accepted": len(ops), "new": new}

    @app.post("/admin/block")
    async def block_peer(body: PeerIn) -> dict[str, Any]:
        """Partition switch: drop this peer's traffic (gossip, sync, connections)."""
        assert node.peers is not None
        await node.peers.block(body.peer_id)
        return {"blocked": sorted(node.peers.blocked)}

    @app.post("/admin/unblock")
    async def unblock_peer(body: PeerIn) -> dict[str, Any]:
        assert node.peers is not None
        node.peers.unblock(body.peer_id)
        return {"blocked": sorted(node.peers.blocked)}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/status")
    async def status() -> dict[str, Any]:
        return node.status()

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> str:
        return node.metrics.render()

    return app


async def serve_http(
    node: Node,
    shutdown_trigger: Callable[[], Awaitable[None]],
    *,
    task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    config = HypercornConfig()
    host, port = node.config.http_host_port
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    app: Any = create_app(node)  # an ASGI app; hypercorn's type for it is narrower than FastAPI's
    await serve(app, config, shutdown_trigger=shutdown_trigger, task_status=task_status)
