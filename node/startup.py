"""What ``Node.run`` checks before it takes anything: its addresses parse (config loading
checked those of the command line; a ``NodeConfig`` made in code is checked here), and the
libp2p and HTTP ports are free.

py-libp2p 0.8.1's TCP transport binds with SO_REUSEPORT (for hole punching), so a second
node on a taken port starts silently and two peer ids answer on it, each getting some of
the connections; hypercorn fails only once the rest has started. A bind of each address
without SO_REUSEPORT, closed at once, fails in both cases. It leaves a moment in which
another process may take the port; this catches mistakes, not races.
"""

from __future__ import annotations

import errno
import socket

from node.config import NodeConfig, check_addresses
from node.errors import PortInUse, StartupRefused
from node.p2p.addresses import ListenAddress, parse_listen


def check_startup(config: NodeConfig) -> None:
    """``StartupRefused`` if an address is malformed, or cannot be bound."""
    check_addresses(config, named=lambda key: key)
    refuse_taken_ports(config)


def refuse_taken_ports(config: NodeConfig) -> None:
    """``StartupRefused`` if the libp2p or the HTTP address cannot be bound."""
    listen = parse_listen(config.listen)
    _probe("libp2p", listen.host, listen.port, f" (listen {config.listen})")
    if config.http:
        host, port = config.http_host_port
        given = "" if config.http == f"{host}:{port}" else f" (http {config.http})"
        _probe("HTTP", host, port, given)


def _probe(what: str, host: str, port: int, given: str) -> None:
    """Bind ``(host, port)`` and close. Port 0 too: it finds a host that is not ours."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # as hypercorn and py-libp2p do: a port in TIME_WAIT from the last run is free, one
        # a socket listens on is not
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            shown = str(ListenAddress(host, port))  # an HTTP server listens too
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(f"{what} port {shown} is in use{given}") from exc
            reason = exc.strerror or str(exc)
            raise StartupRefused(
                f"{what} address {shown} cannot be bound: {reason}{given}"
            ) from exc
