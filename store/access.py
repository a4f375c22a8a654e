"""Who may post: a message's fate as a function of the chat's member ops. Pure.

Every replica keeps every signed, authorized member op of a chat (a grow-only
set, the MEMBERS sync domain). For one (chat, user), take the ops stamped at or
before ``t``: the user is **active at t** iff the greatest add stamp exists and
beats the greatest remove/leave stamp (a tie goes to the remove) — the member
row's own rule, applied to the ops up to ``t``.

A group message ``m`` is

* **admissible** iff its sender has an add op stamped at or before ``m.hlc``.
  Only admissible messages are stored and replicated. More ops never make a
  message inadmissible, so every replica ends up storing the same set;
* **visible** iff its sender is active at ``m.hlc``. A removal that arrives
  later hides the messages stamped after it; a later re-add shows them again.
  Reads show visible messages only.

A DM (its ops carry a ``DmProof``) admits and shows the messages of its two
parties. A message whose chat or sender has no fitting op yet waits
(``store.waiting``) — it is neither refused nor stored.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass

from store.hlc import Hlc
from store.records import MsgV1


@dataclass(frozen=True, slots=True)
class MemberHistory:
    """The stamps of one (chat, user)'s member ops, each tuple sorted."""

    adds: tuple[Hlc, ...] = ()
    removes: tuple[Hlc, ...] = ()  # removes and leaves

    @classmethod
    def of(cls, stamps: Iterable[tuple[Hlc, bool]]) -> MemberHistory:
        """From (stamp, is_add) pairs in any order, duplicates allowed."""
        adds: set[Hlc] = set()
        removes: set[Hlc] = set()
        for stamp, is_add in stamps:
            (adds if is_add else removes).add(stamp)
        return cls(tuple(sorted(adds)), tuple(sorted(removes)))

    def with_op(self, stamp: Hlc, is_add: bool) -> MemberHistory:
        if is_add:
            return MemberHistory(tuple(sorted({*self.adds, stamp})), self.removes)
        return MemberHistory(self.adds, tuple(sorted({*self.removes, stamp})))

    def first_add(self) -> Hlc | None:
        return self.adds[0] if self.adds else None

    def active_at(self, t: Hlc) -> bool:
        adds = bisect_right(self.adds, t)
        if adds == 0:
            return False
        removes = bisect_right(self.removes, t)
        return removes == 0 or self.removes[removes - 1] < self.adds[adds - 1]


NO_HISTORY = MemberHistory()


@dataclass(frozen=True, slots=True)
class Access:
    """What a replica knows that decides one message: its sender's history in the chat,
    and the chat's two parties if its ops showed it to be a DM."""

    history: MemberHistory = NO_HISTORY
    dm_parties: bytes | None = None  # the two user ids, concatenated (ChatMeta.identity)


def admissible(msg: MsgV1, access: Access) -> bool:
    parties = access.dm_parties
    if parties is not None:
        return is_party(msg.sender, parties)
    first = access.history.first_add()
    return first is not None and first <= msg.hlc


def visible(msg: MsgV1, access: Access) -> bool:
    """Assumes ``admissible``: a DM shows all it admits, a group what its active members sent."""
    return access.dm_parties is not None or access.history.active_at(msg.hlc)


def is_party(user: bytes, parties: bytes) -> bool:
    half = len(parties) // 2
    return user == parties[:half] or user == parties[half:]
