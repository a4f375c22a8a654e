"""Who is in an anti-entropy session with us: one session per peer, a few per direction.

A session holds its peer's one slot from its first frame to its end, whichever side opened
it, so a peer that opens stream after stream (or keeps one silent) occupies one slot, never
the node's anti-entropy. Sessions we answer and sessions we open are counted apart: streams
strangers open can fill only the answering side, and the sessions a node opens to the peers
it chose always find room.

Two nodes that open a session with each other at the same moment would each refuse the
other's (whichever side notices first: the answer to the peer's stream, or the claim of our
own opening after it), and at the same interval keep doing so in lockstep. The crossing is
broken by peer id: the session the lower id opened runs, beside the other one, which is
refused (``CROSSED``: not charged, an honest race) at whichever end notices it. Both ends
compare the same two ids, so they agree without a word. Pure: no trio, no time.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from sync.protocol import SessionRole

BUSY = "busy"  # no slot free in that direction: the node's limit, nobody's fault
DUPLICATE = "duplicate_session"  # the peer is in a session with us already
# a session that crossed one the other way and lost the tie-break (the peer's, or our own
# opening): refused, not charged; a peer whose session lost is told DUPLICATE
CROSSED = "crossed_session"

INITIATOR, RESPONDER = SessionRole.INITIATOR.value, SessionRole.RESPONDER.value
_OTHER = {INITIATOR: RESPONDER, RESPONDER: INITIATOR}


@dataclass(frozen=True)
class SlotStats:
    active: int
    initiator: int
    responder: int


class SessionSlots:
    def __init__(self, per_direction: int, own: str | None = None) -> None:
        self.per_direction = per_direction
        self.own = own  # our peer id, for the crossing's tie-break (None: no tie-break)
        self._held: set[tuple[str, str]] = set()  # (peer, our role)

    def refusal(self, peer: str, role: str) -> str | None:
        """Why a session with ``peer`` in ``role`` (ours) cannot start now; None if it can."""
        held = {r for p, r in self._held if p == peer}
        if held:
            crossing = self.own is not None and held == {_OTHER[role]}
            if not crossing:
                return DUPLICATE
            if not self._lower_opened(peer, role):
                return CROSSED
        if Counter(r for _, r in self._held)[role] >= self.per_direction:
            return BUSY
        return None

    def claim(self, peer: str, role: str) -> str | None:
        """Take ``peer``'s slot for a session in ``role``; the refusal if it cannot start."""
        refused = self.refusal(peer, role)
        if refused is None:
            self._held.add((peer, role))
        return refused

    def holds(self, peer: str) -> bool:
        """Whether some session with ``peer`` runs (we open none beside it: a crossing is a race)."""
        return any(p == peer for p, _ in self._held)

    def release(self, peer: str, role: str) -> None:
        self._held.discard((peer, role))

    def statistics(self) -> SlotStats:
        roles = Counter(r for _, r in self._held)
        return SlotStats(len({p for p, _ in self._held}), roles[INITIATOR], roles[RESPONDER])

    def _lower_opened(self, peer: str, role: str) -> bool:
        """Whether the session we would be in as ``role`` is the one the lower id opened."""
        own: str = self.own  # type: ignore[assignment]
        return own < peer if role == INITIATOR else peer < own
