"""Inbound connections at the swarm's edge: admitted before the handshake, released when closed.

py-libp2p 0.8.1's swarm takes an inbound slot (``_inbound_limiter``, max_connections −
min_connections = 250) per connection and, after a successful upgrade, holds it until
the *swarm* stops (``await self.manager.wait_finished()`` in
``Swarm._do_handle_inbound_connection``): after 250 peers had connected and hung up,
every new inbound connection — honest ones too — was refused until a restart. We put
our own handler in that method's place (``install``): it

1. asks ``InboundAdmission`` (``node/admission.py``) before the security handshake,
   knowing only the remote IP: total and per-IP caps, addresses only banned peers used;
2. runs the swarm's own upgrade (security, muxer, ``add_conn``);
3. refuses a blocked peer id now that it is known (an address shared with honest peers);
4. holds the slot until *that* connection closes, then releases both counters.

The swarm's ``_handle_inbound_connection`` still wraps us with its limiter, which our
return now releases. Connections that arrive already multiplexed (QUIC; we listen on TCP
only) go to the original method. Library errors end the connection here, logged once
per address and reason (``Notices``); nothing escapes into the listener.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Container
from typing import Any

from libp2p.abc import IMuxedConn
from libp2p.network.connection.raw_connection import RawConnection

from node.admission import AdmissionLimits, InboundAdmission
from node.notices import Notices
from node.p2p.errors import LIBP2P_ERRORS
from node.p2p.host import Libp2pHost

log = logging.getLogger(__name__)

BLOCKED_PEER = "blocked_peer"  # refusal reason: a blocked peer id, after the handshake
UPGRADE_FAILED = "upgrade_failed"


class InboundGuard:
    """Our replacement for the swarm's inbound connection handler (see the module doc)."""

    def __init__(
        self,
        swarm: Any,
        admission: InboundAdmission,
        blocked: Container[str],
        notices: Notices,
    ) -> None:
        self.swarm = swarm
        self.admission = admission
        self.blocked = blocked
        self.notices = notices
        self._original = swarm._do_handle_inbound_connection

    def install(self) -> None:
        self.swarm._do_handle_inbound_connection = self.handle

    async def handle(self, read_write_closer: Any, maddr: Any, failure_event: Any) -> None:
        if isinstance(read_write_closer, IMuxedConn):
            await self._original(read_write_closer, maddr, failure_event)
            return
        ip = _remote_ip(read_write_closer)
        refusal = self.admission.admit(ip)
        if refusal is not None:
            self.notices.note(ip, refusal, "inbound connection from %s refused: %s", ip, refusal)
            await _close(read_write_closer)
            return
        try:
            await self._upgrade_and_hold(RawConnection(read_write_closer, False), maddr, ip)
        except Exception as exc:  # our bug: never into the listener; end this connection
            log.warning("inbound connection from %s failed: %s: %s", ip, type(exc).__name__, exc)
            self.notices.metrics.inc("handler_errors", kind="inbound")
            await _close(read_write_closer)
        finally:
            self.admission.release(ip)

    async def _upgrade_and_hold(self, raw_conn: RawConnection, maddr: Any, ip: str) -> None:
        try:
            muxed = await self.swarm.upgrade_inbound_raw_conn(raw_conn, maddr)
        except LIBP2P_ERRORS as exc:  # the swarm closed it: a failed handshake, over a cap
            log.debug("inbound upgrade from %s failed: %s", ip, exc)
            self.notices.count(UPGRADE_FAILED)
            return
        peer = muxed.peer_id.to_base58()
        self.admission.remember(peer, ip)
        if peer in self.blocked:
            self.notices.note(peer, BLOCKED_PEER, "inbound from blocked peer %s refused", peer)
            await _close(muxed)
            return
        await self._closed(muxed)

    async def _closed(self, muxed: Any) -> None:
        """Wait until the swarm's connection over ``muxed`` has closed."""
        for conn in self.swarm.get_connections(muxed.peer_id):
            if conn.muxed_conn is muxed:
                await conn.event_closed.wait()
                return


def _remote_ip(read_write_closer: Any) -> str:
    with contextlib.suppress(*LIBP2P_ERRORS):
        remote = read_write_closer.get_remote_address()
        if remote is not None:
            return str(remote[0])
    return "unknown"


async def _close(closable: Any) -> None:
    """Close a connection we refuse; it may be half gone already."""
    with contextlib.suppress(*LIBP2P_ERRORS):
        await closable.close()


def guard_inbound(
    host: Libp2pHost, limits: AdmissionLimits, blocked: Container[str], notices: Notices
) -> InboundGuard:
    """Put an ``InboundGuard`` with ``limits`` in place of ``host``'s swarm handler."""
    swarm = host.raw.get_network()
    guard = InboundGuard(swarm, InboundAdmission(limits, blocked), blocked, notices)
    guard.install()
    return guard
