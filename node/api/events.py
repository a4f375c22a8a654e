"""What is new for a user, across their chats: ``GET /users/{user}/events`` and its live
twin, the WebSocket ``/users/{user}/stream``.

Both read the user's feed of this node's event log (``store.feed``): the records
themselves, signed, in the order this node committed them, each with its position. A
position is a token: ``since=<token>`` goes on after it, so a client that pages while
writes continue gets every event once. A token names this node's log: on another node it
is refused (410 ``foreign_token``) and the client starts over there without ``since``
(and drops what it already has by id). A token past the log's end (a wiped node) is 410
``unknown_position``.

The stream is the same feed, pushed: it sends what is after ``since`` frame by frame, then
waits for the next commit (``node/commits.py``: woken after the WriteBatch — after the WAL
sync on a durable node) and sends again, and a heartbeat with the current token when idle.
Streams at the log's end share one read and one serialization of each event
(``node/api/tail.py``); one behind it reads its user's feed from the store. The client
acknowledges each frame with ``{"ack": <token>}`` — its device's delivered position
(``GET /users/{user}/delivery``, kept by ``node/delivery.py``) — and the stream runs at most
``WINDOW`` frames of about ``FRAME_BYTES`` ahead of those acks: a client that has let a frame
go unacknowledged for ``stream_send_timeout_s`` with the window full is closed (4008, the
reason carrying the token to resume from, its last acknowledged one), so a connection never
holds more than the window. A message over ``INLINE_BYTES`` goes as a stub — its id, and
``truncated`` — for the client to fetch (``GET /chats/{chat}/messages/{id}``). Anything else
the client sends, or more than ``MAX_CLIENT_MESSAGE`` bytes, closes the connection (4400,
1009). Refused right after the upgrade, the code in the reason: 4401 (no token, bad,
expired), 4403 (another user's), 4410 (a token of another node's log), 4400 (a bad token).
"""

from __future__ import annotations

import json
from collections import deque
from functools import partial
from typing import Literal

import trio
from fastapi import APIRouter, Query, WebSocket
from starlette.websockets import WebSocketDisconnect

from node.api.auth import Signed, as_user, held_here, principal_of
from node.api.decode import b64decode, chat_param, msg_id_param, user_param
from node.api.errors import ERRORS, NotFound
from node.api.interface import NodeApi, NodeDep, node_of
from node.api.models import (
    DeliveryOut,
    EventOut,
    EventsOut,
    MessageDeliveryOut,
    RecipientOut,
    b64encode,
    message_out,
)
from node.api.tail import LogTail
from node.auth import AuthRefused
from store.errors import InvalidInput
from store.events import EventKind
from store.feed import FeedEvent, Reader

router = APIRouter()

DEFAULT_EVENTS, MAX_EVENTS = 100, 500
WINDOW = 2  # frames a stream sends ahead of its client's acknowledgements
FRAME_BYTES = 24 * 1024  # the records of a stream's frame, about (store.feed's max_bytes)
INLINE_BYTES = 16 * 1024  # a bigger record goes as a stub: its id, to fetch by GET
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
    page = await trio.to_thread.run_sync(node.reads.feed, user, after, limit)
    return EventsOut(
        events=[event_out(node, e) for e in page.events], next=token_of(node, page.position)
    )


@router.get("/users/{user_id}/delivery", responses=ERRORS)
async def delivery(user_id: str, node: NodeDep, who: Signed) -> DeliveryOut:
    """How far each of the user's devices has acknowledged its stream (delivered)."""
    user = user_param(user_id)
    as_user(who, user)
    await node.acks.flush()
    acked = await trio.to_thread.run_sync(node.reads.delivered, user)
    return DeliveryOut(
        user_id=user.hex(), devices={device: token_of(node, p) for device, p in acked.items()}
    )


@router.get("/chats/{chat_id}/messages/{msg_id}/delivery", responses=ERRORS)
async def message_delivery(
    chat_id: str, msg_id: str, node: NodeDep, who: Signed
) -> MessageDeliveryOut:
    """Per recipient: pending, delivered (a device of theirs acknowledged it on this node's
    stream), read (their signed receipt reaches it). For the chat's members."""
    chat, wanted = chat_param(chat_id), msg_id_param(msg_id)
    await held_here(node, who, chat)
    await node.acks.flush()
    found = await trio.to_thread.run_sync(node.reads.delivery, wanted)
    if found is None or found[0].chat_id != chat:
        raise NotFound("not_found", f"this node shows no message {msg_id} in chat {chat_id}")
    return MessageDeliveryOut(
        msg_id=msg_id,
        recipients=[
            RecipientOut(user_id=r.user_id.hex(), state=r.state, devices=r.devices)
            for r in found[1]
        ],
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
        acked = _Acked(after)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read_acks, websocket, node, user, who.device, acked, nursery)
            await _push(websocket, node, user, after, acked)
            nursery.cancel_scope.cancel()
    except WebSocketDisconnect:
        pass
    finally:
        node.metrics.inc("streams_ended", help="event streams ended, for any reason")


class _Acked:
    """How far the client has acknowledged its stream, and a pulse each time that moves."""

    def __init__(self, position: int) -> None:
        self.position = position
        self.moved = trio.Event()

    def ack(self, position: int) -> None:
        if position > self.position:
            self.position = position
            self.moved.set()
            self.moved = trio.Event()


async def _push(
    websocket: WebSocket, node: NodeApi, user: bytes, after: int, acked: _Acked
) -> None:
    """Send the feed from ``after`` on, at most ``WINDOW`` frames ahead of the client's acks;
    return once the client is closed as slow (an unacknowledged frame older than
    ``stream_send_timeout_s`` with the window full). The window, not the send, is the
    backpressure: hypercorn shields a send from cancellation, so a send to a client that
    stopped reading would wait for it for ever (and hold up the node's shutdown). The
    window's bytes — ``WINDOW`` frames of ``FRAME_BYTES`` records, each record at most
    ``INLINE_BYTES`` — fit in a TCP connection's buffers (Linux: 128 KiB to receive and
    16 KiB to send at first), so a send never waits for a client that stopped reading."""
    timeout = node.config.stream_send_timeout_s
    reader = Reader(node.reads, user)
    unacked: deque[tuple[int, float]] = deque()  # (a sent page's position, when it was sent)
    while True:
        while unacked and unacked[0][0] <= acked.position:
            unacked.popleft()
        if len(unacked) >= WINDOW:
            moved = acked.moved
            with trio.move_on_at(unacked[0][1] + timeout):
                await moved.wait()
                continue
            _count(node, "closed", "slow_consumer")
            resume = token_of(node, acked.position)
            await websocket.close(code=4008, reason=f"slow_consumer; resume {resume}")
            return
        parts, reached = await _next_frame(websocket, node, reader, user, after)
        if parts:
            await _send(websocket, node, parts, reached)
            unacked.append((reached, trio.current_time()))
        elif reached == after:  # nothing new: wait for a commit, or beat
            with trio.move_on_after(node.config.stream_heartbeat_s) as idle:
                await node.commits.wait_past(after)
            if idle.cancelled_caught:  # a beat is a frame too: acknowledged, or the end
                await _send(websocket, node, [], after)
                unacked.append((after, trio.current_time()))
        after = reached


async def _next_frame(
    websocket: WebSocket, node: NodeApi, reader: Reader, user: bytes, after: int
) -> tuple[list[str], int]:
    """The next frame's events (as JSON) after ``after``, and the position it reaches: from
    the shared tail when it holds them, else from the user's feed in the store."""
    tail: LogTail = websocket.app.state.tail
    found = await tail.after(after)
    if found is None:
        page = await trio.to_thread.run_sync(
            partial(node.reads.feed, user, after, DEFAULT_EVENTS, max_bytes=FRAME_BYTES)
        )
        return [stream_json(node, e) for e in page.events], page.position
    events, reached = found
    parts: list[str] = []
    size = 0
    for event in events:
        # may_read: point reads of cached rows, cheaper here than a thread hop
        if reader.keeps(event.kind, event.chat_id, event.about):
            parts.append(event.json)
            size += len(event.json)
            if size >= FRAME_BYTES or len(parts) == DEFAULT_EVENTS:
                return parts, event.position
    return parts, reached


def stream_json(node: NodeApi, event: FeedEvent) -> str:
    """An event as a stream sends it (a big message as a stub)."""
    return event_out(node, event, inline_bytes=INLINE_BYTES).model_dump_json()


async def _send(websocket: WebSocket, node: NodeApi, parts: list[str], position: int) -> None:
    frame = f'{{"events":[{",".join(parts)}],"next":"{token_of(node, position)}"}}'
    await websocket.send_text(frame)  # EventsOut, assembled from events serialized once


async def _read_acks(
    websocket: WebSocket,
    node: NodeApi,
    user: bytes,
    device: str,
    acked: _Acked,
    nursery: trio.Nursery,
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
            nursery.cancel_scope.cancel()
            return
        acked.ack(position)
        node.acks.ack(user, device, position)  # written within a second (node/delivery.py)


def event_out(node: NodeApi, event: FeedEvent, inline_bytes: int | None = None) -> EventOut:
    """``inline_bytes``: a message over this goes as its id alone (``truncated``)."""
    msg, hidden = event.msg, event.kind is EventKind.HIDDEN
    stub = msg is not None and inline_bytes is not None and len(msg.encoded) > inline_bytes
    return EventOut(
        position=token_of(node, event.position),
        type=_TYPES[event.kind],
        chat_id=event.chat_id.hex(),
        message=message_out(msg, 0) if msg is not None and not (hidden or stub) else None,
        member_op=None if event.member_op is None else b64encode(event.member_op.encode()),
        msg_id=msg.msg_id.hex() if msg is not None and (hidden or stub) else None,
        truncated=stub,
    )


def token_of(node: NodeApi, position: int) -> str:
    return b64encode(node.auth.node_id[:8] + position.to_bytes(8, "big"))


def position_of(node: NodeApi, token: str | None) -> int:
    """The position a token names (0 for none); Gone if it is not of this node's log."""
    if token is None:
        return 0
    try:
        raw = b64decode(token)
    except InvalidInput:
        raise InvalidInput("not an events token", reason="bad_since") from None
    if len(raw) != 16:
        raise InvalidInput("not an events token", reason="bad_since")
    if raw[:8] != node.auth.node_id[:8]:
        raise Gone("a token of another node's log: start over here", reason="foreign_token")
    position = int.from_bytes(raw[8:], "big")
    if position > node.reads.last_position:
        raise Gone("past the end of this node's log: start over", reason="unknown_position")
    return position


def _refusal(exc: AuthRefused | InvalidInput) -> tuple[str, int]:
    if isinstance(exc, AuthRefused):
        return exc.code, exc.status
    return exc.reason, 410 if isinstance(exc, Gone) else 400


def _count(node: NodeApi, what: str, reason: str) -> None:
    node.metrics.inc(f"streams_{what}", reason=reason, help=f"event streams {what}, by reason")
