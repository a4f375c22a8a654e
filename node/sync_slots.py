"""Who is in an anti-entropy session with us: one session per peer, a few per direction.

A session holds its peer's one slot from its first frame to its end, whichever side opened
it, so a peer that opens stream after stream (or keeps one silent) occupies one slot, never
the node's anti-entropy. Sessions we answer and sessions we open are counted apart: streams
strangers open can fill only the answering side, and the sessions a node opens to the peers
it chose always find room. Pure: no trio, no time.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

BUSY = "busy"  # no slot free in that direction: the node's limit, nobody's fault
DUPLICATE = "duplicate_session"  # the peer is in a session with us already


@dataclass(frozen=True)
class SlotStats:
    active: int
    initiator: int
    responder: int


class SessionSlots:
    def __init__(self, per_direction: int) -> None:
        self.per_direction = per_direction
        self._role_of: dict[str, str] = {}  # peer -> "initiator" / "responder" (our role)

    def refusal(self, peer: str, role: str) -> str | None:
        """Why a session with ``peer`` in ``role`` (ours) cannot start now; None if it can."""
        if peer in self._role_of:
            return DUPLICATE
        if Counter(self._role_of.values())[role] >= self.per_direction:
            return BUSY
        return None

    def claim(self, peer: str, role: str) -> str | None:
        """Take ``peer``'s slot for a session in ``role``; the refusal if it cannot start."""
        refused = self.refusal(peer, role)
        if refused is None:
            self._role_of[peer] = role
        return refused

    def release(self, peer: str) -> None:
        self._role_of.pop(peer, None)

    def statistics(self) -> SlotStats:
        roles = Counter(self._role_of.values())
        return SlotStats(len(self._role_of), roles["initiator"], roles["responder"])
