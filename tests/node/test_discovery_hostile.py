"""Peer exchange under attack, with a real node and real py-libp2p peers on 127.0.0.1 (issue 32).

A liar that advertises thousands of fake peers, a peer that floods the exchange, one that
answers the ask and then stalls, addresses that accept a TCP connection and never speak:
bounded memory and effort, and the node's honest peer set is unharmed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import multiaddr
import pytest
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr

from node.p2p import PEERS_PROTOCOL
from node.p2p.streams import Libp2pFrames
from sync.peering import HEARD_PER_SOURCE, KnownPeer, decode_peers, encode_ask, encode_peers

from node_support import free_port, running_node

pytestmark = pytest.mark.slow

PEERS = TProtocol(PEERS_PROTOCOL)
Handler = Callable[[Any], Awaitable[None]]


async def _host(stack: AsyncExitStack, handler: Handler | None = None) -> Any:
    """A bare py-libp2p peer listening on 127.0.0.1, serving the exchange with ``handler``."""
    addr = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")
    host = new_host(key_pair=create_new_key_pair(), listen_addrs=[addr])
    await stack.enter_async_context(host.run(listen_addrs=[addr]))
    if handler is not None:
        host.set_stream_handler(PEERS, handler)
    return host


def _address_of(host: Any) -> str:
    return str(host.get_addrs()[0])


def _fake_peers(count: int, port: int) -> list[KnownPeer]:
    """Peers that do not exist, at ``port`` (closed, or a listener that never speaks)."""
    peers = []
    for _ in range(count):
        peer_id = ID.from_pubkey(create_new_key_pair().public_key).to_base58()
        peers.append(KnownPeer(peer_id, (f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer_id}",)))
    return peers


def _metric(text: str, line_start: str) -> float:
    values = [
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start)
    ]
    return sum(values)


async def test_a_liar_advertising_thousands_of_fake_peers_fills_only_its_own_corner(
    tmp_path: Path,
) -> None:
    port = free_port()  # closed again: nothing listens there
    told = [0]

    async def lie(stream: Any) -> None:
        frames = Libp2pFrames(stream, 64 * 1024)
        await frames.read_frame()
        await frames.write_frame(encode_peers(_fake_peers(32, port)))
        told[0] += 32
        await stream.close()

    async with AsyncExitStack() as stack:
        liar = await _host(stack, lie)
        honest_dir, node_dir = tmp_path / "honest", tmp_path / "node"
        honest_dir.mkdir(), node_dir.mkdir()
        async with running_node(honest_dir) as (honest, _):
            honest_addr = f"{honest.listen_addrs[0]}"
            config = {
                "bootstrap": (_address_of(liar) + f"/p2p/{liar.get_id()}", honest_addr),
                "peer_exchange_interval_s": 0.2, "reconnect_min_s": 0.1,
                "reconnect_max_s": 0.5,
            }  # fmt: skip
            async with running_node(node_dir, **config) as (running, http):
                with trio.move_on_after(40):
                    while told[0] < 10 * HEARD_PER_SOURCE:
                        await trio.sleep(0.5)
                book = running.peers.book
                from_liar = [
                    p for p in book.peers.values() if p.source == liar.get_id().to_base58()
                ]
                assert told[0] >= 10 * HEARD_PER_SOURCE
                assert len(from_liar) <= HEARD_PER_SOURCE
                assert honest.peer_id in running.peers.connected()
                assert book.peers[honest.peer_id].tried
                metrics = (await http.get("/metrics")).text
                assert _metric(metrics, 'chatsync_peer_dials_total{result="failed"}') > 0
                assert (await http.get("/status")).status_code == 200


async def test_a_peer_flooding_the_exchange_is_answered_once_per_interval(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (running, http), AsyncExitStack() as stack:
        flooder = await _host(stack)
        node_addr = multiaddr.Multiaddr(running.listen_addrs[0])
        await flooder.connect(info_from_p2p_addr(node_addr))
        node_id = ID.from_base58(running.peer_id)
        answered = refused = 0
        for _ in range(200):
            try:
                stream = await flooder.new_stream(node_id, [PEERS])
                frames = Libp2pFrames(stream, 64 * 1024)
                await frames.write_frame(
                    encode_ask([_address_of(flooder) + f"/p2p/{flooder.get_id()}"])
                )
                decode_peers(await frames.read_frame())
                answered += 1
            except Exception:  # reset by the node: refused
                refused += 1
        assert answered == 1 and refused == 199
        metrics = (await http.get("/metrics")).text
        assert (
            _metric(metrics, 'chatsync_peer_exchanges_total{result="refused",role="answer"}') == 199
        )
        assert len(running.peers._answered_at) <= 4 * running.peers.high + 64
        assert (await http.get("/status")).status_code == 200


async def test_a_peer_that_stalls_the_exchange_or_the_dial_costs_a_timeout_nothing_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("node.peers.EXCHANGE_TIMEOUT_S", 1.0)
    monkeypatch.setattr("node.peers.DIAL_TIMEOUT_S", 1.0)
    silent = trio.socket.socket()  # accepts TCP connections, never says a word
    await silent.bind(("127.0.0.1", 0))
    silent.listen(100)
    silent_port = silent.getsockname()[1]

    async def tell_then_stall(stream: Any) -> None:
        frames = Libp2pFrames(stream, 64 * 1024)
        await frames.read_frame()
        if stalls[0] == 0:  # first: fake peers behind the silent listener
            await frames.write_frame(encode_peers(_fake_peers(8, silent_port)))
            await stream.close()
        stalls[0] += 1
        await trio.sleep_forever()  # then: never answer

    stalls = [0]
    async with AsyncExitStack() as stack:
        staller = await _host(stack, tell_then_stall)
        honest_dir, node_dir = tmp_path / "honest", tmp_path / "node"
        honest_dir.mkdir(), node_dir.mkdir()
        async with running_node(honest_dir) as (honest, _):
            config = {
                "bootstrap": (
                    _address_of(staller) + f"/p2p/{staller.get_id()}", honest.listen_addrs[0]
                ),
                "peer_exchange_interval_s": 0.5, "reconnect_min_s": 0.1, "reconnect_max_s": 0.3,
            }  # fmt: skip
            async with running_node(node_dir, **config) as (running, http):
                await trio.sleep(10)
                metrics = (await http.get("/metrics")).text
                assert honest.peer_id in running.peers.connected()
                assert len(running.peers.dialing) <= 4
                stalled = [
                    p for p in running.peers.book.peers.values() if str(silent_port) in p.addrs[0]
                ]
                assert len(stalled) < 8  # forgotten after 3 failed (timed-out) dials each
                assert (
                    _metric(metrics, 'chatsync_peer_exchanges_total{result="failed",role="ask"}')
                    >= 2
                )
                assert (await http.get("/status")).status_code == 200
    silent.close()
