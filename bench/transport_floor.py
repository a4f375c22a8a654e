"""The floor under ``chatsync bench gossip``: what py-libp2p and ed25519 alone cost per op.

transport  N bare peers — ``node.p2p.host.open_host``, so the node's own GossipSub settings —
           fully connected on loopback, publish the bytes the nodes gossip: envelopes of
           ``ops_per_message`` real signed ops (``encode_ops``) at ``rate`` ops/s in all, for
           ``seconds``. Their validator accepts every message unread: no decoding, no
           signature checks, no RocksDB, no HTTP. CPU per op per peer (/proc: utime+stime of
           each peer process, from the first publish until every peer has every message).
verify     ``validate_op`` (what a node runs on each op it did not make: schema, HLC drift,
           ed25519 signature) on the same ops, in this process: CPU per op.

A node does both for every op (and the rest: decoding, writing, Merkle trees, the API), so
``rate x nodes x (transport + verify)`` CPU-seconds per second is a lower bound on the
cores the nodes need at that rate.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import trio

from bench.machine import process_cpu_s
from node.gossip.settings import OPS_TOPIC
from node.p2p.host import open_host
from store import Hlc, MsgV1
from store.ingress import validate_op
from store.ops import Op, encode_ops
from store.signing import key_from_seed

SETTLE_S = 4.0  # after the last peer is up: connections and GossipSub meshes form
DRAIN_TIMEOUT_S = 60.0
DIAL_TIMEOUT_S = 60.0  # a bootstrap peer of this run: up already, on a loaded machine


@dataclass(frozen=True)
class FloorParams:
    peers: int = 5
    rate: int = 2000  # ops/s, all peers together
    seconds: float = 10.0
    ops_per_message: int = 128
    payload: int = 200


def sample_ops(count: int, payload: int) -> list[Op]:
    """``count`` signed messages like the gossip bench's (16 authors, HLCs near now)."""
    keys = [key_from_seed(bytes([0xF0, n]) + bytes(30)) for n in range(16)]
    now = int(time.time() * 1000)
    chat = bytes([0xB0]) + bytes(31)
    return [
        MsgV1.create(keys[n % 16], chat, Hlc(now, n), bytes([n % 256]) * payload)
        for n in range(count)
    ]


def verify_us_per_op(ops: list[Op], rounds: int = 5) -> float:
    """CPU µs per op of the node's check of a gossiped op (the best of ``rounds``)."""
    now = int(time.time() * 1000)
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for op in ops:
            validate_op(op, now_ms=now, max_offset_ms=60_000)
        best = min(best, time.process_time() - start)
    return best / len(ops) * 1e6


# --- one peer (a child process) ------------------------------------------------------------


async def _peer(cfg: dict[str, Any]) -> None:
    envelope = encode_ops(sample_ops(cfg["ops_per_message"], cfg["payload"]))
    expected = cfg["messages_per_peer"] * (cfg["peers"] - 1)
    received = 0
    all_in = trio.Event()
    async with AsyncExitStack() as stack:
        host, pubsub = await open_host(stack, None, "/ip4/127.0.0.1/tcp/0", 1)  # a new identity
        pubsub.set_validator(OPS_TOPIC, lambda forwarder, msg: True)
        subscription = await pubsub.subscribe(OPS_TOPIC)
        me = host.peer_id.to_bytes()
        for addr in cfg["bootstrap"]:
            await host.dial(host.parse_address(addr), DIAL_TIMEOUT_S)
        print(json.dumps({"addr": host.listen_addrs()[0]}), flush=True)
        start_at = float(await trio.to_thread.run_sync(sys.stdin.readline))

        async def count() -> None:
            nonlocal received
            while received < expected:
                msg = await subscription.get()
                received += bytes(msg.from_id) != me  # our own publishes come back too
            all_in.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(count)
            interval = cfg["seconds"] / cfg["messages_per_peer"]
            for n in range(cfg["messages_per_peer"]):
                await trio.sleep(max(0.0, start_at + n * interval - time.time()))
                await pubsub.publish(OPS_TOPIC, envelope)
            with trio.move_on_after(DRAIN_TIMEOUT_S):
                await all_in.wait()
            print(json.dumps({"received": received, "expected": expected}), flush=True)
            await trio.sleep(2)  # let the others finish reading before this peer goes away
            nursery.cancel_scope.cancel()


# --- the driver ---------------------------------------------------------------------------


def run_transport_floor(params: FloorParams) -> dict[str, Any]:
    """Start the peers, publish, wait until every peer has every message; the figures."""
    messages_per_peer = max(
        1, round(params.rate * params.seconds / params.ops_per_message / params.peers)
    )
    cfg = {
        "peers": params.peers,
        "seconds": params.seconds,
        "ops_per_message": params.ops_per_message,
        "payload": params.payload,
        "messages_per_peer": messages_per_peer,
    }
    procs: list[subprocess.Popen[str]] = []
    addrs: list[str] = []
    try:
        for _ in range(params.peers):  # each connects to those before it: a full mesh
            child = {**cfg, "bootstrap": list(addrs)}
            proc = subprocess.Popen(
                [sys.executable, "-m", "bench.transport_floor", json.dumps(child)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(proc)
            assert proc.stdout is not None
            addrs.append(json.loads(proc.stdout.readline())["addr"])
        start_at = time.time() + SETTLE_S
        for proc in procs:  # one start time for all
            assert proc.stdin is not None
            proc.stdin.write(f"{start_at}\n")
            proc.stdin.flush()
        time.sleep(max(0.0, start_at - time.time()))
        cpu0 = [process_cpu_s(p.pid) for p in procs]
        results = []
        for proc in procs:
            assert proc.stdout is not None
            results.append(json.loads(proc.stdout.readline()))
        done_s = time.time() - start_at
        cpu = sum(process_cpu_s(p.pid) - c for p, c in zip(procs, cpu0, strict=True))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    ops = messages_per_peer * params.peers * params.ops_per_message
    sample = sample_ops(params.ops_per_message, params.payload)
    return {
        "peers": params.peers,
        "ops": ops,
        "ops_per_message": params.ops_per_message,
        "message_bytes": len(encode_ops(sample)),
        "seconds_until_all_received": done_s,
        "all_received": all(r["received"] >= r["expected"] for r in results),
        "transport_us_per_op_per_peer": cpu / (ops * params.peers) * 1e6,
        "verify_us_per_op": verify_us_per_op(sample),
    }


if __name__ == "__main__":
    trio.run(_peer, json.loads(sys.argv[1]))
