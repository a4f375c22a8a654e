"""Who may open an inbound connection: a total cap, a per-IP cap, addresses of banned peers.

Pure: no libp2p, no trio. ``node/p2p/inbound.py`` asks ``admit(ip)`` before the security
handshake — the cheapest point to say no, when only the remote IP is known — and calls
``release(ip)`` once that connection has closed. After the handshake it tells us which peer
came from the IP (``remember``), so the next connection from an address that only banned
peers have used is refused before the handshake too. An address shared with a peer in good
standing (a NAT, loopback in tests) is not refused for a ban: that peer's id is refused
after the handshake instead (``node/p2p/inbound.py``).

Memory is bounded: at most ``MAX_IPS`` addresses with ``MAX_PEERS_PER_IP`` peer ids each,
least recently seen forgotten first; an open connection's counter is kept while it lasts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container
from dataclasses import dataclass

MAX_IPS = 10_000
MAX_PEERS_PER_IP = 16

# Refusal reasons (metric labels)
TOO_MANY = "too_many_inbound"
TOO_MANY_FROM_IP = "too_many_from_ip"
BANNED_ADDRESS = "banned_address"


@dataclass(frozen=True)
class AdmissionLimits:
    max_inbound: int = 200  # inbound connections at once, all addresses together
    max_per_ip: int = 16  # inbound connections at once from one IP


class InboundAdmission:
    """Counts open inbound connections per IP; refuses over the caps or from banned addresses."""

    def __init__(self, limits: AdmissionLimits, blocked: Container[str]) -> None:
        self.limits = limits
        self.blocked = blocked  # peer ids (base58) refused: bans and the admin switch
        self._open: dict[str, int] = {}
        self._peers_by_ip: OrderedDict[str, list[str]] = OrderedDict()

    @property
    def open(self) -> int:
        return sum(self._open.values())

    def admit(self, ip: str) -> str | None:
        """Count a new inbound connection from ``ip``; or the reason it is refused (then
        nothing is counted and ``release`` must not be called)."""
        if self.banned_address(ip):
            return BANNED_ADDRESS
        if self.open >= self.limits.max_inbound:
            return TOO_MANY
        if self._open.get(ip, 0) >= self.limits.max_per_ip:
            return TOO_MANY_FROM_IP
        self._open[ip] = self._open.get(ip, 0) + 1
        return None

    def release(self, ip: str) -> None:
        """The connection ``admit`` counted has closed."""
        left = self._open.get(ip, 0) - 1
        if left > 0:
            self._open[ip] = left
        else:
            self._open.pop(ip, None)

    def remember(self, peer: str, ip: str) -> None:
        """``peer`` completed a handshake from ``ip``."""
        peers = self._peers_by_ip.pop(ip, [])
        if peer in peers:
            peers.remove(peer)
        peers.append(peer)
        self._peers_by_ip[ip] = peers[-MAX_PEERS_PER_IP:]
        if len(self._peers_by_ip) > MAX_IPS:
            self._peers_by_ip.popitem(last=False)

    def banned_address(self, ip: str) -> bool:
        """Whether every peer seen from ``ip`` is blocked (and at least one was seen)."""
        peers = self._peers_by_ip.get(ip)
        return bool(peers) and all(peer in self.blocked for peer in peers or ())
