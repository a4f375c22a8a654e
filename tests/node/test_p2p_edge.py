"""The libp2p edge (``node/p2p``): real py-libp2p hosts on 127.0.0.1 fail with our exceptions
only, and no module outside the package imports py-libp2p or multiaddr."""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from node.errors import (
    DialFailed,
    FrameTooLarge,
    InvalidAddress,
    PeerUnreachable,
    ProtocolNotSupported,
    StreamClosed,
    StreamReset,
)
from node.p2p import SYNC_PROTOCOL
from node.p2p.host import Libp2pHost, open_host
from node.p2p.streams import Libp2pStream

ROOT = Path(__file__).resolve().parents[2]
LISTEN = "/ip4/127.0.0.1/tcp/0"
TIMEOUT_S = 10.0
# the import contract's packages (pyproject.toml [tool.importlinter]), and the adapter
SOURCE_PACKAGES = ["store", "sync", "dm3", "node", "sim", "bench", "client", "cluster", "cli"]
ADAPTER = ROOT / "node" / "p2p"


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Libp2pHost, Libp2pHost]]:
    """Two hosts, ``a`` connected to ``b``."""
    async with AsyncExitStack() as stack:
        a, _ = await open_host(stack, None, LISTEN, 1)
        b, _ = await open_host(stack, None, LISTEN, 1)
        await a.dial(a.parse_address(b.listen_addrs()[0]), TIMEOUT_S)
        yield a, b


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_dialling_a_closed_port_is_dial_failed() -> None:
    nobody = ID.from_pubkey(create_new_key_pair().public_key).to_base58()
    async with AsyncExitStack() as stack:
        a, _ = await open_host(stack, None, LISTEN, 1)
        address = a.parse_address(f"/ip4/127.0.0.1/tcp/{_closed_port()}/p2p/{nobody}")
        assert address.peer_id == nobody
        with pytest.raises(DialFailed) as caught:
            await a.dial(address, TIMEOUT_S)
    assert isinstance(caught.value, PeerUnreachable)
    assert caught.value.__cause__ is not None  # py-libp2p's error, kept as the cause


def test_an_address_without_a_peer_id_is_invalid() -> None:
    for text in ("/ip4/127.0.0.1/tcp/4001", "not an address"):
        with pytest.raises(InvalidAddress):
            Libp2pHost.parse_address(text)


async def test_a_protocol_the_peer_does_not_speak_is_protocol_not_supported(
    pair: tuple[Libp2pHost, Libp2pHost],
) -> None:
    a, b = pair
    with pytest.raises(ProtocolNotSupported):
        await a.new_stream(b.peer_id, SYNC_PROTOCOL, TIMEOUT_S)  # b serves no sync


async def test_a_reset_stream_is_stream_reset_or_closed(
    pair: tuple[Libp2pHost, Libp2pHost],
) -> None:
    """py-libp2p 0.8.1 forgets a stream as the peer's RST arrives, so a read after it is often
    told "end of stream": ``StreamClosed`` (``StreamReset`` is one); writing to a stream
    we reset is ``StreamReset``."""
    a, b = pair
    served = trio.Event()

    async def reset_it(stream: Libp2pStream) -> None:
        assert stream.peer_id == a.peer_id.to_base58()
        try:
            await stream.read(1)
        except StreamClosed:  # the second stream: reset by a
            return
        await stream.reset()
        served.set()

    b.set_stream_handler(SYNC_PROTOCOL, "test", reset_it, on_error=pytest.fail)
    stream = await a.new_stream(b.peer_id, SYNC_PROTOCOL, TIMEOUT_S)
    await stream.write(b"x")
    with trio.fail_after(TIMEOUT_S):
        await served.wait()
        with pytest.raises(StreamClosed):
            while True:  # whatever was in flight, then the end
                await stream.read(1024)
    ours = await a.new_stream(b.peer_id, SYNC_PROTOCOL, TIMEOUT_S)
    await ours.reset()
    with pytest.raises(StreamReset):
        await ours.write(b"x")
    await ours.close()  # gone already: nothing to do, nothing raised


@pytest.mark.parametrize("sent", [b"y" * 17, None], ids=["over_the_limit", "closed"])
async def test_frames_end_with_frame_too_large_or_stream_closed(
    pair: tuple[Libp2pHost, Libp2pHost], sent: bytes | None
) -> None:
    a, b = pair
    received: list[type[Exception]] = []

    async def small_frames(stream: Libp2pStream) -> None:
        try:
            await stream.frames(16).read_frame()
        except StreamClosed as exc:
            received.append(type(exc))

    b.set_stream_handler(SYNC_PROTOCOL, "test", small_frames, on_error=pytest.fail)
    stream = await a.new_stream(b.peer_id, SYNC_PROTOCOL, TIMEOUT_S)
    if sent is not None:
        await stream.frames(1024).write_frame(sent)
    await stream.close()
    with trio.fail_after(TIMEOUT_S):
        while not received:
            await trio.sleep(0.05)
    # over the limit: refused from its length, unread; an end of stream is no frame too large
    assert received == [FrameTooLarge if sent is not None else StreamClosed]


async def test_a_failing_handler_resets_its_stream_and_is_reported(
    pair: tuple[Libp2pHost, Libp2pHost],
) -> None:
    a, b = pair
    errors: list[str] = []

    async def broken(stream: Libp2pStream) -> None:
        await stream.read(1)  # the opener's negotiation is over
        raise RuntimeError("a bug in a handler")

    b.set_stream_handler(SYNC_PROTOCOL, "test", broken, on_error=errors.append)
    stream = await a.new_stream(b.peer_id, SYNC_PROTOCOL, TIMEOUT_S)
    await stream.write(b"x")
    with trio.fail_after(TIMEOUT_S), pytest.raises(StreamClosed):
        while True:
            await stream.read(1024)
    assert errors == ["RuntimeError"]  # and this process is still running


# --- the contract ---


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_adapter_imports_libp2p_or_multiaddr() -> None:
    """The same rule as the import contract, read from the source (lazy imports included)."""
    offenders = [
        str(path.relative_to(ROOT))
        for package in SOURCE_PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if ADAPTER not in path.parents and _imports(path) & {"libp2p", "multiaddr"}
    ]
    assert offenders == []
    assert _imports(ADAPTER / "host.py") >= {"libp2p", "multiaddr"}  # the walk sees imports


def test_the_import_contract_holds() -> None:
    out = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert "Only node.p2p imports libp2p or multiaddr KEPT" in out.stdout, out.stdout + out.stderr


def test_the_interfaces_load_no_libp2p() -> None:
    """What code above the edge imports of it (and the in-process replay) stays light."""
    code = (
        "import sys, node.p2p, node.errors, node.services, node.framing, node.syncer\n"
        "print([m for m in ('libp2p', 'multiaddr') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
