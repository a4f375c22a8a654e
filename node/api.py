"""The HTTP API (FastAPI on hypercorn's trio worker). Errors are JSON: {"code", "message"}.

Endpoints (ids are lowercase hex in paths and JSON; bytes are URL-safe base64):

=======  ======================================  ===================================================
POST     /ops                                    submit signed ops -> 201 {"accepted", "new"}
GET      /chats/{chat}/messages                  history page: ?cursor=&limit=1..200&direction=
GET      /chats/{chat}/members                   active members with role and added_at
GET      /users/{user}/chats                     the user's chat list, newest first, with unread
GET/PUT  /users/{user}/chats/{chat}/read         read progress (local to this node, not signed)
GET/PUT  /identity/{user}                        the user's identity record (PUT: the signed record)
POST     /admin/block, /admin/unblock            partition switch {"peer_id"}
GET      /status, /metrics, /health              node state, Prometheus text, liveness
GET      /openapi.json, /docs                    the schema and its browser
=======  ======================================  ===================================================

Errors: every refusal is ``{"code", "message"}``. ``code`` is the ``reason`` of the
store's ``InvalidInput`` (``decode``, ``truncated``, ``malformed``, ``wrong_length``,
``oversize``, ``too_large``, ``bad_signature``, ``clock_drift``, ``bad_cursor``,
``bad_limit``, ...) or one of the API's own (``bad_id``, ``bad_base64``,
``user_mismatch``, ``invalid_request``, ``body_too_large``, ``not_found``, ``busy``).
Sizes are 413 (dm3: -32011 Too big), well-formed but unacceptable ops (signature,
clock drift, user mismatch, unauthorized membership) 422, other bad input 400, a full write queue 503
(dm3: -32005 Limit exceeded). A 500 means a bug: it is logged with its traceback.
Nothing is written when a request is refused, and the node keeps running.

Reads run in a worker thread (``trio.to_thread``) because RocksDB calls block.
Read progress is written outside the op pipeline (it is a local convenience, never
synced or signed) but under the writer's ``db_lock``, so there is still one writer.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from node.debug_api import register_debug_routes
from node.limits import StorageFull
from store.chatdb import ChatDb
from store.errors import InvalidInput
from store.hlc import Hlc
from store.inbox import ChatListItem
from store.keys import CHAT_ID_LEN, USER_ID_LEN
from store.messages import DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT, Direction, StoredMessage
from store.ops import Op, decode_op
from store.records import ChatKind, IdentityRecord, MemberInfo, Role, decode_identity_record

if TYPE_CHECKING:
    from trio_typing import TaskStatus

    from node.node import Node

log = logging.getLogger(__name__)

MAX_OPS_PER_REQUEST = 1024
MAX_BODY_BYTES = 8 * 1024 * 1024
SIZE_REASONS = {"too_large", "oversize", "body_too_large"}
UNPROCESSABLE_REASONS = {"bad_signature", "clock_drift", "user_mismatch", "unauthorized"}


# --- request and response bodies ---------------------------------------------------------


class OpIn(BaseModel):
    kind: int = Field(
        description="1 PutMessage (MsgV1), 2 MembershipOp, 3 PutIdentity (IdentityRecord)"
    )
    data: str = Field(description="the op's canonical CBOR, URL-safe base64")


class OpsIn(BaseModel):
    ops: list[OpIn] = Field(max_length=MAX_OPS_PER_REQUEST)


class OpsOut(BaseModel):
    accepted: int = Field(description="ops in the request (all valid, all written)")
    new: list[bool] = Field(description="per op: did it change this node's store")


class PeerIn(BaseModel):
    peer_id: str = Field(max_length=100)


class HlcOut(BaseModel):
    physical_ms: int
    logical: int

    @classmethod
    def of(cls, hlc: Hlc) -> HlcOut:
        return cls(physical_ms=hlc.physical_ms, logical=hlc.logical)


class MessageOut(BaseModel):
    id: str = Field(description="message id: BLAKE3 of the record, hex")
    chat_id: str
    sender: str = Field(description="user id, hex")
    hlc: HlcOut
    kind: int = Field(description="0 new, 1 edit, 2 reply, 3 reaction, 4 read receipt, 5 delete")
    payload: str = Field(description="opaque (for DMs: encrypted) bytes, URL-safe base64")
    ref: str | None = Field(description="id of the message referred to, hex (null for new)")
    seq: int = Field(description="this node's local sequence number in the chat")
    author_key: str = Field(description="ed25519 public key of the sender, hex")
    sig: str = Field(description="ed25519 signature, URL-safe base64")


class HistoryOut(BaseModel):
    chat_id: str
    messages: list[MessageOut]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null: done")


class ChatEntryOut(BaseModel):
    chat_id: str
    kind: str = Field(description="dm, group or channel")
    last_ts: int = Field(description="physical ms of the newest message")
    last_msg_id: str
    last_sender: str
    last_seq: int
    preview: str
    unread: int = Field(description="last_seq minus this user's read progress (local counts)")


class ChatsOut(BaseModel):
    user_id: str
    chats: list[ChatEntryOut]
    next_cursor: str | None


class ReadIn(BaseModel):
    seq: int = Field(ge=0, lt=1 << 32, description="local seq the user has read up to")


class ReadOut(BaseModel):
    user_id: str
    chat_id: str
    seq: int = Field(description="read progress (only ever moves forward)")
    last_seq: int = Field(description="the chat's newest local seq")
    unread: int
    moved: bool | None = Field(default=None, description="PUT only: did the progress move")


class MemberOut(BaseModel):
    user_id: str
    role: str
    added_at: HlcOut


class MembersOut(BaseModel):
    chat_id: str
    members: list[MemberOut]


class IdentityIn(BaseModel):
    data: str = Field(description="the signed IdentityRecord's canonical CBOR, URL-safe base64")


class IdentityOut(BaseModel):
    user_id: str
    hlc: HlcOut
    blob: str = Field(description="the IdentityDoc (keys + signature), URL-safe base64")


class IdentityPutOut(BaseModel):
    user_id: str
    new: bool = Field(description="did the record replace what this node had")


class ErrorOut(BaseModel):
    code: str
    message: str


ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorOut} for status in (400, 404, 413, 422, 429, 503, 507)
}


# --- helpers -------------------------------------------------------------------------------


def error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"code": code, "message": message}, status_code=status)


def status_for(reason: str) -> int:
    if reason in SIZE_REASONS:
        return 413
    if reason == "rate_limited":
        return 429
    return 422 if reason in UNPROCESSABLE_REASONS else 400


def b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii")


def b64decode(value: str) -> bytes:
    """Strict URL-safe base64 (padding optional); InvalidInput ``bad_base64`` otherwise."""
    try:
        raw = value.encode("ascii")
        return base64.b64decode(raw + b"=" * (-len(raw) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInput(f"not URL-safe base64: {exc}", reason="bad_base64") from None


def parse_id(value: str, length: int, what: str) -> bytes:
    """A hex id of exactly ``length`` bytes from a path; InvalidInput ``bad_id`` otherwise."""
    if len(value) != 2 * length:
        raise InvalidInput(
            f"{what} must be {2 * length} hex digits ({length} bytes), got {len(value)} characters",
            reason="bad_id",
        )
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise InvalidInput(f"{what} is not hex", reason="bad_id") from None
    if len(raw) != length:  # fromhex skips whitespace: "00 00 ..." is 2·length chars, fewer bytes
        raise InvalidInput(f"{what} must be {length} bytes of hex, got {len(raw)}", reason="bad_id")
    return raw


def chat_param(chat_id: str) -> bytes:
    return parse_id(chat_id, CHAT_ID_LEN, "chat id")


def user_param(user_id: str) -> bytes:
    return parse_id(user_id, USER_ID_LEN, "user id")


def decode_ops_in(body: OpsIn, *, max_payload: int) -> list[Op]:
    """The ops of a ``POST /ops`` body; InvalidInput (``bad_base64``, a decode reason) if any is bad."""
    return [decode_op(op.kind, b64decode(op.data), max_payload=max_payload) for op in body.ops]


def decode_identity_in(user: bytes, body: IdentityIn) -> IdentityRecord:
    """The record of a ``PUT /identity/{user}`` body; InvalidInput unless it decodes and is ``user``'s."""
    record = decode_identity_record(b64decode(body.data))
    if record.user_id != user:
        raise InvalidInput(
            f"the record is for user {record.user_id.hex()}, not {user.hex()}",
            reason="user_mismatch",
        )
    return record


def message_out(item: StoredMessage) -> MessageOut:
    m = item.msg
    return MessageOut(
        id=m.msg_id.hex(), chat_id=m.chat_id.hex(), sender=m.sender.hex(), hlc=HlcOut.of(m.hlc),
        kind=int(m.kind), payload=b64encode(m.payload), ref=None if m.ref is None else m.ref.hex(),
        seq=item.seq, author_key=m.author_key.hex(), sig=b64encode(m.sig),
    )  # fmt: skip


def member_out(user: bytes, info: MemberInfo) -> MemberOut:
    return MemberOut(
        user_id=user.hex(), role=Role(info.role).name.lower(), added_at=HlcOut.of(info.added_at)
    )


def chat_entry_out(item: ChatListItem) -> ChatEntryOut:
    e = item.entry
    return ChatEntryOut(
        chat_id=e.chat_id.hex(), kind=ChatKind(e.kind).name.lower(), last_ts=e.last_ts,
        last_msg_id=e.last_msg_id.hex(), last_sender=e.last_sender.hex(), last_seq=e.last_seq,
        preview=e.last_text_preview, unread=item.unread,
    )  # fmt: skip


def describe_validation(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


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
        too_big = error(
            413, "body_too_large", f"request body over {self.max_bytes} bytes (dm3 -32011 Too big)"
        )
        too_big.headers["connection"] = "close"  # the rest of the body is not read
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await too_big(scope, receive, send)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # the client went away
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await too_big(scope, receive, send)
                return
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)


# --- the app -------------------------------------------------------------------------------


def create_app(node: Node) -> FastAPI:
    app = FastAPI(
        title="chatsync node",
        version="0.1.0",
        description="A chatsync node: signed chat ops in, history, chat lists and status out.",
    )
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)

    def db() -> ChatDb:
        assert node.db is not None
        return node.db

    def refused(code: str) -> None:
        node.metrics.inc("api_errors", code=code, help="HTTP requests refused, by code")

    # --- errors ---

    @app.exception_handler(InvalidInput)
    async def invalid_input(request: Request, exc: InvalidInput) -> JSONResponse:
        refused(exc.reason)
        message = str(exc)
        if exc.reason in SIZE_REASONS:
            message += " (dm3 -32011 Too big)"
        return error(status_for(exc.reason), exc.reason, message)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        refused("invalid_request")
        return error(422, "invalid_request", describe_validation(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        refused(code)
        return error(exc.status_code, code, str(exc.detail))

    @app.exception_handler(trio.WouldBlock)
    async def busy(request: Request, exc: trio.WouldBlock) -> JSONResponse:
        refused("busy")
        return error(
            503, "busy", "the write queue is full, retry later (dm3 -32005 Limit exceeded)"
        )

    @app.exception_handler(StorageFull)
    async def disk_full(request: Request, exc: StorageFull) -> JSONResponse:
        refused("disk_full")
        return error(507, "disk_full", str(exc))

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        node.metrics.inc("api_bugs", help="HTTP requests that failed with an unexpected error")
        return error(500, "internal", f"internal error: {type(exc).__name__}")

    # --- writes ---

    @app.post("/ops", status_code=201, responses=ERRORS)
    async def submit_ops(body: OpsIn) -> OpsOut:
        """Submit signed ops; answered once written (durable mode: once in the WAL).

        All or nothing: if any op is malformed, forged or too far ahead, none is written.
        """
        ops = decode_ops_in(body, max_payload=node.config.max_payload)
        new = await node.submit_ops(ops, wait_for_room=False)
        return OpsOut(accepted=len(ops), new=new)

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

    # --- chats ---

    @app.get("/chats/{chat_id}/messages", responses=ERRORS)
    async def history(
        chat_id: str,
        cursor: str | None = Query(None, max_length=128, description="next_cursor of a page"),
        limit: int = Query(DEFAULT_PAGE_LIMIT, description=f"1..{MAX_PAGE_LIMIT}"),
        direction: Direction = Query(Direction.BACKWARD, description="backward: newest first"),
    ) -> HistoryOut:
        """One page of a chat's history in (HLC, local seq) order."""
        chat = chat_param(chat_id)
        page = await trio.to_thread.run_sync(lambda: db().range(chat, cursor, limit, direction))
        return HistoryOut(
            chat_id=chat.hex(),
            messages=[message_out(item) for item in page.items],
            next_cursor=page.next_cursor,
        )

    @app.get("/chats/{chat_id}/members", responses=ERRORS)
    async def members(chat_id: str) -> MembersOut:
        """The chat's active members (the CRDT rows whose last add beats their last remove)."""
        chat = chat_param(chat_id)
        rows = await trio.to_thread.run_sync(db().list_members_with_info, chat)
        return MembersOut(
            chat_id=chat.hex(),
            members=[member_out(user, info) for user, info in rows],
        )

    # --- users ---

    @app.get("/users/{user_id}/chats", responses=ERRORS)
    async def chats(
        user_id: str,
        cursor: str | None = Query(None, max_length=128, description="next_cursor of a page"),
        limit: int = Query(DEFAULT_PAGE_LIMIT, description=f"1..{MAX_PAGE_LIMIT}"),
    ) -> ChatsOut:
        """The user's chats, most recent first, with unread counts (local to this node)."""
        user = user_param(user_id)
        page = await trio.to_thread.run_sync(lambda: db().list_user_chats(user, cursor, limit))
        return ChatsOut(
            user_id=user.hex(),
            chats=[chat_entry_out(item) for item in page.items],
            next_cursor=page.next_cursor,
        )

    def read_state(user: bytes, chat: bytes, moved: bool | None = None) -> ReadOut:
        seq = db().get_user_read_progress(user, chat)
        meta = db().get_chat_meta(chat)
        last = meta.last_seq if meta is not None else 0
        return ReadOut(
            user_id=user.hex(), chat_id=chat.hex(), seq=seq, last_seq=last,
            unread=max(0, last - seq), moved=moved,
        )  # fmt: skip

    @app.get("/users/{user_id}/chats/{chat_id}/read", responses=ERRORS)
    async def get_read(user_id: str, chat_id: str) -> ReadOut:
        """How far the user has read in the chat (local seq; a convenience of this node)."""
        user, chat = user_param(user_id), chat_param(chat_id)
        return await trio.to_thread.run_sync(read_state, user, chat)

    @app.put("/users/{user_id}/chats/{chat_id}/read", responses=ERRORS)
    async def put_read(user_id: str, chat_id: str, body: ReadIn) -> ReadOut:
        """Move the read progress forward (never back; capped at the chat's last seq).

        Read progress is local to this node: not signed, not synced, not authenticated —
        a convenience for the clients of this node, counted in this node's local seqs.
        """
        user, chat = user_param(user_id), chat_param(chat_id)

        def move() -> ReadOut:
            meta = db().get_chat_meta(chat)
            target = min(body.seq, meta.last_seq if meta is not None else 0)
            return read_state(user, chat, db().set_user_read_progress(user, chat, target))

        async with node.db_lock:  # one writer at a time, and a monotonic read-modify-write
            return await trio.to_thread.run_sync(move)

    # --- identity ---

    @app.get("/identity/{user_id}", responses=ERRORS)
    async def get_identity(user_id: str) -> IdentityOut:
        """The user's current identity record (verify it: ``store.ops.verify_identity``)."""
        user = user_param(user_id)
        found = await trio.to_thread.run_sync(db().get_identity, user)
        if found is None:
            raise StarletteHTTPException(404, f"no identity for user {user.hex()}")
        hlc, blob = found
        return IdentityOut(user_id=user.hex(), hlc=HlcOut.of(hlc), blob=b64encode(blob))

    @app.put("/identity/{user_id}", responses=ERRORS)
    async def put_identity(user_id: str, body: IdentityIn) -> IdentityPutOut:
        """Publish a signed IdentityRecord for this user (last writer wins by HLC)."""
        user = user_param(user_id)
        record = decode_identity_in(user, body)
        new = await node.submit_ops([record], wait_for_room=False)
        return IdentityPutOut(user_id=user.hex(), new=new[0])

    # --- the node ---

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/status")
    async def status() -> dict[str, Any]:
        """Peer id, connected peers, Merkle root and record count per domain, last sync per peer."""
        return node.status()

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> str:
        """Counters and gauges in the Prometheus text format."""
        return node.metrics.render()

    register_debug_routes(app, node)  # GET /debug/latency (benchmarks)
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
