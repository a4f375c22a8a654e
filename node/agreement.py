"""Which peers hold the same Merkle roots as this node, as far as it can tell.

A sync session that ends converged (``SyncOutcome.converged``: its last HELLO found every
root equal) is the one moment a node knows a peer's roots: they were its own. So per peer
we keep the roots of its last converged session and when it ended; the peer agrees now if
those are still our roots. A node learns nothing new of a peer it cannot reach: a cut-off
peer shows the roots it had when they last agreed and how long ago that was — what an
operator needs to see a partition, and what ``/metrics`` exports for Prometheus.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

Roots = dict[str, str]  # domain name -> root digest, hex

MAX_PEERS = 256  # the peer book's tried table: peers we can have synced with


@dataclass(frozen=True)
class Agreement:
    roots: Roots
    at_ms: int


class PeerAgreement:
    """The last agreement with each peer, the most recent ``capacity`` peers."""

    def __init__(self, capacity: int = MAX_PEERS) -> None:
        self.capacity = capacity
        self._last: OrderedDict[str, Agreement] = OrderedDict()

    def matched(self, peer: str, roots: Roots, now_ms: int) -> None:
        """A session with ``peer`` ended with equal roots: ``roots`` are ours now."""
        self._last[peer] = Agreement(dict(roots), now_ms)
        self._last.move_to_end(peer)
        while len(self._last) > self.capacity:
            self._last.popitem(last=False)

    def last(self, peer: str) -> Agreement | None:
        return self._last.get(peer)

    def peers(self) -> list[str]:
        return list(self._last)

    def seconds_since(self, now_ms: int) -> dict[str, float]:
        """Per peer: seconds since its roots last equalled ours."""
        return {peer: max(0, now_ms - a.at_ms) / 1000 for peer, a in self._last.items()}


def root_gauge(root_hex: str) -> float:
    """A root as a number Prometheus can compare across nodes: its first 48 bits (exact in a
    float64; a false match needs a 48-bit collision)."""
    return float(int(root_hex[:12], 16))


@dataclass(frozen=True)
class LastSession:
    result: str  # "converged", "not_converged" or the error's reason
    ended_ms: int


def peer_rows(
    ours: Roots,
    agreement: PeerAgreement,
    connected: set[str],
    blocked: set[str],
    sessions: dict[str, LastSession],
    now_ms: int,
) -> list[dict[str, object]]:
    """One row per peer this node knows (connected, blocked, synced or agreed with): the
    roots it last agreed on, whether they are still ours, and its last session."""
    rows: list[dict[str, object]] = []
    for peer in sorted(connected | blocked | set(sessions) | set(agreement.peers())):
        last, session = agreement.last(peer), sessions.get(peer)
        rows.append(
            {
                "peer_id": peer,
                "connected": peer in connected,
                "blocked": peer in blocked,
                "roots": last.roots if last else None,
                "agrees": last is not None and last.roots == ours,
                "agreed_ms_ago": now_ms - last.at_ms if last else None,
                "last_session": None
                if session is None
                else {"result": session.result, "ms_ago": now_ms - session.ended_ms},
            }
        )
    return rows
