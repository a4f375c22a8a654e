"""What the rest of ``node/`` sees of libp2p: small typed interfaces, no py-libp2p import.

py-libp2p's own objects satisfy the structural ones (``PeerId``, ``GossipMessage``,
``Subscription``), and so do the in-process replay's stand-ins; the adapter's wrappers
(``node/p2p/host.py``, ``node/p2p/streams.py``) implement the rest and raise only our
exceptions (``node/errors.py``). Importing this module loads no libp2p (1.6 s).
"""

from __future__ import annotations

from collections.abc import Iterable, Sized
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

GOSSIP_PROTOCOL_IDS = ("/meshsub/1.1.0", "/meshsub/1.0.0")
SYNC_PROTOCOL = "/chatsync/sync/1"
PEERS_PROTOCOL = "/chatsync/peers/1"  # peer exchange (node/peers.py)


class PeerKey(Protocol):
    """A peer as a gossip validator is told of it: its raw id."""

    def to_bytes(self) -> bytes: ...


@runtime_checkable
class PeerId(PeerKey, Protocol):
    """A libp2p peer id (py-libp2p's ``ID``): raw bytes and base58 text."""

    def to_base58(self) -> str: ...


class GossipMessage(Protocol):
    """A pubsub message, as a validator or a subscriber reads it."""

    @property
    def from_id(self) -> bytes: ...

    @property
    def seqno(self) -> bytes: ...

    @property
    def data(self) -> bytes: ...


class Subscription(Protocol):
    """The receiving end of a topic subscription."""

    async def get(self) -> GossipMessage: ...


class PeerQueues(Protocol):
    """Pubsub's outbound RPC queues, one per peer (only their sizes are read)."""

    def values(self) -> Iterable[Sized]: ...


class PeerStore(Protocol):
    """What the peer scheduler reads of the peerstore."""

    def has_peer(self, peer: PeerId) -> bool: ...

    def get_protocols(self, peer: PeerId) -> list[str]: ...


class PeerTable(Protocol):
    """Who is connected, and what they speak (the sync scheduler's view of the host)."""

    def get_connected_peers(self) -> list[PeerId]: ...

    def get_peerstore(self) -> PeerStore: ...


class Frames(Protocol):
    """Length-prefixed frames over a stream (``Libp2pFrames``)."""

    async def read_frame(self) -> bytes: ...

    async def write_frame(self, data: bytes) -> None: ...


class PeerStream(Protocol):
    """A stream to or from a peer (``Libp2pStream``)."""

    @property
    def peer_id(self) -> str: ...

    def frames(self, max_frame: int) -> Frames: ...

    async def close(self) -> None: ...

    async def reset(self) -> None: ...


class PeerHost(PeerTable, Protocol):
    """What the peer manager drives: dials, streams, disconnects, forgets (``Libp2pHost``)."""

    @property
    def peer_id(self) -> PeerId: ...

    async def new_stream(self, peer: PeerId, protocol: str, timeout_s: float) -> PeerStream: ...

    def parse_address(self, text: str) -> PeerAddress: ...

    async def dial(self, address: PeerAddress, timeout_s: float) -> None: ...

    async def disconnect(self, peer: PeerId) -> None: ...

    def forget(self, peer: PeerId) -> None: ...


@dataclass(frozen=True)
class PeerAddress:
    """A peer's /p2p/ multiaddr, parsed (``Libp2pHost.parse_address``)."""

    text: str
    peer_id: str  # base58
