"""A js-libp2p peer in a Node.js process (``tests/interop/libp2p/peer.js``), driven from Python.

The JS package is pinned by its lock file and installed with ``npm ci``. The script prints one
JSON object per line (``{"event": ...}``); ``JsPeer`` collects them on a thread so a caller can
wait for one (``wait_for``) while the peer runs, then read them all when it exits (``finish``).
Used by the interop tests, the hostile-peer tests and ``chatsync bench hostile``.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "tests" / "interop" / "libp2p"
Event = dict[str, Any]


def install_js_packages(*, force: bool = False) -> Path:
    """``npm ci``: exactly the lock file's packages (skipped when installed, unless ``force``)."""
    if force or not (PACKAGE_DIR / "node_modules").is_dir():
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is needed (Node.js 20 + npm) for the js-libp2p peer")
        command = [npm, "ci", "--no-audit", "--no-fund"]
        subprocess.run(command, cwd=PACKAGE_DIR, check=True, timeout=300)
    return PACKAGE_DIR


class JsPeerFailed(RuntimeError):
    """The JS peer exited with an error, or an awaited event did not come."""


class JsPeer:
    """``node peer.js MODE CONFIG``: its events as they come, and its exit."""

    def __init__(self, mode: str, config: dict[str, Any]) -> None:
        node = shutil.which("node")
        if node is None:
            raise RuntimeError("Node.js is needed for the js-libp2p peer")
        self.mode = mode
        self.events: list[Event] = []
        self._queue: queue.Queue[Event] = queue.Queue()
        self.proc = subprocess.Popen(
            [node, "peer.js", mode, json.dumps(config)], cwd=PACKAGE_DIR,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self._stderr: list[str] = []
        threading.Thread(target=self._read_events, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_events(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                event = json.loads(line)
                self.events.append(event)
                self._queue.put(event)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    def wait_for(self, name: str, timeout_s: float) -> Event:
        """The next event called ``name`` (events before it are kept in ``events``)."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = self._queue.get(timeout=min(left, 0.5))
            except queue.Empty:
                if self.proc.poll() is not None and self._queue.empty():
                    break
                continue
            if event["event"] == "error":
                raise JsPeerFailed(f"{self.mode}: {event}")
            if event["event"] == name:
                return event
        raise JsPeerFailed(f"{self.mode}: no {name!r} event within {timeout_s} s; {self.tail()}")

    def finish(self, timeout_s: float) -> list[Event]:
        """Wait for the peer to exit on its own; every event it printed."""
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.close()
            raise JsPeerFailed(f"{self.mode}: still running after {timeout_s} s") from None
        time.sleep(0.1)  # the reader thread takes the last lines
        if code != 0:
            raise JsPeerFailed(f"{self.mode} exited {code}; {self.tail()}")
        return self.events

    def tail(self) -> str:
        return f"events: {self.events[-5:]}; stderr: {''.join(self._stderr)[-2000:]}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> JsPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_js_peer(mode: str, config: dict[str, Any], timeout_s: float) -> list[Event]:
    """Run the peer in ``mode`` to its end; its events."""
    with JsPeer(mode, config) as peer:
        return peer.finish(timeout_s)


def last(events: list[Event], name: str) -> Event:
    """The last event called ``name``."""
    for event in reversed(events):
        if event["event"] == name:
            return event
    raise JsPeerFailed(f"no {name!r} event in {events[-5:]}")
