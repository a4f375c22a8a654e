"""Hostile sync peers against a real node over libp2p on 127.0.0.1 (issue 19).

Before per-peer slots, one silent ``/chatsync/sync/1`` stream, reopened whenever the node
closed it, kept every honest session ``busy``: 0 of 196 honest attempts converged in 60 s."""

from __future__ import annotations

import logging
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import multiaddr
import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr

from node.clock import Clock
from node.metrics import Metrics
from node.p2p import SYNC_PROTOCOL
from node.p2p.host import start_host
from node.p2p.streams import Libp2pFrames
from node.syncer import SyncService
from sync.protocol import SyncConfig
from sync.replica import MemoryReplica

from node_support import JOIN, counts, messages, running_node, store_directly

log = logging.getLogger(__name__)


async def _hold_silent_streams(host: Any, node: ID, opened: list[int]) -> None:
    """Open a sync stream, send nothing, read until the node closes it; open the next at once."""
    while True:
        try:
            stream = await host.new_stream(node, [SYNC_PROTOCOL])
            opened.append(1)
            frames = Libp2pFrames(stream, 1 << 20)
            while True:
                await frames.read_frame()
        except Exception:  # closed, reset, or refused once banned: open the next one
            await trio.sleep(0.01)


async def _honest_sync_until_converged(host: Any, node: ID, name: str) -> tuple[float, Counter]:
    """Seconds until an honest peer's session converges (retrying every 0.3 s), and the
    outcomes of its attempts."""
    replica = MemoryReplica()
    replica.apply_ops([JOIN, *messages(0, 20)])
    sync = SyncService(
        replica, store_directly(replica), Metrics(), clock=Clock.system(), config=SyncConfig()
    )
    started, results = trio.current_time(), Counter[str | None]()
    while True:
        stream = await host.new_stream(node, [SYNC_PROTOCOL])
        outcome = await sync.initiate(name, Libp2pFrames(stream, 1 << 22))
        results[outcome.error] += 1
        if outcome.converged:
            return trio.current_time() - started, results
        await trio.sleep(0.3)


@pytest.mark.slow
async def test_an_honest_session_converges_while_a_peer_holds_silent_streams(
    tmp_path: Path,
) -> None:
    async with running_node(tmp_path) as (node, http), AsyncExitStack() as stack:
        address = multiaddr.Multiaddr(f"{node.listen_addrs[0]}/p2p/{node.peer_id}")
        evil, _ = await start_host(stack, create_new_key_pair(), "/ip4/127.0.0.1/tcp/0", 1)
        good, _ = await start_host(stack, create_new_key_pair(), "/ip4/127.0.0.1/tcp/0", 1)
        for host in (evil, good):
            await host.connect(info_from_p2p_addr(address))
        target, opened = ID.from_base58(node.peer_id), list[int]()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_hold_silent_streams, evil, target, opened)  # one at a time
            await trio.sleep(0.5)
            with trio.fail_after(10):
                took, results = await _honest_sync_until_converged(good, target, node.peer_id)
            log.warning(
                "honest sync converged after %.2f s (%s) beside a silent stream", took, results
            )
            assert took < 3 and (await counts(http))["messages"] == 20
            # three silent streams at once: the 2nd and 3rd are duplicate sessions, 1 point each
            for _ in range(2):
                nursery.start_soon(_hold_silent_streams, evil, target, opened)
            with trio.fail_after(15):
                while evil.get_id().to_base58() not in node.services.blocklist:
                    await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
        assert node.metrics.counter("peers_banned") == 1
        assert good.get_id().to_base58() not in node.services.blocklist
        assert node.metrics.counter("peer_penalties", reason="duplicate_session") >= 1
