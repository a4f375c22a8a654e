"""``chatsync node run`` refuses to start, as real processes: one line on stderr, exit code 2,
no traceback — and a node already running on the port or data directory keeps serving.

Without the checks a second node on a taken libp2p port started silently (py-libp2p binds with
SO_REUSEPORT), one on a taken HTTP port or data directory ended in a traceback, and a
malformed --bootstrap crashed the node once it was running."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cluster.local import Cluster, NodeProcess, free_port

REFUSE_WITHIN_S = 30.0  # a node that wrongly starts is killed then, failing the test


def node_run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "node.cli", "run", *args],
        cwd=cwd, capture_output=True, text=True, timeout=REFUSE_WITHIN_S,
    )  # fmt: skip


def assert_refused(result: subprocess.CompletedProcess[str], line: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output
    assert result.stderr == f"chatsync: {line}\n", output
    assert result.stdout == ""


# --- malformed flags: refused while the config loads, before the node starts ---


@pytest.mark.parametrize(
    ("flag", "value", "reason"),
    [
        ("--listen", "127.0.0.1:4001", "not a multiaddr (no leading /)"),
        ("--listen", "/ip4/127.0.0.1/udp/4001", "not /ip4/HOST/tcp/PORT or /ip6/HOST/tcp/PORT"),
        (
            "--listen",
            "/ip4/127.0.0.1/tcp/70000",
            "not a multiaddr (integer not in range [0, 65536))",
        ),
        ("--bootstrap", "not-an-address", "not a multiaddr (no leading /)"),
        ("--bootstrap", "/ip4/127.0.0.1/tcp/4001", "no /p2p/<peer id> at its end"),
        ("--bootstrap", "/ip4/127.0.0.1/tcp/4001/p2p/xyz", "not a multiaddr (Invalid CID: xyz)"),
        ("--http", "127.0.0.1", "no port (HOST:PORT)"),
        ("--http", "127.0.0.1:web", "port 'web' is not a number"),
        ("--http", "127.0.0.1:65536", "port 65536 is out of range (1-65535)"),
    ],
)
def test_a_malformed_flag_is_refused(tmp_path: Path, flag: str, value: str, reason: str) -> None:
    result = node_run(tmp_path, "--data", str(tmp_path / "data"), flag, value)
    assert_refused(result, f"{flag} {value!r}: {reason}")
    assert not (tmp_path / "data").exists()  # refused before anything was made


def test_listen_and_http_on_one_port_are_refused(tmp_path: Path) -> None:
    port = free_port()
    listen, http = f"/ip4/127.0.0.1/tcp/{port}", f"127.0.0.1:{port}"
    result = node_run(tmp_path, "--listen", listen, "--http", http)
    assert_refused(result, f"--listen {listen!r} and --http {http!r} use the same port")


def test_an_unknown_config_key_is_one_line_too(tmp_path: Path) -> None:
    toml = tmp_path / "node.toml"
    toml.write_text("[node]\nlistn = 1\n")
    assert_refused(node_run(tmp_path, "--config", str(toml)), "unknown config keys: listn")


# --- what another process holds: refused by Node.run before it opens anything ---


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A node running (in its own process) on its ports and data directory."""
    with Cluster(1, tmp_path_factory.mktemp("first")) as cluster:
        cluster.start()
        yield cluster.nodes[0]


def assert_serves(node: NodeProcess) -> None:
    """``node`` answers /status, still as itself on its libp2p port."""
    status = httpx.get(f"{node.url}/status", timeout=10).json()
    assert status["peer_id"] == node.peer_id
    assert status["listen"] == [node.multiaddr]


@pytest.mark.slow
def test_a_taken_libp2p_port_is_refused(first: NodeProcess, tmp_path: Path) -> None:
    listen = f"/ip4/127.0.0.1/tcp/{first.p2p_port}"
    result = node_run(
        tmp_path, "--data", str(tmp_path / "second"), "--listen", listen,
        "--http", f"127.0.0.1:{free_port()}",
    )  # fmt: skip
    assert_refused(result, f"libp2p port 127.0.0.1:{first.p2p_port} is in use (listen {listen})")
    assert_serves(first)


@pytest.mark.slow
def test_a_taken_http_port_is_refused(first: NodeProcess, tmp_path: Path) -> None:
    result = node_run(
        tmp_path, "--data", str(tmp_path / "second"), "--listen", "/ip4/127.0.0.1/tcp/0",
        "--http", f"127.0.0.1:{first.http_port}",
    )  # fmt: skip
    assert_refused(result, f"HTTP port 127.0.0.1:{first.http_port} is in use")
    assert_serves(first)


@pytest.mark.slow
def test_a_data_directory_in_use_is_refused(first: NodeProcess, tmp_path: Path) -> None:
    result = node_run(
        tmp_path, "--data", str(first.data), "--listen", "/ip4/127.0.0.1/tcp/0",
        "--http", f"127.0.0.1:{free_port()}",
    )  # fmt: skip
    assert_refused(result, f"data directory {first.data} is in use by another process")
    assert_serves(first)
