"""The multiaddrs a node is given (``--listen``, ``--bootstrap``), checked before it starts.

Imports multiaddr only, not py-libp2p (1.6 s): config loading runs this before anything
else. What py-libp2p 0.8.1 would do with what we refuse here:

* a listen address that is not /ip4 or /ip6 and /tcp: its TCP transport listens on every
  interface (a /dns4 host) or fails deep in ``host.run`` (no /tcp/);
* a bootstrap address not ending in /p2p/<peer id>: ``info_from_p2p_addr`` raises inside a
  running node's reconnect task, which ends the process; one without /tcp/ is dialled
  forever and never connects.
"""

from __future__ import annotations

from dataclasses import dataclass

from multiaddr import Multiaddr
from multiaddr.exceptions import StringParseError

from node.errors import InvalidAddress
from node.p2p.interfaces import PeerAddress

LISTEN_FORM = "/ip4/HOST/tcp/PORT or /ip6/HOST/tcp/PORT"


@dataclass(frozen=True)
class ListenAddress:
    """Where the libp2p host listens (port 0: one the system picks)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(text: str) -> ListenAddress:
    """``/ip4/HOST/tcp/PORT`` or ``/ip6/HOST/tcp/PORT``, nothing more (``InvalidAddress``)."""
    parts = _components(text)
    names = [name for name, _ in parts]
    if names not in (["ip4", "tcp"], ["ip6", "tcp"]):
        raise InvalidAddress(f"not {LISTEN_FORM}")
    return ListenAddress(parts[0][1], int(parts[1][1]))


def parse_peer_address(text: str) -> PeerAddress:
    """A dialable peer: a /tcp/ port and, last, /p2p/<peer id> (``InvalidAddress``)."""
    parts = _components(text)
    if not parts or parts[-1][0] != "p2p":
        raise InvalidAddress("no /p2p/<peer id> at its end")
    if "tcp" not in (name for name, _ in parts):
        raise InvalidAddress("no /tcp/ port")
    return PeerAddress(text, parts[-1][1])


def _components(text: str) -> list[tuple[str, str]]:
    """(protocol, value) pairs; multiaddr checks each value (port range, IP, peer id)."""
    if not text.startswith("/"):
        raise InvalidAddress("not a multiaddr (no leading /)")
    try:
        return [(protocol.name, value or "") for protocol, value in Multiaddr(text).items()]
    except StringParseError as exc:  # its str() repeats the whole address twice
        raise InvalidAddress(f"not a multiaddr ({exc.message})") from exc
    except ValueError as exc:
        raise InvalidAddress(f"not a multiaddr ({exc})") from exc
