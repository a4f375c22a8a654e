"""A user's events, live: the node's WebSocket ``/users/{user}/stream``, kept open.

``watch_events`` yields each event once, in the node's commit order, across disconnects:
it acknowledges every batch it has yielded (the node records that device's delivery), keeps
the last token, and on a lost connection — the node restarting, a network cut, a close as a
slow reader — reconnects with backoff and resumes from that token, so nothing is missed
and nothing comes twice. It signs in again when the token expired (4401), and starts over
when the node no longer knows the token's log (4410: a wiped node), skipping the ids it
already gave. Records are rebuilt and checked as ``ChatsyncClient.events`` does; a message
too big for the stream comes as its id, and is fetched.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from urllib.parse import quote

import trio
import trio_websocket

from client.http import ChatsyncClient, ChatsyncClientError, Event, event_from_json

BACKOFF_MIN_S, BACKOFF_MAX_S = 0.5, 10.0
SEEN_KEPT = 10_000  # ids remembered to skip after a start-over
FIRST_TRIES = 5  # a node never reached: a wrong URL or a dead node, given up after ~8 s


async def watch_events(
    client: ChatsyncClient,
    user_id: bytes,
    since: str | None = None,
    *,
    on_state: Callable[[str], None] = lambda state: None,
    first_tries: int = FIRST_TRIES,
) -> AsyncIterator[Event]:
    """Every event of the user's feed after ``since``, forever (``on_state`` hears
    "connected", "reconnecting in N s: why").

    Until it has connected once, it gives up after ``first_tries`` failures (raising
    ChatsyncClientError ``unreachable`` with the last reason): a node not reached at all is
    most likely a wrong address. Once connected, it retries for ever: a node restarting is
    what it is meant to ride out."""
    backoff = BACKOFF_MIN_S
    failures = 0
    connected = False
    seen: dict[bytes, None] = {}  # the records given, to skip after a start-over only
    started_over = False
    while True:
        try:
            token = await trio.to_thread.run_sync(client.token)
            async with trio_websocket.open_websocket_url(
                _url(client.base_url, user_id, since, token), connect_timeout=10
            ) as ws:
                on_state("connected")
                backoff, connected = BACKOFF_MIN_S, True
                while True:
                    batch = json.loads(await ws.get_message())
                    for item in batch["events"]:
                        event = event_from_json(item)
                        if event.truncated:  # a big message: fetched (a blocking call)
                            event = await trio.to_thread.run_sync(_whole, client, event)
                        key = _identity(event)
                        if started_over and key in seen:
                            continue
                        seen[key] = None
                        if len(seen) > SEEN_KEPT:
                            del seen[next(iter(seen))]
                        yield event
                    since = batch["next"]
                    await ws.send_message(json.dumps({"ack": since}))
        except trio_websocket.ConnectionClosed as closed:
            reason = closed.reason
            code = reason.code if reason is not None else None
            text = reason.reason if reason is not None and reason.reason else "connection lost"
            why = f"the node at {client.base_url} closed the stream ({code}: {text})"
            if code == 4401:
                client.forget_token()
            elif code == 4410:
                since, started_over = None, True  # not the log the token names: start over
        except (OSError, trio_websocket.HandshakeError, ChatsyncClientError) as exc:
            why = failure_reason(client.base_url, exc)
        failures += 1
        if not connected and failures >= first_tries:
            raise ChatsyncClientError(0, "unreachable", f"{why}; gave up after {failures} tries")
        delay = backoff * random.uniform(0.8, 1.2)
        tries = "" if connected else f", try {failures + 1} of {first_tries}"
        on_state(f"reconnecting in {delay:.1f} s{tries}: {why}")
        await trio.sleep(delay)
        backoff = min(backoff * 2, BACKOFF_MAX_S)


def failure_reason(base_url: str, exc: BaseException) -> str:
    """Why a connection failed, naming the node: a HandshakeError says nothing itself, its
    cause (a refused connection, a timeout) does."""
    if isinstance(exc, ChatsyncClientError):  # names the node already
        return exc.message if exc.code == "unreachable" else str(exc)
    if isinstance(exc, trio_websocket.ConnectionTimeout):
        return f"cannot reach the node at {base_url}: connection timed out"
    if isinstance(exc, trio_websocket.ConnectionRejected):
        return f"the node at {base_url} refused the stream: HTTP {exc.status_code}"
    cause = exc.__cause__ or exc
    detail = str(cause) or type(cause).__name__
    inner = cause.__cause__  # trio's "all attempts to connect ... failed" has the errno here
    if isinstance(inner, BaseExceptionGroup) and inner.exceptions:
        inner = inner.exceptions[0]
    if inner is not None and str(inner):
        detail += f" ({inner})"
    return f"cannot reach the node at {base_url}: {detail}"


def _whole(client: ChatsyncClient, event: Event) -> Event:
    """The event with its message, fetched (the stream sent its id: a big message)."""
    if event.msg_id is None:
        return event
    msg = client.message(event.chat_id, event.msg_id)  # None: erased meanwhile
    return replace(event, msg=msg, msg_id=None, truncated=False) if msg is not None else event


def _url(base_url: str, user_id: bytes, since: str | None, token: str) -> str:
    ws = "ws" + base_url.removeprefix("http")  # http -> ws, https -> wss
    query = f"access_token={quote(token)}" + ("" if since is None else f"&since={quote(since)}")
    return f"{ws}/users/{user_id.hex()}/stream?{query}"


def _identity(event: Event) -> bytes:
    """What makes an event the same one after a start-over: its record."""
    if event.msg is not None:
        return event.type.encode() + event.msg.msg_id
    if event.member_op is not None:
        return event.member_op.encode()
    return event.type.encode() + (event.msg_id or b"")
