"""Every refusal of the HTTP API as ``{"code", "message"}``: where exceptions become responses.

``code`` is the ``reason`` of the store's ``InvalidInput`` (``decode``, ``truncated``,
``malformed``, ``wrong_length``, ``oversize``, ``too_large``, ``bad_signature``,
``clock_drift``, ``bad_cursor``, ``bad_limit``, ``rate_limited``, ...) or one of the
API's own (``bad_id``, ``bad_base64``, ``user_mismatch``, ``invalid_request``,
``body_too_large``, ``not_found``, ``unknown_chat``, ``method_not_allowed``, ``busy``,
``disk_full``).
Sizes are 413 (dm3: -32011 Too big), well-formed but unacceptable ops (signature, clock
drift, user mismatch, unauthorized membership) 422, a message from a sender removed from
its chat at its stamp 403 (``not_a_member``), an edit or delete the sender may not make 403
(``not_author``, ``not_allowed``; MESSAGES.md), a reference to another chat or a delete
whose claims contradict its target 422 (``ref_other_chat``, ``bad_claims``), an edit,
reaction or re-post of a deleted message 410 (``deleted``), as is an events token this node's
log cannot go on from (``foreign_token``, ``unknown_position``). Who is asking (sign-in,
tokens: ``node/api/auth.py``): 401 ``no_token``, ``bad_token``, ``token_expired`` and the
sign-in codes, 403 ``wrong_user``, ``not_a_member``, ``not_admin``. A read receipt that is another
user's is 403 (``not_your_receipt``); one that is not a receipt, is for another chat than
the URL's, or misstates its message's stamp 422 (``not_a_receipt``, ``wrong_chat``,
``bad_position``); one not ahead of the reader's known position 409 (``receipt_backwards``). An
author over its rate 429, other bad input 400, a full write queue 503 (dm3: -32005 Limit
exceeded), a full disk 507. A message, delete or history of a chat outside this node's scope is
421 ``out_of_scope`` with ``shard`` and ``holders`` (peer ids of nodes that hold it), and so is
the identity of a user this node does not index (``shard`` is then the user shard). A 500 means a bug: it is logged with its traceback. Each
refusal is counted (``api_errors{code}``; bugs ``api_bugs``).
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dm3 import rpc
from node.api.interface import node_of
from node.api.models import ErrorOut
from node.auth import AuthRefused
from node.intake import OutsideScope
from node.limits import StorageFull
from store.errors import InvalidInput

log = logging.getLogger(__name__)

SIZE_REASONS = {"too_large", "oversize", "body_too_large"}
UNPROCESSABLE_REASONS = {
    "bad_signature", "clock_drift", "user_mismatch", "unauthorized", "ref_other_chat", "bad_claims",
    "bad_position", "not_a_receipt", "wrong_chat",
}  # fmt: skip
FORBIDDEN_REASONS = {"not_a_member", "not_author", "not_allowed", "not_your_receipt"}
CONFLICT_REASONS = {"receipt_backwards"}
GONE_REASONS = {"deleted", "foreign_token", "unknown_position"}

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorOut}
    for status in (400, 401, 403, 404, 409, 410, 413, 421, 422, 429, 503, 507)
}


class NotFound(Exception):
    """A well-formed request for something this node does not hold: 404 with ``code``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"code": code, "message": message}, status_code=status)


def status_for(reason: str) -> int:
    if reason in SIZE_REASONS:
        return 413
    if reason == "rate_limited":
        return 429
    if reason in FORBIDDEN_REASONS:
        return 403
    if reason in GONE_REASONS:
        return 410
    if reason in CONFLICT_REASONS:
        return 409
    return 422 if reason in UNPROCESSABLE_REASONS else 400


def describe_validation(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def refused(request: Request, status: int, code: str, message: str) -> JSONResponse:
    node_of(request).metrics.inc("api_errors", code=code, help="HTTP requests refused, by code")
    return error(status, code, message)


async def invalid_input(request: Request, exc: InvalidInput) -> JSONResponse:
    if isinstance(exc, OutsideScope):
        return await misdirected(request, exc)
    message = str(exc)
    if exc.reason in SIZE_REASONS:
        message += " (dm3 -32011 Too big)"
    return refused(request, status_for(exc.reason), exc.reason, message)


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    return refused(request, 422, "invalid_request", describe_validation(exc))


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return refused(request, exc.status_code, code, str(exc.detail))


async def auth_refused(request: Request, exc: AuthRefused) -> JSONResponse:
    return refused(request, exc.status, exc.code, str(exc))


async def misdirected(request: Request, exc: OutsideScope) -> JSONResponse:
    """421: the chat (or the user's identity) is outside this node's scope; ``holders``
    names nodes that hold it."""
    node = node_of(request)
    if exc.chat_id is not None:
        found = await trio.to_thread.run_sync(node.holders_of, exc.chat_id)
    else:
        assert exc.user_id is not None
        found = await trio.to_thread.run_sync(node.user_holders_of, exc.user_id)
    node.metrics.inc("api_errors", code=exc.reason, help="HTTP requests refused, by code")
    body = {"code": exc.reason, "message": str(exc), "shard": exc.shard, "holders": found}
    return JSONResponse(body, status_code=421)


async def not_found(request: Request, exc: NotFound) -> JSONResponse:
    return refused(request, 404, exc.code, str(exc))


async def busy(request: Request, exc: trio.WouldBlock) -> JSONResponse:
    message = "the write queue is full, retry later (dm3 -32005 Limit exceeded)"
    return refused(request, 503, "busy", message)


async def disk_full(request: Request, exc: StorageFull) -> JSONResponse:
    return refused(request, 507, "disk_full", str(exc))


# a dm3 refusal met outside JSON-RPC (dm3's REST paths: node/api/dm3.py): (status, code)
RPC_AS_HTTP = {
    rpc.NOT_FOUND: (404, "unknown_name"),
    rpc.UNAVAILABLE: (403, "not_a_delivery_service"),
    rpc.LIMIT_EXCEEDED: (429, "rate_limited"),
    rpc.UNAUTHORIZED: (401, "unauthorized"),
    rpc.TOO_BIG: (413, "too_large"),
}


async def dm3_refused(request: Request, exc: rpc.RpcError) -> JSONResponse:
    status, code = RPC_AS_HTTP.get(exc.code, (400, "invalid_input"))
    return refused(request, status, code, exc.message)


async def bug(request: Request, exc: Exception) -> JSONResponse:
    log.exception("%s %s failed", request.method, request.url.path)
    node_of(request).metrics.inc(
        "api_bugs", help="HTTP requests that failed with an unexpected error"
    )
    return error(500, "internal", f"internal error: {type(exc).__name__}")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(InvalidInput, invalid_input)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(NotFound, not_found)  # type: ignore[arg-type]
    app.add_exception_handler(AuthRefused, auth_refused)  # type: ignore[arg-type]
    app.add_exception_handler(trio.WouldBlock, busy)  # type: ignore[arg-type]
    app.add_exception_handler(StorageFull, disk_full)  # type: ignore[arg-type]
    app.add_exception_handler(rpc.RpcError, dm3_refused)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, bug)  # a bug: 500, logged, the node serves on
