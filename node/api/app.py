"""The FastAPI app over a ``NodeApi``, and hypercorn serving it on trio."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import trio
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from node.api import admin, auth, chats, debug, dm3, events, identity, ops, users, web
from node.api.body_limit import MAX_BODY_BYTES, BodyLimit
from node.api.errors import install_error_handlers
from node.api.events import stream_json
from node.api.interface import NodeApi
from node.api.tail import LogTail
from node.api.web import WEB_DIR

if TYPE_CHECKING:
    from trio_typing import TaskStatus


def create_app(node: NodeApi) -> FastAPI:
    app = FastAPIOffline(  # Swagger UI's files from the package: /docs works offline
        title="chatsync node",
        version="0.1.0",
        description="A chatsync node: signed chat ops in, history, chat lists and status out.",
    )
    app.state.node = node
    app.state.tail = LogTail(node.reads, partial(stream_json, node))  # shared by the streams
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)
    install_error_handlers(app)
    for module in (ops, auth, admin, chats, users, events, identity, debug, dm3, web):
        app.include_router(module.router)
    app.mount("/web", StaticFiles(directory=WEB_DIR), name="web")
    return app


KEEP_ALIVE_S = 75.0


async def serve_http(
    node: NodeApi,
    host_port: tuple[str, int],
    shutdown_trigger: Callable[[], Awaitable[None]],
    *,
    task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    config = HypercornConfig()
    host, port = host_port
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.websocket_max_message_size = 64 * 1024  # a stream's client sends acks only
    # longer than clients keep an idle connection (httpx: 5 s, hypercorn's default here too):
    # a server closing first races a client's next request on that connection, which then
    # fails "disconnected without a response" (the 20-node bench's polls did)
    config.keep_alive_timeout = KEEP_ALIVE_S
    app: Any = create_app(node)  # an ASGI app; hypercorn's type for it is narrower than FastAPI's
    await serve(app, config, shutdown_trigger=shutdown_trigger, task_status=task_status)
