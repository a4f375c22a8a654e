"""``chatsync watch`` (client/watch.py, client/stream.py) as a person runs it: a process
watching node B prints what is posted on node A — a group message, an encrypted DM opened
with the watcher's key — and goes on across a restart of node B, each line once."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from client.e2e import UserKey, write_key_file
from cluster.local import Cluster
from cluster.scenario import Authors

pytestmark = pytest.mark.slow

AUTHORS = Authors(2)  # 0 posts, 1 watches
POSTER, WATCHER = (UserKey.from_seed(bytes([0x40 + i]) * 32) for i in range(2))


class Output:
    """The lines a process prints, read as they come."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert proc.stdout is not None
        stdout = proc.stdout
        threading.Thread(
            target=lambda: self.lines.extend(iter(stdout.readline, "")), daemon=True
        ).start()

    def wait_for(self, text: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines):
                return
            time.sleep(0.1)
        raise AssertionError(f"no {text!r} in {self.lines}")

    def count(self, text: str) -> int:
        return sum(text in line for line in self.lines)


def cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_watch_prints_what_another_node_gets_and_goes_on_across_its_restart(
    tmp_path: Path,
) -> None:
    assert POSTER.user_id == AUTHORS.ids[0] and WATCHER.user_id == AUTHORS.ids[1]
    keys = {name: tmp_path / f"{name}.key" for name in ("poster", "watcher")}
    write_key_file(keys["poster"], POSTER)
    write_key_file(keys["watcher"], WATCHER)
    with Cluster(2, tmp_path / "cluster", sync_interval_s=1.0) as cluster:
        cluster.start()
        a, b = cluster.nodes
        assert all(cluster.post_ops(0, AUTHORS.joins))
        for name in ("poster", "watcher"):
            cli("publish", "--key", str(keys[name]), "--node", a.url)
        cluster.wait_converged(timeout_s=30)
        watch = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "watch", "--key", str(keys["watcher"]),
             "--node", b.url],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        try:
            out = Output(watch)
            out.wait_for("add me")  # the member events come first
            assert all(cluster.post_ops(0, AUTHORS.messages(3, "before the restart")))
            for n in range(3):
                out.wait_for(f"before the restart #{n}")
            cli("send", "--key", str(keys["poster"]), "--node", a.url, "--to",
                WATCHER.user_id.hex(), "a secret for you")  # fmt: skip
            out.wait_for("a secret for you")  # sealed on the wire, opened by the watcher
            cluster.stop(1)
            assert all(cluster.post_ops(0, AUTHORS.messages(3, "while B was down", start=3)))
            cluster.restart(1)
            assert all(cluster.post_ops(0, AUTHORS.messages(3, "after the restart", start=6)))
            for tag in ("while B was down", "after the restart"):
                for n in range(3):
                    out.wait_for(f"{tag} #{n}", timeout_s=90)
            time.sleep(1)
        finally:
            watch.terminate()
            watch.wait(timeout=10)
    for tag in ("before the restart", "while B was down", "after the restart"):
        assert [out.count(f"{tag} #{n}") for n in range(3)] == [1, 1, 1], out.lines
    assert out.count("a secret for you") == 1
    print("\n".join(out.lines))  # the transcript (pytest -s shows it)
