"""``--scope auto``: keep the node's scope in step with the users naming it as a home node.

The I/O shell of ``sync/serving.py`` (which decides). Every ``scope_check_interval_s`` it
looks whether the member ops or identities changed (their trees' roots) or the peers it
knows alive did (``known_nodes``: the replication-factor rule ranks them); if so it reads the stored
identities that name home nodes and the member rows (both global, small beside messages) in
a worker thread and hands them to ``ServedScope``. When the scope grows, the wider scope is
set through the writer (the one writer: intake, sync and gossip refuse nothing of the new
shards from then on) and ``on_widen`` joins them: gossip topics, sessions at once with the
connected peers (those holding the shards fill them: SYNC.md, "Joining"). When a released
shard's grace ends, ``on_expired`` drops it — a chat shard or a user shard. A node with a
fixed scope runs one too (``serve`` off): its chat shards are its pins, and its user shards
are those of its served users and of the users it wrote for, released like the rest.

Reading every row on a change costs O(identities + member rows) per check with a change; a
node whose member ops arrive every second re-reads them every second. Incremental updates
from the writer's applied ops are the next step if that shows in a profile.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import base58
import trio

from node.clock import Clock
from node.metrics import Metrics
from node.writer import DbWriter
from store.chatdb import ChatDb
from sync.entitled import entitled_shards, entitled_user_shards
from sync.merkle import MerkleTree
from sync.protocol import Domain
from sync.replica import DbReplica
from sync.scope import Scope, replica_shards, rule_shards
from sync.serving import ServedScope

log = logging.getLogger(__name__)

Changed = Callable[[Scope, Scope], Awaitable[None]]


class ScopeKeeper:
    def __init__(
        self,
        replica: DbReplica,
        served: ServedScope,
        writer: DbWriter,
        clock: Clock,
        metrics: Metrics,
        *,
        interval_s: float,
        replication_factor: int,
        known_nodes: Callable[[], list[bytes]],
        on_widen: Changed,
        on_expired: Changed | None = None,
        serve: bool = True,
        bound: bool = True,
    ) -> None:
        """``serve``: derive our own scope (``--scope auto``); off, a fixed scope whose user
        shards follow its served users and its writes (``ServedScope.wrote_for``), released
        after the grace. ``bound``: keep what peers are entitled to (``bound_for``: scope
        authentication); the member rows are read only for ``serve`` or ``bound``."""
        self.replica, self.served, self.writer = replica, served, writer
        self.clock, self.metrics = clock, metrics
        self.interval_s = interval_s
        self.replication_factor = replication_factor
        self.known_nodes = known_nodes
        self.on_widen, self.on_expired = on_widen, on_expired
        self._marks: object = None
        self.serve, self.bound = serve, bound
        self.entitled: dict[bytes, frozenset[int]] = {}  # node -> shards its users are in
        self.entitled_users: dict[bytes, frozenset[int]] = {}  # node -> its users' shards
        self._nodes: list[bytes] = []
        self._rule_of: dict[bytes, frozenset[int]] = {}  # each known node's R-rule shards
        self._bound_cache: dict[bytes, Scope] = {}  # bound_of's answers since the last change
        held = replica.scope
        served.hold(held.shards or (), held.user_shards or (), clock.wall_ms())  # at start
        metrics.gauge(
            "scope_shards",
            lambda: {(): _count(self.replica.scope)},
            help="shards this node holds (--scope auto)",
        )
        metrics.gauge(
            "served_users",
            lambda: {(): len(self.served.served)},
            help="users naming this node as a home node",
        )

    async def run(self) -> None:
        while True:
            await self.check()
            await trio.sleep(self.interval_s)

    async def check(self) -> None:
        """One look: re-read what changed, then widen or drop as ``ServedScope`` says."""
        nodes = sorted(set(self.known_nodes()))
        trees = self.replica.trees
        roots = (_root(trees[d]) for d in (Domain.MEMBERS, Domain.INDEX, Domain.IDENTITY))
        marks = (*roots, nodes)
        if marks != self._marks:
            homes, rows = await trio.to_thread.run_sync(
                read_homes_and_rows, self.replica.db, self.serve or self.bound
            )
            rule_of: dict[bytes, frozenset[int]] = {}
            if self.replication_factor > 0 and (self.serve or self.bound):
                # the whole view at once, off the event loop
                rule_of = await trio.to_thread.run_sync(
                    rule_shards, [*nodes, self.served.node_id], self.replication_factor,
                    self.served.num_shards,
                )  # fmt: skip
            self._rule_of = rule_of  # from here to the end of the step: no await
            self._see(homes, rows)
            self.entitled = entitled_shards(homes, rows, self.served.num_shards)
            self.entitled_users = entitled_user_shards(homes, self.served.num_shards)
            self._nodes, self._bound_cache = nodes, {}
            self._marks = marks
        await self._follow()

    def bound_for(self, peer: str) -> Scope:
        """What ``peer`` (base58) may reconcile with us (``bound_of``)."""
        return self.bound_of(base58.b58decode(peer))

    def bound_of(self, node: bytes) -> Scope:
        """What the peer ``node`` (raw id) is entitled to — its sessions reconcile, its gossip
        carries (``node/scopes.py``): the shards its users are in and its shards by the R
        rule among the nodes we know (sync/entitled.py)."""
        bound = self._bound_cache.get(node)  # asked per gossip message and peer: 14 us built
        if bound is not None:
            return bound
        rule = self._rule_of.get(node)
        if rule is None:  # a peer not in the view yet: counted with it, as it would be
            known = [*self._nodes, self.served.node_id]
            rule = frozenset()
            if self.replication_factor > 0:
                rule = replica_shards(node, known, self.replication_factor, self.served.num_shards)
        bound = Scope(
            self.entitled.get(node, frozenset()) | rule,
            self.served.num_shards,
            self.entitled_users.get(node, frozenset()) | rule,
        )
        if len(self._bound_cache) < 1_024:  # bounded: peers come and go
            self._bound_cache[node] = bound
        return bound

    async def _follow(self) -> None:
        if self.replica.scope.is_full:  # holds everything, releases nothing (scope auth only)
            return
        held, expired, expired_users = self.served.step(self.clock.wall_ms())
        old = self.replica.scope
        if not old.covers(held):

            def widen() -> Scope:  # from the scope as the writer holds it (the intake widens too)
                now = self.replica.scope
                wider = Scope(
                    frozenset(now.shards or ()) | frozenset(held.shards or ()),
                    now.num_shards,
                    frozenset(now.user_shards or ()) | frozenset(held.user_shards or ()),
                )
                self.replica.widen_scope(wider)
                return wider

            wider = await self.writer.call(widen)
            log.info(
                "scope widened: %s -> %s", sorted(old.shards or ()), sorted(wider.shards or ())
            )
            self.metrics.inc("scope_widened", help="times --scope auto added shards")
            await self.on_widen(old, wider)
        if (expired or expired_users) and self.on_expired is not None:
            now_held = self.replica.scope
            await self.on_expired(now_held, Scope(expired, now_held.num_shards, expired_users))

    def _see(
        self,
        homes: list[tuple[bytes, tuple[bytes, ...]]],
        rows: list[tuple[bytes, bytes, bool]],
    ) -> None:
        served = self.served
        named = {user for user, home in homes if served.node_id in home}
        for user in list(served.served):
            if user not in named:
                served.see_identity(user, ())
        for user in named:
            served.see_identity(user, (served.node_id,))
        if not self.serve:  # a fixed scope: its served users' user shards, no chat of theirs
            return
        served.chats = {}
        for chat, user, active in rows:
            served.see_member(chat, user, active)
        if self.replication_factor > 0:
            served.rule_shards = self._rule_of.get(served.node_id, frozenset())


def read_homes_and_rows(
    db: ChatDb, with_rows: bool = True
) -> tuple[list[tuple[bytes, tuple[bytes, ...]]], list[tuple[bytes, bytes, bool]]]:
    """The identities naming home nodes, and (``with_rows``) the member rows (chat, user,
    active) folded from the member index and, for pairs it lacks, the rows of the chats
    held (a worker thread's read)."""
    if not with_rows:
        return list(db.iter_home_nodes()), []
    rows = {(chat, user): active for chat, user, active in db.member_index.rows_of(None)}
    for chat, user, active in db.iter_member_rows():
        rows.setdefault((chat, user), active)
    return list(db.iter_home_nodes()), [(c, u, a) for (c, u), a in rows.items()]


def _count(scope: Scope) -> int:
    return scope.num_shards if scope.shards is None else len(scope.shards)


def _root(tree: MerkleTree) -> bytes:
    return tree.root_digest()
