"""Stopping: a node stops promptly even when py-libp2p's shielded cleanup waits on a service.

py-libp2p resets a stream whose protocol negotiation was cut short inside a shielded
scope, and the reset needs the connection's write lock. Under load that lock is held by
pubsub's sender, blocked writing to a peer that reads slowly, and the sender lets go only
when its service is cancelled. Seen in ``chatsync bench gossip``: a node that did not stop
on SIGTERM with one of its sync sessions parked in that reset.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import multiaddr
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.peerinfo import info_from_p2p_addr

from node.config import NodeConfig
from node.node import Node
from node.p2p.host import start_host

STOP_WITHIN_S = 10.0


def write_lock(host: Any, peer: Any) -> trio.Lock:
    """The write lock of ``host``'s yamux connection to ``peer``."""
    (conn, *_) = host.get_network().connections[peer]
    lock: trio.Lock = conn.muxed_conn._write_lock
    return lock


async def hold(lock: trio.Lock, held: trio.Event) -> None:
    async with lock:
        held.set()
        await trio.sleep_forever()


async def test_a_sync_stuck_in_a_shielded_stream_reset_does_not_keep_the_node_running(
    tmp_path: Path,
) -> None:
    node = Node(
        NodeConfig(
            data=str(tmp_path / "node"), listen="/ip4/127.0.0.1/tcp/0", http="",
            sync_interval_s=3600, sync_idle_timeout_s=60,
        )
    )  # fmt: skip
    stopped = trio.Event()

    async def run_node(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await node.run(task_status=task_status)
        stopped.set()

    async with AsyncExitStack() as stack:
        slow, _ = await start_host(stack, create_new_key_pair(), "/ip4/127.0.0.1/tcp/0", 1)
        async with trio.open_nursery() as nursery:
            running = await nursery.start(run_node)
            await slow.connect(info_from_p2p_addr(multiaddr.Multiaddr(running.listen_addrs[0])))
            # The slow peer answers nothing: its write lock to us is held from the start, so
            # the node's first sync with it waits in protocol negotiation.
            slow_writes = trio.Event()
            nursery.start_soon(hold, write_lock(slow, running.host.get_id()), slow_writes)
            await trio.sleep(1.5)  # the scheduler starts a sync with every new peer within 0.25 s
            # A task of the node's pubsub service takes the node's write lock, as its sender
            # does while blocked on a peer that reads slowly; it lets go only when cancelled.
            sender_holds = trio.Event()
            running.pubsub.manager.run_task(
                hold, write_lock(running.host, slow.get_id()), sender_holds
            )
            await sender_holds.wait()
            assert not running.services.sync.last_sync  # still negotiating
            node.stop()
            with trio.move_on_after(STOP_WITHIN_S) as waited:
                await stopped.wait()
            if waited.cancelled_caught:  # unstick it, so that the test fails instead of hanging
                running.pubsub.manager.cancel()
            nursery.cancel_scope.cancel()
    assert not waited.cancelled_caught, f"the node did not stop within {STOP_WITHIN_S} s"
