"""What a node run with ``--scope auto`` holds, and when it lets a shard go. Pure.

The node serves the users whose signed identity names it (its peer id) among their home
nodes (``store.ops.IdentityDoc.home_nodes``). It holds the shards of the chats those users
are members of now, the shards its operator pins, and the shards the replication-factor rule
gives it (``sync.scope.replica_shards``). It learns its users' chats from its member index:
it holds the user shards of the users it serves (and its R-rule shards as user shards too,
so every user shard has holders), so the node decides from what it holds; the same
identities and index entries give the same scope whatever order they came in.

A node also indexes the users it writes for (a client's member op or identity naming a user
of a user shard it does not hold: ``wrote_for``); such a user shard is needed until it is
**handed over** — a converged session that reconciled it, started after the last write,
with a peer that keeps it (its served users' shard or its R-rule share: ``handed_over``) —
and for the grace period after that, then leaves unless a served user or the R rule needs
it (docs/design/member-scopes.md). Needed for a time alone, it could leave before any
session carried the op (a cut longer than the grace): the index entry would be lost.

A shard no longer needed (its served users removed, their home moved elsewhere, a pin
dropped, no write for its users for a while) is kept for a grace period (``grace_ms``, a day
by default) before it leaves: a user removed by mistake and added back, or an identity
published twice in a hurry, does not cost a full catch-up. Chat shards and user shards are
kept alike (``_Kept``). ``ServedScope.step`` says what to hold now and what to drop.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from sync.scope import DEFAULT_SHARDS, Scope, shard_of, user_shard_of

DEFAULT_GRACE_MS = 24 * 3600 * 1000


@dataclass
class _Kept:
    """Shards held: those needed now, and those released until their grace ends."""

    held: set[int] = field(default_factory=set)
    released_ms: dict[int, int] = field(default_factory=dict)  # shard -> when released

    def step(self, needed: frozenset[int], now_ms: int, grace_ms: int) -> frozenset[int]:
        """Hold ``needed`` and what is in its grace; the shards whose grace ended. A shard
        needed again within its grace is kept as if it had never been released."""
        for shard in needed:
            self.released_ms.pop(shard, None)
        for shard in self.held - needed:
            self.released_ms.setdefault(shard, now_ms)
        expired = frozenset(s for s, at in self.released_ms.items() if now_ms - at >= grace_ms)
        for shard in expired:
            del self.released_ms[shard]
        self.held = set(needed) | set(self.released_ms)
        return expired

    def touch(self, shards: Iterable[int], now_ms: int) -> None:
        """Held, released at ``now_ms``: their grace (re)starts now, unless needed."""
        for shard in shards:
            self.held.add(shard)
            self.released_ms[shard] = max(now_ms, self.released_ms.get(shard, now_ms))

    def deadline_ms(self, grace_ms: int) -> int | None:
        return min(self.released_ms.values()) + grace_ms if self.released_ms else None


class Step(NamedTuple):
    """What to hold now, and the chat and user shards whose grace ended: drop their rows."""

    held: Scope
    expired: frozenset[int]
    expired_users: frozenset[int]


@dataclass
class ServedScope:
    """The scope of a node serving users, kept in step with identities and member rows."""

    node_id: bytes
    num_shards: int = DEFAULT_SHARDS
    pinned_shards: frozenset[int] = frozenset()
    grace_ms: int = DEFAULT_GRACE_MS
    served: set[bytes] = field(default_factory=set)  # users naming us as a home node
    # served user -> the chats it is an active member of
    chats: dict[bytes, set[bytes]] = field(default_factory=dict)
    rule_shards: frozenset[int] = frozenset()  # ours by the replication-factor rule
    _shards: _Kept = field(default_factory=_Kept)
    _user_shards: _Kept = field(default_factory=_Kept)
    # user shards written for and not handed over yet -> when last written for
    _unhanded: dict[int, int] = field(default_factory=dict)

    def hold(self, shards: Iterable[int], user_shards: Iterable[int] = (), now_ms: int = 0) -> None:
        """Shards held already (a store opened with them): released at the next ``step``
        unless needed — after a restart the grace period starts again. The user shards are
        not handed over (``wrote_for``): whether what we wrote for them reached a holder
        that keeps them is not known after a restart."""
        self._shards.held.update(shards)
        self.wrote_for(user_shards, now_ms)

    def wrote_for(self, user_shards: Iterable[int], now_ms: int) -> None:
        """A client's op or identity names users of these user shards: indexed (held) from
        now, needed until handed over (``handed_over``), then for ``grace_ms``."""
        for shard in user_shards:
            self._user_shards.held.add(shard)
            self._unhanded[shard] = max(now_ms, self._unhanded.get(shard, now_ms))

    def handed_over(
        self, user_shards: Iterable[int], started_ms: int, now_ms: int
    ) -> frozenset[int]:
        """A session that started at ``started_ms`` converged on these user shards with a
        peer that keeps them (the caller's judgement: its served users' shards or its R-rule
        share, ``sync.entitled``): what we wrote for them before it started is held there
        too. Their grace starts now; a write during the session keeps one unhanded. The
        user shards handed over."""
        done = frozenset(s for s in user_shards if self._unhanded.get(s, started_ms) < started_ms)
        for shard in done:
            del self._unhanded[shard]
        self._user_shards.touch(done, now_ms)
        return done

    def unhanded(self) -> frozenset[int]:
        """The user shards written for and not handed over yet."""
        return frozenset(self._unhanded)

    def held_user_shards(self) -> frozenset[int]:
        """The user shards held now (needed, in their grace, or written for)."""
        return frozenset(self._user_shards.held)

    def see_identity(self, user: bytes, home_nodes: Iterable[bytes]) -> bool:
        """A user's current home nodes; True when that starts or ends our serving it (the
        caller then reads that user's member rows: ``see_member``)."""
        serves = self.node_id in set(home_nodes)
        if serves == (user in self.served):
            return False
        if serves:
            self.served.add(user)
        else:
            self.served.discard(user)
            self.chats.pop(user, None)
        return serves

    def see_member(self, chat: bytes, user: bytes, active: bool) -> None:
        """A member row as it stands now (CRDT state: added and not removed since)."""
        if user not in self.served:
            return
        chats = self.chats.setdefault(user, set())
        if active:
            chats.add(chat)
        else:
            chats.discard(chat)

    def needed(self) -> frozenset[int]:
        """The shards some served user's chats, a pin or the R rule need now."""
        member = {shard_of(c, self.num_shards) for chats in self.chats.values() for c in chats}
        return frozenset(member) | self.pinned_shards | self.rule_shards

    def needed_user_shards(self) -> frozenset[int]:
        """The user shards of the served users, ours by the R rule, and those written for
        and not handed over yet."""
        served = {user_shard_of(u, self.num_shards) for u in self.served}
        return frozenset(served) | self.rule_shards | frozenset(self._unhanded)

    def step(self, now_ms: int) -> Step:
        """What to hold now and what to drop (``Step``)."""
        expired = self._shards.step(self.needed(), now_ms, self.grace_ms)
        expired_users = self._user_shards.step(self.needed_user_shards(), now_ms, self.grace_ms)
        held = Scope(
            frozenset(self._shards.held), self.num_shards, frozenset(self._user_shards.held)
        )
        return Step(held, expired, expired_users)

    def next_deadline_ms(self) -> int | None:
        """When the next released shard's grace ends (None: nothing released)."""
        deadlines = [self._shards.deadline_ms(self.grace_ms)]
        deadlines.append(self._user_shards.deadline_ms(self.grace_ms))
        return min((d for d in deadlines if d is not None), default=None)
