"""Client sessions: a user reading its event log and chat histories on one node, across the
node's faults, the way ``client/stream.py`` does — resume with the last token after any
disconnect; start over (no ``since``) when the node says the token is not its log's.

Every page and read is recorded (``chaos.history``); after the run, ``finish`` drains what
is left and records the node's whole log for the user, for the checker to compare.
"""

from __future__ import annotations

import base64
import random
import threading
import time

from chaos.history import Epoch, EventPage, History, ReadRecord, SessionLog
from client.e2e import UserKey
from client.http import ChatsyncClient, ChatsyncClientError, Event

PAGE = 200  # events per page
HISTORY_PAGE = 100  # messages per history read
RESTART_CODES = ("foreign_token", "unknown_position")


def position(token: str) -> int:
    """The log position an events token names (node/api/events.py: node id[:8] + position)."""
    return int.from_bytes(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))[8:], "big")


def event_key(event: Event) -> str:
    if event.member_op is not None:
        record = event.member_op.op_id.hex()
    elif event.msg is not None and not event.truncated and event.type != "hidden":
        record = event.msg.msg_id.hex()
    else:
        record = (event.msg_id or b"").hex()
    return f"{event.type}:{record}"


class Session:
    def __init__(
        self, name: str, key: UserKey, node: int, url: str, history: History, t0: float, seed: int
    ) -> None:
        self.key, self.url, self.history, self.t0 = key, url, history, t0
        self.log = SessionLog(name, key.user_id.hex(), node)
        history.sessions[name] = self.log
        self.rng = random.Random(f"{seed}:{name}")
        self.client = ChatsyncClient(url, key=key.signing_key, device=name, timeout=3.0)
        self.since: str | None = None
        self._new_epoch("start")
        self._down = False

    def _now(self) -> float:
        return time.monotonic() - self.t0

    def _new_epoch(self, reason: str) -> None:
        self.log.epochs.append(Epoch(self._now(), reason=reason))
        self.since = None

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if self.poll() and self.rng.random() < 0.3:
                self.read_history()
            stop.wait(self.rng.uniform(0.2, 0.6))

    def poll(self) -> bool:
        """One page of events; False if the node did not answer."""
        try:
            page = self.client.events(self.key.user_id, self.since, limit=PAGE)
        except ChatsyncClientError as exc:
            if exc.code in RESTART_CODES:
                self._new_epoch(exc.code)
                return True
            if not self._down:
                self.log.reconnects += 1
            self._down = True
            return False
        self._down = False
        if page.events:
            self.log.epochs[-1].pages.append(
                EventPage(
                    self._now(),
                    [position(e.position) for e in page.events],
                    [event_key(e) for e in page.events],
                )
            )
        self.since = page.next
        return True

    def read_history(self) -> None:
        chat = bytes.fromhex(self.rng.choice(self.history.chats))
        try:
            page = self.client.history(chat, limit=HISTORY_PAGE)
        except ChatsyncClientError:
            return
        msgs = [m.msg for m in page.messages]
        self.history.add_read(
            ReadRecord(
                self.log.name, self.log.node, self._now(), chat.hex(),
                [m.msg_id.hex() for m in msgs], [m.hlc.pack() for m in msgs],
                len(msgs) >= HISTORY_PAGE,
            )
        )  # fmt: skip

    def finish(self, timeout_s: float = 60) -> None:
        """Drain the log to its end, then record the node's whole log for the user."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            before = self.since
            if self.poll() and self.since == before:
                break
        since: str | None = None
        while time.monotonic() < deadline:
            try:
                page = self.client.events(self.key.user_id, since, limit=PAGE)
            except ChatsyncClientError:
                time.sleep(0.5)
                continue
            if not page.events:
                break
            self.log.final_positions += [position(e.position) for e in page.events]
            self.log.final_keys += [event_key(e) for e in page.events]
            since = page.next
        self.client.close()
