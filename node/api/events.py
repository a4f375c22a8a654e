"""What is new for a user, across their chats: ``GET /users/{user}/events`` and its live
twin, the WebSocket ``/users/{user}/stream``.

Both read the user's feed of this node's event log (``store.feed``): the records
themselves, signed, in the order this node committed them, each with its position. A
position is a token: ``since=<token>`` goes on after it, so a client that pages while
writes continue gets every event once. A token names this node's log: on another node it
is refused (410 ``foreign_token``) and the client starts over there without ``since``
(and drops what it already has by id). A token past the log's end (a wiped node) is 410
``unknown_position``.

The stream is the same feed, pushed: it sends what is after ``since`` page by page, then
waits for the next commit (``node/commits.py``: woken after the WriteBatch — after the WAL
sync on a durable node) and sends again, and a heartbeat with the current token when idle.
Each connection holds one page at most: a client that does not read within
``stream_send_timeout_s``
is closed (4008, the reason carrying the token to resume from). The client acknowledges
with ``{"ack": <token>}`` — its device's delivered position (``GET /users/{user}/delivery``).
Anything else it sends, or more than ``MAX_CLIENT_MESSAGE`` bytes, closes the connection
(4400, 1009). Refused right after the upgrade, the code in the reason: 4401 (no token, bad,
expired), 4403 (another user's), 4410 (a token of another node's log), 4400 (a bad token).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from typing import Literal

import trio
from fastapi import APIRouter, Query, WebSocket
from starlette.websockets import WebSocketDisconnect

from node.api.auth import Signed, as_user, principal_of
from node.api.decode import user_param
from node.api.errors import ERRORS
from node.api.interface import NodeApi, NodeDep, node_of
from node.api.models import DeliveryOut, EventOut, EventsOut, b64encode, message_out
from node.auth import AuthRefused
from store.errors import InvalidInput
from store.events import EventKind
from store.feed import FeedEvent

log = logging.getLogger(__name__)
router = APIRouter()

DEFAULT_EVENTS, MAX_EVENTS = 100, 500
MAX_CLIENT_MESSAGE = 1024
EventType = Literal["message", "delete", "member", "hidden"]
_TYPES: dict[EventKind, EventType] = {
    EventKind.MESSAGE: "message", EventKind.DELETE: "delete", EventKind.MEMBER: "member",
    EventKind.HIDDEN: "hidden",
}  # fmt: skip


class Gone(InvalidInput):
    """A token this node's log cannot go on from (410)."""


@router.get("/users/{user_id}/events", responses=ERRORS)
async def events(
    user_id: str,
    node: NodeDep,
    who: Signed,
    since: str | None = Query(None, max_length=64, description="the `next` of a page"),
    limit: int = Query(DEFAULT_EVENTS, ge=1, le=MAX_EVENTS),
) -> EventsOut:
    """The user's events after ``since`` (all this node holds for them without it), in the
    order this node committed them, and the token to go on from."""
    user = user_param(user_id)
    as_user(who, user)
    after = position_of(node, since)
    page = await trio.to_thread.run_sync(node.db.feed, user, after, limit)
    return EventsOut(
        events=[event_out(node, e) for e in page.events], next=token_of(node, page.position)
    )


@router.get("/users/{user_id}/delivery", responses=ERRORS)
async def delivery(user_id: str, node: NodeDep, who: Signed) -> DeliveryOut:
    """How far each of the user's devices has acknowledged its stream (delivered)."""
    user = user_param(user_id)
    as_user(who, user)
    acked = await trio.to_thread.run_sync(node.db.delivered, user)
    return DeliveryOut(
        user_id=user.hex(), devices={device: token_of(node, p) for device, p in acked.items()}
    )


@router.websocket("/users/{user_id}/stream")
async def stream(websocket: WebSocket, user_id: str, since: str | None = None) -> None:
    node = node_of(websocket)
    await websocket.accept()  # then a refusal is a close code and reason the client can read
    try:
        who = principal_of(websocket, node)
        user = user_param(user_id)
        as_user(who, user)
        after = position_of(node, since)
    except (AuthRefused, InvalidInput) as exc:
        code, status = _refusal(exc)
        _count(node, "refused", code)
        await websocket.close(code=4000 + status, reason=f"{code}: {exc}"[:120])
        return
    node.metrics.inc("streams_opened", help="event streams accepted")
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read_acks, websocket, node, user, who.device, nursery.cancel_scope)
            await _push(websocket, node, user, after)
            nursery.cancel_scope.cancel()
    except WebSocketDisconnect:
        pass
    finally:
        node.metrics.inc("streams_closed", help="event streams ended")


async def _push(websocket: WebSocket, node: NodeApi, user: bytes, after: int) -> None:
    """Send the feed from ``after`` on, forever; return once the client is closed as slow."""
    while True:
        page = await trio.to_thread.run_sync(node.db.feed, user, after, DEFAULT_EVENTS)
        if page.events or page.position == after:
            body = EventsOut(
                events=[event_out(node, e) for e in page.events], next=token_of(node, page.position)
            )
            with trio.move_on_after(node.config.stream_send_timeout_s) as sending:
                await websocket.send_text(body.model_dump_json())
            if sending.cancelled_caught:
                _count(node, "closed", "slow_consumer")
                with trio.move_on_after(1):
                    await websocket.close(code=4008, reason=f"slow_consumer; resume {body.next}")
                return
        if page.position == after or page.position >= node.db.last_position:
            with trio.move_on_after(node.config.stream_heartbeat_s):
                await node.commits.wait_past(page.position)
        after = page.position


async def _read_acks(
    websocket: WebSocket, node: NodeApi, user: bytes, device: str, scope: trio.CancelScope
) -> None:
    """Take the client's acknowledgements; close it on anything else."""
    while True:
        text = await websocket.receive_text()
        try:
            if len(text) > MAX_CLIENT_MESSAGE:
                raise InvalidInput("a client message is at most 1 KiB", reason="too_large")
            sent = json.loads(text)
            if (
                not isinstance(sent, dict)
                or set(sent) != {"ack"}
                or not isinstance(sent["ack"], str)
            ):
                raise InvalidInput('send {"ack": <token>} only', reason="bad_message")
            position = position_of(node, sent["ack"])
        except (InvalidInput, ValueError) as exc:
            reason = exc.reason if isinstance(exc, InvalidInput) else "bad_message"
            _count(node, "closed", reason)
            await websocket.close(code=1009 if reason == "too_large" else 4400, reason=reason)
            scope.cancel()
            return
        await trio.to_thread.run_sync(node.db.acknowledge, user, device, position)


def event_out(node: NodeApi, event: FeedEvent) -> EventOut:
    msg, hidden = event.msg, event.kind is EventKind.HIDDEN
    return EventOut(
        position=token_of(node, event.position),
        type=_TYPES[event.kind],
        chat_id=event.chat_id.hex(),
        message=message_out(msg, 0) if msg is not None and not hidden else None,
        member_op=None if event.member_op is None else b64encode(event.member_op.encode()),
        msg_id=msg.msg_id.hex() if msg is not None and hidden else None,  # its words are gone
    )


def token_of(node: NodeApi, position: int) -> str:
    return b64encode(node.auth.node_id[:8] + position.to_bytes(8, "big"))


def position_of(node: NodeApi, token: str | None) -> int:
    """The position a token names (0 for none); Gone if it is not of this node's log."""
    if token is None:
        return 0
    try:
        raw = base64.urlsafe_b64decode(token.encode("ascii") + b"=" * (-len(token) % 4))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise InvalidInput("not an events token", reason="bad_since") from None
    if len(raw) != 16:
        raise InvalidInput("not an events token", reason="bad_since")
    if raw[:8] != node.auth.node_id[:8]:
        raise Gone("a token of another node's log: start over here", reason="foreign_token")
    position = int.from_bytes(raw[8:], "big")
    if position > node.db.last_position:
        raise Gone("past the end of this node's log: start over", reason="unknown_position")
    return position


def _refusal(exc: AuthRefused | InvalidInput) -> tuple[str, int]:
    if isinstance(exc, AuthRefused):
        return exc.code, exc.status
    return exc.reason, 410 if isinstance(exc, Gone) else 400


def _count(node: NodeApi, what: str, reason: str) -> None:
    node.metrics.inc(f"streams_{what}", reason=reason, help=f"event streams {what}, by reason")
