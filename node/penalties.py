"""Misbehaving peers: penalty points, bans, and the blocklist that enforces them.

``PeerPenalties`` (pure, time passed in) adds points per misbehaviour, decaying with
time; at the threshold the peer is banned for ``ban_s``. ``PeerJudge`` turns what the
sync service and the gossip validator report into points (the tables below) and a ban
into an entry of the ``Blocklist`` — the same list the admin partition switch
(``POST /admin/block``) writes. Traffic of a blocked peer is dropped at once (gossip it
sent or forwarded, its sync streams); ``PeerManager`` hangs up on it at its next round
(within 0.25 s) and does not dial it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from node.clock import Clock
from node.metrics import Metrics
from node.p2p.ids import peer_id_text

if TYPE_CHECKING:
    from node.syncer import SyncOutcome

log = logging.getLogger(__name__)


@dataclass
class PeerScore:
    points: float = 0.0
    updated: float = 0.0
    banned_until: float = 0.0


class PeerPenalties:
    """Misbehaviour points per peer, decaying by ``decay_per_s``; at ``threshold`` a ban of ``ban_s``."""

    def __init__(
        self, threshold: float = 10.0, decay_per_s: float = 0.05, ban_s: float = 600.0
    ) -> None:
        self.threshold = threshold
        self.decay_per_s = decay_per_s
        self.ban_s = ban_s
        self.scores: dict[str, PeerScore] = {}

    def penalize(self, peer: str, points: float, now: float) -> bool:
        """Add points; True if this pushed the peer over the threshold (ban it now)."""
        score = self.scores.setdefault(peer, PeerScore(updated=now))
        score.points = max(0.0, score.points - (now - score.updated) * self.decay_per_s) + points
        score.updated = now
        if score.points >= self.threshold and score.banned_until <= now:
            score.banned_until = now + self.ban_s
            score.points = 0.0
            return True
        return False

    def expired_bans(self, now: float) -> list[str]:
        """Peers whose ban has run out (their score is forgotten)."""
        done = [p for p, s in self.scores.items() if 0 < s.banned_until <= now]
        for peer in done:
            del self.scores[peer]
        return done


# Points per sync outcome: a peer that sends invalid or forged data loses standing fast;
# one that keeps offering records that change nothing (stale replays) loses it slowly.
SYNC_PENALTY = {
    "bad_signature": 5.0,
    "unauthorized": 5.0,
    "invalid_record": 5.0,
    "unsolicited": 5.0,
    "malformed_frame": 3.0,
    "unexpected_frame": 3.0,
    "bad_flags": 3.0,
    "bad_hashes": 3.0,
    "bad_cells": 3.0,
    "too_many_items": 3.0,
    "rate_limited": 2.0,
    "oversize_frame": 3.0,  # a length prefix over the frame limit: an honest peer knows it
    # silent past the idle timeout: a slot held for nothing (an honest peer that crashed
    # mid-session pays once; one that stalls again and again is banned at the 5th)
    "timeout": 2.0,
    # a session opened while it had one with us already: one probe costs little, a stream of
    # them a ban (two honest peers opening at the same moment pay once, rarely)
    "duplicate_session": 1.0,
    "useless": 1.0,  # records received, none new (and no other session applied any meanwhile)
}
# Not charged: "busy" (every slot of the direction taken: the node's limit, nobody's fault),
# "stream_closed" (a peer that shut down), "peer_abort" (the peer's own verdict).


# Points per gossip message the validator refused, charged to the peer that forwarded it.
# An honest forwarder ran the same checks before forwarding, but it cannot know our clock or
# our token buckets: a message a little ahead of our clock, or over an author's rate here,
# costs nothing (an honest relay sends those too). A stamp beyond twice the allowed drift is
# no clock difference: it costs as much as a forgery.
GOSSIP_PENALTY = {
    "bad_signature": 5.0,
    "unauthorized": 5.0,
    "far_future": 5.0,
    "clock_drift": 0.0,
    "rate_limited": 0.0,
    "nothing_new": 0.0,  # a replay of ops we hold: dropped, not forwarded; spends budget
    "blocked_peer": 0.0,  # the forwarder is blocked already
    "blocked_origin": 0.0,  # an honest relay cannot know whom we blocked
    # Over its budget for gossip that brought nothing (node/limits.py:GossipWaste): only a
    # peer that sent ~10 s worth of refused messages gets here; a flood then ends in a ban.
    "throttled": 0.5,
    "internal": 0.0,  # our bug, not theirs
}
GOSSIP_PENALTY_OTHER = 3.0  # malformed, oversized, unknown kinds


class Blocklist:
    """Peer ids (base58) whose traffic is dropped: banned peers and admin partitions."""

    def __init__(self) -> None:
        self._peers: set[str] = set()

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._peers

    def __len__(self) -> int:
        return len(self._peers)

    def add(self, peer_id: str) -> None:
        self._peers.add(peer_id)

    def discard(self, peer_id: str) -> None:
        self._peers.discard(peer_id)

    def sorted(self) -> list[str]:
        return sorted(self._peers)

    def has_bytes(self, peer_id: bytes) -> bool:
        """Whether the peer whose libp2p id is ``peer_id`` (raw bytes) is blocked."""
        if not self._peers or not peer_id:
            return False
        return peer_id_text(peer_id) in self._peers  # loads libp2p once someone is blocked


class PeerJudge:
    """Charges peers for what the sync service and the gossip validator report; bans them."""

    def __init__(
        self, penalties: PeerPenalties, blocklist: Blocklist, metrics: Metrics, clock: Clock
    ) -> None:
        self.penalties = penalties
        self.blocklist = blocklist
        self.metrics = metrics
        self.clock = clock

    def sync_ended(self, outcome: SyncOutcome) -> None:
        reason = "useless" if outcome.useless else outcome.error
        points = SYNC_PENALTY.get(reason or "", 0.0)
        if points:
            self.punish(outcome.peer, points, reason or "")

    def gossip_rejected(self, peer: str, reason: str) -> None:
        """A gossip message ``peer`` forwarded was refused for ``reason``."""
        points = GOSSIP_PENALTY.get(reason, GOSSIP_PENALTY_OTHER)
        if points:
            self.punish(peer, points, f"gossip_{reason}")

    def punish(self, peer: str, points: float, reason: str) -> None:
        """Count a misbehaviour; past the threshold the peer is banned (blocked) for ban_s."""
        self.metrics.inc("peer_penalties", reason=reason, help="misbehaviour points given to peers")
        if self.penalties.penalize(peer, points, self.clock.now()):
            log.warning("banning peer %s for %.0f s (last: %s)", peer, self.penalties.ban_s, reason)
            self.metrics.inc("peers_banned", help="peers banned for misbehaviour")
            self.blocklist.add(peer)

    def lift_expired_bans(self) -> list[str]:
        """Unblock the peers whose ban has run out; they are returned."""
        lifted = self.penalties.expired_bans(self.clock.now())
        for peer in lifted:
            self.blocklist.discard(peer)
        return lifted
