"""Run N node processes on loopback: start, stop, kill, restart, partition, and wait for convergence.

Used by ``chatsync cluster``, the multi-process tests and ``chatsync bench gossip``.
Each node is a real ``chatsync node run`` process (started as ``python -m node.cli run``)
with its own RocksDB directory, libp2p key and HTTP port; node i bootstraps from every
node started before it, or from the first ``bootstrap_nodes`` only (the rest it finds by
peer exchange, as a network's nodes do).
"""

from __future__ import annotations

import base64
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from node.auth import ADMIN_FILE
from store.ops import Op, encode_op, op_kind


def node_config_toml(values: dict[str, Any]) -> str:
    """A ``[node]`` TOML table of scalar settings (int, float, bool, str) and lists of ints
    (``scope_shards``)."""
    lines = ["[node]"]
    for key, value in values.items():
        if isinstance(value, bool):
            rendered = "true" if value else "false"
        elif isinstance(value, int | float):
            rendered = repr(value)
        elif isinstance(value, str):
            rendered = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        elif isinstance(value, list | tuple) and all(type(v) is int for v in value):
            rendered = "[" + ", ".join(str(v) for v in value) + "]"
        else:
            raise TypeError(f"node config {key}: unsupported value {value!r}")
        lines.append(f"{key} = {rendered}")
    return "\n".join(lines) + "\n"


# Ports handed out by this process: a cluster takes all of its ports before its first node
# binds, so a free port must not be handed out twice.
_handed_out: set[int] = set()
LOWEST_PORT = 10_000


def _ephemeral_low() -> int:
    """The first port of the kernel's range for outgoing connections (Linux: 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A loopback TCP port free now and not handed out before, below the ephemeral range.

    Binding port 0 gives a port from the ephemeral range, which any outgoing connection's
    local end may take before the node binds it (earlier nodes dial their peers while later
    ones start: a node then exits on a taken port). Below that range only listeners bind."""
    low = _ephemeral_low()
    for _ in range(1_000 if low > LOWEST_PORT + 1_000 else 0):
        port = random.randrange(LOWEST_PORT, low)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:  # no room below the range on this machine: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class NodeProcess:
    index: int
    data: Path
    p2p_port: int
    http_port: int
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None
    peer_id: str = ""
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.data.parent / f"node{self.index}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def admin_headers(self) -> dict[str, str]:
        """The node's admin token (``admin.token`` beside its database) as a header."""
        token = (self.data / ADMIN_FILE).read_text().strip()
        return {"authorization": f"Bearer {token}"}

    @property
    def multiaddr(self) -> str:
        return f"/ip4/127.0.0.1/tcp/{self.p2p_port}/p2p/{self.peer_id}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Cluster:
    def __init__(
        self,
        nodes: int,
        base_dir: Path,
        *,
        durable: bool = False,
        sync_interval_s: float = 2.0,
        log_level: str = "WARNING",
        node_config: dict[str, Any] | None = None,
        extra_args: list[str] | None = None,
        trace_dir: Path | None = None,
        bootstrap_nodes: int | None = None,
    ) -> None:
        """``node_config``: [node] settings (NodeConfig fields) for every node, passed as a TOML
        file (``--config``); ``extra_args``: more ``chatsync node run`` flags, appended as given;
        ``trace_dir``: every node records its clients' ops to ``trace_dir/node<i>.parquet``."""
        self.base_dir = base_dir
        self.durable = durable
        self.sync_interval_s = sync_interval_s
        self.log_level = log_level
        self.node_config = dict(node_config or {})
        # per node: [node] settings over ``node_config`` (a restart picks up changes here)
        self.node_overrides: dict[int, dict[str, Any]] = {}
        self.extra_args = list(extra_args or [])
        self.trace_dir = trace_dir
        self.bootstrap_nodes = bootstrap_nodes
        # per node: the (earlier) nodes it bootstraps from, instead of the rule above
        self.bootstrap_of: dict[int, list[int]] = {}
        self.nodes = [
            NodeProcess(i, base_dir / f"node{i}", free_port(), free_port(), [])
            for i in range(nodes)
        ]
        self.http = httpx.Client(timeout=30)

    # --- lifecycle ---

    def start(self, timeout_s: float = 60) -> None:
        for node in self.nodes:
            first = node.index if self.bootstrap_nodes is None else self.bootstrap_nodes
            bootstrap = [n.multiaddr for n in self.nodes[: min(node.index, first)]]
            if node.index in self.bootstrap_of:
                bootstrap = [self.nodes[i].multiaddr for i in self.bootstrap_of[node.index]]
            self._spawn(node, bootstrap)
            self._wait_ready(node, timeout_s)

    def _spawn(self, node: NodeProcess, bootstrap: list[str]) -> None:
        node.data.mkdir(parents=True, exist_ok=True)
        args = [
            sys.executable, "-m", "node.cli", "run",
            "--data", str(node.data),
            "--listen", f"/ip4/127.0.0.1/tcp/{node.p2p_port}",
            "--http", f"127.0.0.1:{node.http_port}",
            "--sync-interval", str(self.sync_interval_s),
            "--log-level", self.log_level,
            "--durable" if self.durable else "--no-durable",
        ]  # fmt: skip
        for address in bootstrap:
            args += ["--bootstrap", address]
        values = {**self.node_config, **self.node_overrides.get(node.index, {})}
        if values:
            config_path = node.data.parent / f"node{node.index}.toml"
            config_path.write_text(node_config_toml(values))
            args += ["--config", str(config_path)]
        if self.trace_dir is not None:
            args += ["--trace-out", str(self.trace_dir / f"node{node.index}.parquet")]
        args += self.extra_args
        node.args = args
        log = node.log_path.open("ab")
        node.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=os.getcwd())

    def _wait_ready(self, node: NodeProcess, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not node.alive:
                raise RuntimeError(f"node {node.index} exited; see {node.log_path}")
            try:
                status = self.http.get(f"{node.url}/status", timeout=2).json()
                node.peer_id = status["peer_id"]
                return
            except (httpx.HTTPError, ValueError, KeyError):
                time.sleep(0.2)
        raise TimeoutError(f"node {node.index} not ready after {timeout_s} s; see {node.log_path}")

    def stop(self, index: int, *, kill: bool = False, timeout_s: float = 30) -> None:
        node = self.nodes[index]
        if node.proc is None or not node.alive:
            return
        node.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            node.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:  # a stuck shutdown must not leave a process behind
            node.proc.kill()
            node.proc.wait(timeout=timeout_s)
            raise

    def restart(self, index: int, timeout_s: float = 60) -> None:
        node = self.nodes[index]
        others = [n.multiaddr for n in self.nodes if n.index != index and n.alive]
        self._spawn(node, others)
        self._wait_ready(node, timeout_s)

    def close(self) -> None:
        """Stop every node (SIGTERM; SIGKILL for one that does not stop in time)."""
        stuck = []
        for node in self.nodes:
            try:
                self.stop(node.index)
            except subprocess.TimeoutExpired:
                stuck.append(node.index)
        self.http.close()
        if stuck:
            raise RuntimeError(f"nodes {stuck} did not stop on SIGTERM and were killed")

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- talking to nodes ---

    def post_ops(self, index: int, ops: list[Op]) -> list[bool]:
        body = {
            "ops": [
                {"kind": int(op_kind(op)), "data": base64.urlsafe_b64encode(encode_op(op)).decode()}
                for op in ops
            ]
        }
        response = self.http.post(f"{self.nodes[index].url}/ops", json=body)
        response.raise_for_status()
        new: list[bool] = response.json()["new"]
        return new

    def status(self, index: int) -> dict[str, Any]:
        data: dict[str, Any] = self.http.get(f"{self.nodes[index].url}/status").json()
        return data

    def roots(self, index: int) -> dict[str, tuple[str, int]]:
        domains = self.status(index)["domains"]
        return {name: (d["root"], d["count"]) for name, d in domains.items()}

    def live(self) -> list[int]:
        return [n.index for n in self.nodes if n.alive]

    def converged(self, indexes: list[int] | None = None) -> bool:
        indexes = self.live() if indexes is None else indexes
        roots = [self.roots(i) for i in indexes]
        return all(r == roots[0] for r in roots)

    def wait_converged(self, timeout_s: float = 120, indexes: list[int] | None = None) -> float:
        """Seconds until every given (default: live) node reports the same roots in every domain."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.converged(indexes):
                return time.monotonic() - t0
            time.sleep(0.2)
        raise TimeoutError(f"no convergence within {timeout_s} s")

    def partition(self, index: int) -> None:
        """Cut node ``index`` off: it and every other node drop each other's traffic."""
        self._switch("block", index)

    def heal(self, index: int) -> None:
        self._switch("unblock", index)

    def _switch(self, what: str, index: int) -> None:
        victim = self.nodes[index]
        for node in self.nodes:
            if node.index != index and node.alive:
                for at, peer in ((node, victim), (victim, node)):
                    self.http.post(
                        f"{at.url}/admin/{what}", json={"peer_id": peer.peer_id},
                        headers=at.admin_headers(),
                    ).raise_for_status()  # fmt: skip
