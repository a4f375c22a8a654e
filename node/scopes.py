"""The node's scope at run time (SYNC.md, "Scopes"): its gossip topics per shard, joining and
leaving shards, and who holds a chat it does not. The I/O shell around ``sync/serving.py``
(through ``node/scope_keeper.py``), ``store/leaving.py`` and ``node/scope_answer.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import base58
import trio

from node.config import NodeConfig
from node.gossip.settings import OPS_TOPIC
from node.gossip.topics import topic_within, topics_for
from node.join_dials import JoinDialer
from node.p2p.host import Libp2pHost, Libp2pPubSub
from node.peers import PeerManager
from node.scope_answer import (
    MAX_NAMED,
    nodes_holding,
    nodes_holding_shard,
    nodes_holding_user,
    nodes_holding_user_shard,
)
from node.scope_keeper import ScopeKeeper
from node.services import Services
from node.syncer import SyncOutcome
from sync.joining import Target
from sync.scope import Scope, shard_of
from sync.serving import ServedScope

log = logging.getLogger(__name__)


class NodeScopes:
    def __init__(
        self,
        config: NodeConfig,
        services: Services,
        host: Libp2pHost,
        pubsub: Libp2pPubSub,
        peers: PeerManager,
    ) -> None:
        self.config, self.services = config, services
        self.host, self.pubsub, self.peers = host, pubsub, peers
        # gossip topics received, each loop's cancel scope (more, or fewer, as the scope changes)
        self._topics: dict[str, trio.CancelScope] = {}
        self._nursery: trio.Nursery | None = None
        self.keeper: ScopeKeeper | None = None  # with --scope auto, scope auth or a fixed scope
        self._served: ServedScope | None = None  # what the keeper holds, and for how long
        # dials a known holder of a shard joined that no connected peer holds
        self.dialer = JoinDialer(
            peers, services.sync, self.join_holders, services.metrics, services.clock
        )

    async def start(self, nursery: trio.Nursery) -> None:
        """Receive the base topic and (with ``gossip_sharded``) our shards' topics; with
        ``--scope auto`` or scope authentication, keep the scope (``ScopeKeeper``)."""
        cfg, services = self.config, self.services
        self._nursery = nursery
        await self._subscribe(topics_for(OPS_TOPIC, services.replica.scope, sharded=cfg.gossip_sharded))  # fmt: skip
        services.intake.index_users = self._index_users
        services.intake.wrote_for = self._wrote_for
        if cfg.scope_auto or cfg.scope_authenticate or not services.replica.scope.is_full:
            self.keeper = keeper = self._keeper()
            self._served = keeper.served
            services.sync.on_converged = self._reconciled
            if cfg.scope_authenticate:
                services.sync.peer_bound = keeper.bound_for
                self._bound_gossip(keeper)
            nursery.start_soon(keeper.run)
            nursery.start_soon(self.dialer.run)

    def _bound_gossip(self, keeper: ScopeKeeper) -> None:
        """A shard topic's messages only to peers entitled to the shard: the bound the
        sessions use (``bound_of``), applied by the router (``node/p2p/gated_gossip.py``).
        Unsharded gossip has one topic for everything, which no shard bound can split."""
        if not self.config.gossip_sharded:
            log.warning("scope_authenticate without gossip_sharded: gossip is not bounded")
        metrics = self.services.metrics

        def allowed(peer: bytes, topic: str) -> bool:
            return topic_within(OPS_TOPIC, topic, keeper.bound_of(peer))

        def withheld(kind: str) -> None:
            metrics.inc("gossip_withheld", kind=kind, help=WITHHELD_HELP)

        self.pubsub.set_topic_gate(allowed, withheld)

    def holds_chat(self, chat: bytes) -> bool:
        return self.services.replica.scope.holds_chat(chat)

    def holders_of(self, chat: bytes) -> list[str]:
        """Peer ids (base58) of nodes holding a chat outside our scope (a worker thread's)."""
        cfg = self.config
        found = nodes_holding(
            chat, self.services.db.reads, own=self.host.peer_id.to_bytes(),
            known=_raw(self.peers.known()), reached=_raw(self.peers.reached()),
            replication_factor=cfg.replication_factor, num_shards=cfg.network_shards,
        )  # fmt: skip
        return [base58.b58encode(n).decode() for n in found]

    def indexes_user(self, user: bytes) -> bool:
        return self.services.replica.scope.indexes_user(user)

    def user_holders_of(self, user: bytes) -> list[str]:
        """Peer ids (base58) of nodes holding a user shard we do not index (a worker
        thread's: the R rule assigns every shard at once)."""
        cfg = self.config
        found = nodes_holding_user(
            user, own=self.host.peer_id.to_bytes(), known=_raw(self.peers.known()),
            reached=_raw(self.peers.reached()), replication_factor=cfg.replication_factor,
            num_shards=cfg.network_shards,
        )  # fmt: skip
        return [base58.b58encode(n).decode() for n in found]

    async def join_holders(self, targets: Sequence[Target]) -> dict[Target, list[str]]:
        """Each joined shard's holders, best first (peer ids, base58): for a chat shard, the
        home nodes of the members of our served users' chats in it, then the R rule over the
        peers we know and those we reached (the 421 answer's ranking); for a user shard, the
        R rule."""
        served = self._served
        chats: dict[int, list[bytes]] = {}
        if served is not None:  # read here, in the event loop: the keeper rewrites it there
            for user_chats in list(served.chats.values()):
                for chat in user_chats:
                    chats.setdefault(shard_of(chat, self.config.network_shards), []).append(chat)
        known, reached = _raw(self.peers.known()), _raw(self.peers.reached())
        own, cfg, reads = self.host.peer_id.to_bytes(), self.config, self.services.db.reads

        def rank() -> dict[Target, list[str]]:
            found: dict[Target, list[bytes]] = {}
            for target in targets:
                if target.user:
                    found[target] = nodes_holding_user_shard(
                        target.shard, own=own, known=known, reached=reached,
                        replication_factor=cfg.replication_factor, num_shards=cfg.network_shards,
                    )  # fmt: skip
                else:
                    found[target] = nodes_holding_shard(
                        target.shard, sorted(set(chats.get(target.shard, ())))[:MAX_NAMED],
                        reads, own=own, known=known, reached=reached,
                        replication_factor=cfg.replication_factor, num_shards=cfg.network_shards,
                    )  # fmt: skip
            return {t: [base58.b58encode(n).decode() for n in ns] for t, ns in found.items()}

        return await trio.to_thread.run_sync(rank)

    def _reached(self) -> list[bytes]:
        """The keeper's view for the R rule: peers we know alive (``PeerManager.reached``)."""
        return _raw(self.peers.reached())

    def _keeper(self) -> ScopeKeeper:
        cfg, services = self.config, self.services
        served = ServedScope(
            self.host.peer_id.to_bytes(), cfg.network_shards,
            pinned_shards=frozenset(cfg.scope_shards or ()),
            grace_ms=int(cfg.scope_grace_s * 1000),
        )  # fmt: skip
        return ScopeKeeper(
            services.replica, served, services.writer, services.clock, services.metrics,
            interval_s=cfg.scope_check_interval_s, replication_factor=cfg.replication_factor,
            known_nodes=self._reached, on_widen=self._join, on_expired=self._leave,
            serve=cfg.scope_auto, bound=cfg.scope_authenticate,
        )  # fmt: skip

    async def _join(self, old: Scope, new: Scope) -> None:
        """New shards held: their gossip topics, a session at once with every connected peer
        (the holders among them fill the shards; the others' intersection is empty), and a
        join for each (``node/join_dials.py``: a known holder dialled if none is connected)."""
        self.services.intake.scope = new
        await self._subscribe(topics_for(OPS_TOPIC, new, sharded=self.config.gossip_sharded))
        for name in self.peers.connected():
            self.peers.rotation.go_on(name)
        self.dialer.joined(old, new)  # no connected holder: dial a known one

    async def _index_users(self, user_shards: frozenset[int]) -> None:
        """A client's member op or identity names users of these user shards: index them
        (those we do not yet, in one writer step before the op is written), so the op is
        held here and sessions carry it to the other holders of its user shard even if
        gossip loses it on the way; and keep them until a session handed them over to a
        peer that keeps them, then for the grace period (``ServedScope.wrote_for``,
        ``_reconciled``; docs/design/member-scopes.md)."""
        replica = self.services.replica
        if self._served is not None:
            self._served.wrote_for(user_shards, self.services.clock.wall_ms())
        if all(replica.scope.holds_user_shard(s) for s in user_shards):
            return

        def widen() -> Scope:
            held = replica.scope
            wider = Scope(
                held.shards, held.num_shards, (held.user_shards or frozenset()) | user_shards
            )
            replica.widen_scope(wider)
            return wider

        old = replica.scope
        wider = await self.services.writer.call(widen)
        await self._join(old, wider)  # sessions at once: the hand-over (``_reconciled``)

    def _wrote_for(self, user_shards: frozenset[int]) -> None:
        """The ops naming users of these user shards are written: only a session started
        from now on hands them over."""
        if self._served is not None:
            self._served.wrote_for(user_shards, self.services.clock.wall_ms())

    def _reconciled(self, outcome: SyncOutcome) -> None:
        """A converged session: the user shards we wrote for that it reconciled with a peer
        that keeps them (its served users' or its R-rule share, as far as we know: the
        keeper's ``bound_of``) are handed over, and their grace starts
        (``ServedScope.handed_over``; docs/design/member-scopes.md)."""
        served, keeper, reconciled = self._served, self.keeper, outcome.reconciled
        if served is None or keeper is None or reconciled is None:
            return
        unhanded = served.unhanded()
        if reconciled.user_shards is not None:
            unhanded &= reconciled.user_shards
        if not unhanded:
            return
        try:
            peer = base58.b58decode(outcome.peer)
        except ValueError:
            return
        kept = keeper.bound_of(peer).user_shards
        handed = unhanded if kept is None else unhanded & kept
        done = served.handed_over(handed, outcome.started_ms, self.services.clock.wall_ms())
        if done:
            self.services.metrics.inc(
                "scope_user_shards_handed_over", len(done),
                help="user shards written for whose index entries a session handed over",
            )  # fmt: skip

    async def _leave(self, held: Scope, expired: Scope) -> None:
        """Shards and user shards whose grace ended: out of the scope, their rows off the
        disk, in one writer step (sessions from then on neither offer nor accept them);
        their topics left. A user shard written for again since it expired stays."""
        replica, served = self.services.replica, self._served
        shards = frozenset(expired.shards or ())

        def drop() -> tuple[frozenset[int], int]:
            users = frozenset(expired.user_shards or ())
            if served is not None:  # the intake's writes queue behind this step
                users -= served.held_user_shards()
            return users, replica.drop_shards(shards, users)

        users, dropped = await self.services.writer.call(drop)
        self.services.intake.scope = replica.scope
        await self._unsubscribe(Scope(shards, expired.num_shards, users))
        log.info(
            "left shards %s, user shards %s: %d records dropped",
            sorted(shards), sorted(users), dropped,
        )  # fmt: skip
        self.services.metrics.inc(
            "scope_shards_left", len(shards), help="shards --scope auto dropped"
        )
        self.services.metrics.inc(
            "scope_user_shards_left", len(users), help="user shards a scoped node dropped"
        )

    async def _subscribe(self, topics: list[str]) -> None:
        """Receive these gossip topics (those not received yet), each in a cancel scope of
        its own: leaving a shard stops its loop before unsubscribing (py-libp2p closes the
        subscription's channel)."""
        assert self._nursery is not None, "start() first"
        gossip = self.services.gossip
        for topic in topics:
            if topic in self._topics:
                continue
            self.pubsub.set_validator(topic, gossip.validate)
            subscription = await self.pubsub.subscribe(topic)
            self._topics[topic] = scope = trio.CancelScope()
            self._nursery.start_soon(_within, scope, gossip.receive_loop, subscription)

    async def _unsubscribe(self, scope: Scope) -> None:
        """Stop receiving the shard and user-shard topics of ``scope`` (the base topic
        stays)."""
        if not self.config.gossip_sharded or scope.is_full:
            return
        for topic in topics_for(OPS_TOPIC, scope, sharded=True)[1:]:
            if (loop := self._topics.pop(topic, None)) is not None:
                loop.cancel()
                await self.pubsub.unsubscribe(topic)


WITHHELD_HELP = (
    "gossip kept from peers not entitled to its shard, by kind (message, ihave, graft; "
    "graft_refused: a GRAFT of theirs answered with PRUNE)"
)


def _raw(names: list[str]) -> list[bytes]:
    """Peer ids as bytes; a name that is no base58 (a damaged peers.json) is left out."""
    raw = []
    for name in names:
        try:
            raw.append(base58.b58decode(name))
        except ValueError:
            continue
    return raw


async def _within(scope: trio.CancelScope, run: Callable[..., Awaitable[None]], *args: Any) -> None:
    with scope:
        await run(*args)
