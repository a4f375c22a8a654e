"""Who is in an anti-entropy session with us: one session per peer, a few per direction.

A session holds its peer's one slot from its first frame to its end, whichever side opened
it, so a peer that opens stream after stream (or keeps one silent) occupies one slot, never
the node's anti-entropy. Sessions we answer and sessions we open are counted apart: streams
strangers open can fill only the answering side, and the sessions a node opens to the peers
it chose always find room.

Two nodes that open a session with each other at the same moment would each refuse the
other's, and at a short interval on a busy machine keep doing so. The crossing is broken by
peer id: the session opened by the lower id runs; the higher id answers it beside its own
opening, which the lower one refuses (``CROSSED``: not charged, an honest race). Both sides
compare the same two ids, so they agree without a word. Pure: no trio, no time.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

BUSY = "busy"  # no slot free in that direction: the node's limit, nobody's fault
DUPLICATE = "duplicate_session"  # the peer is in a session with us already
# the peer's session crossed the one we opened, and ours wins the tie-break: refused (the
# peer is told DUPLICATE), not charged
CROSSED = "crossed_session"

INITIATOR, RESPONDER = "initiator", "responder"


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
        roles = {r for p, r in self._held if p == peer}
        if roles and not self._yields(peer, role, roles):
            return CROSSED if self._crossed(peer, role, roles) else DUPLICATE
        if Counter(r for _, r in self._held)[role] >= self.per_direction:
            return BUSY
        return None

    def claim(self, peer: str, role: str) -> str | None:
        """Take ``peer``'s slot for a session in ``role``; the refusal if it cannot start."""
        refused = self.refusal(peer, role)
        if refused is None:
            self._held.add((peer, role))
        return refused

    def release(self, peer: str, role: str) -> None:
        self._held.discard((peer, role))

    def statistics(self) -> SlotStats:
        roles = Counter(r for _, r in self._held)
        return SlotStats(len({p for p, _ in self._held}), roles[INITIATOR], roles[RESPONDER])

    def _crossed(self, peer: str, role: str, roles: set[str]) -> bool:
        """The peer opens a session while ours with it is being opened."""
        return self.own is not None and role == RESPONDER and roles == {INITIATOR}

    def _yields(self, peer: str, role: str, roles: set[str]) -> bool:
        """A crossing the peer wins (its id is the lower): answer it beside our opening."""
        return self._crossed(peer, role, roles) and peer < self.own  # type: ignore[operator]
