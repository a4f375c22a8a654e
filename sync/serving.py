"""What a node run with ``--scope auto`` holds, and when it lets a shard go. Pure.

The node serves the users whose signed identity names it (its peer id) among their home
nodes (``store.ops.IdentityDoc.home_nodes``). It holds the shards of the chats those users
are members of now, the shards its operator pins, and the shards the replication-factor rule
gives it (``sync.scope.replica_shards``). It learns its users' chats from its member index:
it holds the user shards of the users it serves (and its R-rule shards as user shards too,
so every user shard has holders), and identities are global (SYNC.md, "Scopes"), so the
node decides from what it holds; the same identities and index entries give the same scope
whatever order they came in. User shards are not released (the index is small: a user's
member ops).

A shard no longer needed (its served users removed, their home moved elsewhere, a pin
dropped) is kept for a grace period (``grace_ms``, a day by default) before it leaves: a
user removed by mistake and added back, or an identity published twice in a hurry, does not
cost a full catch-up. ``ServedScope.held`` is what to hold now; ``expired`` what to drop.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sync.scope import DEFAULT_SHARDS, Scope, shard_of, user_shard_of

DEFAULT_GRACE_MS = 24 * 3600 * 1000


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
    # shard -> when it stopped being needed (dropped at that time + grace_ms)
    released_ms: dict[int, int] = field(default_factory=dict)
    _held: set[int] = field(default_factory=set)
    _held_users: set[int] = field(default_factory=set)  # user shards: grow only

    def hold(self, shards: Iterable[int], user_shards: Iterable[int] = ()) -> None:
        """Shards held already (a store opened with them): released at the next ``step``
        unless needed — after a restart the grace period starts again."""
        self._held.update(shards)
        self._held_users.update(user_shards)

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
        """The user shards of the served users, and ours by the R rule."""
        served = {user_shard_of(u, self.num_shards) for u in self.served}
        return frozenset(served) | self.rule_shards

    def step(self, now_ms: int) -> tuple[Scope, frozenset[int]]:
        """(what to hold now, the shards whose grace ended: drop their rows). A shard needed
        again within its grace is kept as if it had never been released."""
        needed = self.needed()
        for shard in needed:
            self.released_ms.pop(shard, None)
        for shard in self._held - needed:
            self.released_ms.setdefault(shard, now_ms)
        expired = frozenset(s for s, at in self.released_ms.items() if now_ms - at >= self.grace_ms)
        for shard in expired:
            del self.released_ms[shard]
        self._held = set(needed) | set(self.released_ms)
        self._held_users |= self.needed_user_shards()
        scope = Scope(frozenset(self._held), self.num_shards, frozenset(self._held_users))
        return scope, expired

    def next_deadline_ms(self) -> int | None:
        """When the next released shard's grace ends (None: nothing released)."""
        if not self.released_ms:
            return None
        return min(self.released_ms.values()) + self.grace_ms
