"""Which connected peers we open anti-entropy sessions to: those whose identify lists sync.

A peer that connects but does not speak ``/chatsync/sync/1`` (a plain libp2p node, a
crawler, a hostile one) used to get a stream attempt every interval, forever, each
failure a 7-line ERROR block. Now a session is opened only when the peer's identify
lists the protocol. Right after connecting identify has not answered yet: we wait
``IDENTIFY_GRACE_S`` quietly. A peer skipped for a reason is counted
(``sync_skipped_total{reason}``) and logged once per reason and notice interval
(``Notices``); it is looked at again at the sync interval, or at once if its protocols
change (identify push). Pure: protocols and the time are passed in.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import Enum

from node.notices import Notices

IDENTIFY_GRACE_S = 5.0  # how long a new peer may take to answer identify before it counts
NO_IDENTIFY = "no_identify"
NO_SYNC_PROTOCOL = "no_sync_protocol"


class Verdict(Enum):
    OPEN = "open"  # open a session
    WAIT = "wait"  # identify has not answered yet: look again at the next round
    SKIP = "skip"  # not a sync peer (noted): look again at the next interval


class SyncCandidates:
    """Decides, per connected peer, whether a sync session may be opened to it."""

    def __init__(self, protocol: str, notices: Notices) -> None:
        self.protocol = protocol
        self.notices = notices
        self._first_seen: dict[str, float] = {}
        self._skipped_with: dict[str, frozenset[str]] = {}

    def verdict(self, peer: str, protocols: Collection[str], now: float) -> Verdict:
        first_seen = self._first_seen.setdefault(peer, now)
        if self.protocol in protocols:
            self._skipped_with.pop(peer, None)
            return Verdict.OPEN
        if not protocols and now - first_seen < IDENTIFY_GRACE_S:
            return Verdict.WAIT
        reason = NO_SYNC_PROTOCOL if protocols else NO_IDENTIFY
        self._skipped_with[peer] = frozenset(protocols)
        self.notices.note(peer, reason, "not syncing with %s: %s", peer, reason)
        return Verdict.SKIP

    def protocols_changed(self, peer: str, protocols: Collection[str]) -> bool:
        """Whether ``peer`` was skipped with other protocols than it lists now (identify push)."""
        skipped = self._skipped_with.get(peer)
        return skipped is not None and skipped != frozenset(protocols)

    def keep_only(self, connected: Collection[str]) -> None:
        """Forget the peers that are gone (bounded memory under churn)."""
        for table in (self._first_seen, self._skipped_with):
            for peer in [p for p in table if p not in connected]:
                del table[peer]
