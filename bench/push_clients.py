"""The push benchmark's readers, in one trio process: stream clients and pollers.

A ``StreamClient`` holds one WebSocket ``/users/{user}/stream`` open and acknowledges every
frame with its ``next``. An idle client decodes nothing else: it cuts ``next`` out of the
frame's text (the node writes it last) — the harness shares a 2-core machine with the nodes.
A probe also parses the frame and notes when each message id first came (wall s) and the log
position of the frame that brought it. A client the node closes (a slow consumer: 4008, the
node restarting) reconnects and resumes from its last acknowledged token, as
``client.stream`` does; every close is counted by code.

A ``Poller`` reads the same chat the old way: ``GET /chats/{chat}/messages?limit=50`` (newest
first) every ``interval_s``, paging back (``cursor``) while a page holds only ids it has not
seen, and notes when each id was first seen.
"""

from __future__ import annotations

import base64
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import quote

import httpx
import trio
import trio_websocket

RECEIVE_BUFFER = 64 * 1024  # bytes per socket read (trio-websocket reads 4 KiB by default)
RECONNECT_S = 0.5
MAX_PAGES_PER_POLL = 50


def position_of(token: str) -> int:
    """The log position an events token names (node/api/events.py: node id[:8] | position)."""
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    return int.from_bytes(raw[8:16], "big")


def next_token(frame: str) -> str:
    """The ``next`` of a frame, without parsing it: ``{"events":[...],"next":"<token>"}``."""
    at = frame.rfind('"next":"') + 8
    return frame[at : frame.index('"', at)]


@dataclass
class StreamClient:
    """One device's stream: ``base_url`` is the stream's URL with its access token."""

    n: int
    base_url: str
    probe: bool = False
    token: str | None = None  # the last frame's next: acknowledged, and resumed from
    position: int = 0  # ... as a log position
    frames: int = 0
    connects: int = 0
    closes: Counter[str] = field(default_factory=Counter)  # close code (or error) -> count
    # probes only: message id (hex) -> when it first came (wall s); reset for each run
    arrivals: dict[str, float] = field(default_factory=dict)
    last_new_position: int = 0  # the position of the last frame that brought a new id

    def url(self) -> str:
        return self.base_url + ("" if self.token is None else f"&since={quote(self.token)}")

    def take(self, frame: str, at: float) -> str:
        """Note a frame that came at ``at``; the acknowledgement to send for it."""
        self.frames += 1
        if self.probe:
            body = json.loads(frame)
            token = body["next"]
            position = position_of(token)
            arrivals = self.arrivals
            for event in body["events"]:
                if event["type"] != "message":
                    continue
                msg = event["message"]
                key = msg["id"] if msg is not None else event["msg_id"]  # or a big one's stub
                if key not in arrivals:
                    arrivals[key] = at
                    self.last_new_position = position
        else:
            token = next_token(frame)
            position = position_of(token)
        self.token, self.position = token, position
        return '{"ack":"' + token + '"}'

    async def run(self, connected: trio.Semaphore, connecting: trio.Semaphore) -> None:
        """Stream until cancelled; release ``connected`` after the first frame of the first
        connection (``connecting`` bounds the handshakes under way)."""
        first = True
        while True:
            await connecting.acquire()
            handshaking = True
            try:
                async with trio_websocket.open_websocket_url(
                    self.url(),
                    connect_timeout=60,
                    disconnect_timeout=2,
                    receive_buffer_size=RECEIVE_BUFFER,
                ) as ws:
                    connecting.release()
                    handshaking = False
                    self.connects += 1
                    while True:
                        frame = await ws.get_message()
                        await ws.send_message(self.take(str(frame), time.time()))
                        if first:
                            first = False
                            connected.release()
            except trio_websocket.ConnectionClosed as closed:
                code = closed.reason.code if closed.reason is not None else None
                self.closes[str(code)] += 1
            except (OSError, trio_websocket.HandshakeError, trio.TooSlowError) as exc:
                self.closes[type(exc).__name__] += 1
            finally:
                if handshaking:
                    connecting.release()
            await trio.sleep(RECONNECT_S)


async def run_clients(
    clients: list[StreamClient], connected: trio.Semaphore, max_connecting: int = 50
) -> None:
    """Run every client until cancelled, at most ``max_connecting`` handshakes at a time."""
    connecting = trio.Semaphore(max_connecting)
    async with trio.open_nursery() as nursery:
        for client in clients:
            nursery.start_soon(client.run, connected, connecting)


@dataclass
class Poller:
    """One device polling a chat's history on node ``url`` with its bearer ``token``."""

    n: int
    url: str
    chat_hex: str
    token: str
    interval_s: float = 1.0
    limit: int = 50
    seen: set[str] = field(default_factory=set)
    arrivals: dict[str, float] = field(default_factory=dict)  # id -> first seen (wall s)
    polls: int = 0
    requests: int = 0
    errors: int = 0
    polled: trio.Event = field(default_factory=trio.Event)  # after the first (baseline) poll

    async def run(self, phase_s: float) -> None:
        """Poll every ``interval_s`` (first after ``phase_s``) until cancelled. The first
        poll is the baseline: what it sees was there before, and is not an arrival."""
        headers = {"authorization": f"Bearer {self.token}"}
        async with httpx.AsyncClient(base_url=self.url, headers=headers, timeout=30) as http:
            start = trio.current_time() + phase_s
            k = 0
            while True:
                await trio.sleep_until(start + k * self.interval_s)
                k = max(k + 1, int((trio.current_time() - start) / self.interval_s) + 1)
                await self._poll(http, baseline=not self.polled.is_set())
                self.polled.set()

    async def _poll(self, http: httpx.AsyncClient, *, baseline: bool) -> None:
        self.polls += 1
        cursor: str | None = None
        for _ in range(MAX_PAGES_PER_POLL):
            params: dict[str, str | int] = {"limit": self.limit}
            if cursor is not None:
                params["cursor"] = cursor
            self.requests += 1
            try:
                response = await http.get(f"/chats/{self.chat_hex}/messages", params=params)
                response.raise_for_status()
                body = response.json()
            except (httpx.HTTPError, ValueError):
                self.errors += 1
                return
            at = time.time()
            ids = [m["id"] for m in body["messages"]]
            new = [i for i in ids if i not in self.seen]
            self.seen.update(new)
            if not baseline:
                for i in new:
                    self.arrivals[i] = at
            cursor = body.get("next_cursor")
            if len(new) < len(ids) or not ids or cursor is None:
                return  # reached what an earlier poll saw, or the chat's beginning
