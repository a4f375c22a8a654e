"""The gossip service: the trio shell around the pure validator and batcher.

Inbound. ``validate`` is what py-libp2p calls for every message, ours included. It
must be cheap and must not raise (a raise would be a bug in the router's hands), so
every failure is a counted ``False``, charged to the peer that forwarded the message:
points (``PeerJudge``) and its budget for gossip that brings nothing (``GossipWaste``).
Messages from or through a blocked peer are refused first, then those of a forwarder that
spent its budget (``throttled``: dropped before they are decoded); then
``GossipValidator.check`` decides. Decoded ops are kept for the receiver, so a message
is decoded once. Our own publishes are not checked again: their ops were checked by
the intake (``node/intake.py``) before they were written.

The receiver hands each message to the writer and moves on (the writer's bounded
queue is the backpressure); a second task waits for the writes in order and reports
what was new. Waiting for each write before taking the next message left py-libp2p's
32-slot subscription channel to overflow, and what overflows is lost to gossip for good.

Outbound. ``publish`` queues ops; ``publish_loop`` gathers them into messages as
``Batcher`` decides (``node/gossip/batching.py``) and publishes them.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import trio

from node.arrivals import ArrivalLog
from node.clock import Clock
from node.gossip.batching import PACE_POLL_S, Batcher, Publishers, encode_messages
from node.gossip.settings import GossipSettings
from node.gossip.topics import split_by_topic
from node.gossip.validation import GossipValidator
from node.limits import GossipWaste
from node.metrics import Metrics
from node.p2p import GossipMessage, PeerId, PeerKey, PeerQueues, Subscription
from node.penalties import Blocklist, PeerJudge
from node.weighted_queue import WeightedQueue
from node.writer import DbWriter, WriteRequest
from store.errors import ChatsyncError, InvalidInput
from store.ops import Op

log = logging.getLogger(__name__)

VALIDATED_CACHE = 4096
OUTGOING_OPS = 8192  # ops of publish() calls waiting for the publisher (node.weighted_queue)
ACK_WINDOW = 4096  # gossip messages handed to the writer and not yet acknowledged
# Refusals that do not spend the forwarder's budget: the origin is the one we blocked (an
# honest relay cannot know our blocklist), or the validator failed (our bug).
UNCHARGED = frozenset({"blocked_origin", "internal"})


class Publisher(Protocol):
    """What gossip uses of py-libp2p's ``Pubsub`` (or of a stand-in)."""

    @property
    def peer_queues(self) -> PeerQueues:
        """RPCs waiting to be sent, per peer (py-libp2p drops what does not fit in 32)."""
        ...

    async def publish(self, topic_id: str, data: bytes) -> None: ...


class GossipService:
    def __init__(
        self,
        settings: GossipSettings,
        pubsub: Publisher,
        writer: DbWriter,
        validator: GossipValidator,
        metrics: Metrics,
        clock: Clock,
        *,
        blocklist: Blocklist | None = None,
        judge: PeerJudge | None = None,
        waste: GossipWaste | None = None,
        on_applied: Callable[[list[Op]], None] | None = None,
    ) -> None:
        self.settings = settings
        self.pubsub = pubsub
        self.writer = writer
        self.validator = validator
        self.metrics = metrics
        self.clock = clock
        # "is not None": an empty Blocklist is falsy, and a fresh one would never see the bans
        self.blocklist = blocklist if blocklist is not None else Blocklist()
        self.judge = judge  # charges the forwarders of refused messages
        self.waste = waste  # what each forwarder's refused messages may cost us
        self.on_applied = on_applied  # told of each message's new ops after their write
        self._validated: OrderedDict[bytes, list[Op]] = OrderedDict()
        self.arrivals = ArrivalLog()
        self.publishers = Publishers()  # who publishes lately: our messages' spacing
        metrics.gauge(
            "gossip_publishers",
            lambda: {(): self.publishers.count(self.clock.now())},
            help="nodes heard publishing in the last 10 s, us included (message spacing)",
        )
        # lists of ops, one per publish() call (an API request: at most 1,024 ops)
        self._outgoing = WeightedQueue[list[Op]](OUTGOING_OPS, weight=len)
        metrics.gauge(
            "gossip_outbound_queue",
            lambda: {(): self.outbound_depth()},
            help="RPCs in the fullest per-peer outbound queue of py-libp2p (drops at 32)",
        )

    # --- inbound ---

    def validate(self, forwarder: PeerKey | None, msg: GossipMessage) -> bool:
        """py-libp2p topic validator (synchronous). Never raises.

        Our own publishes (forwarder = us: only ``Pubsub.publish`` passes that) carry ops
        the intake validated (and rate-limited) already; they are not checked twice.
        ``forwarder`` None: the receive loop validating again a message whose ops left
        the cache. A rejection is counted, and charged to the peer that forwarded it.
        """
        if forwarder is not None and _peer_bytes(forwarder) == self.settings.own_peer_id:
            return True
        reason = self._check(forwarder, msg)
        if reason is None:
            return True
        self.metrics.inc(
            "gossip_rejected", reason=reason, help="gossip messages rejected by the validator"
        )
        self._charge(forwarder, msg, reason)
        return False

    def _charge(self, forwarder: PeerKey | None, msg: GossipMessage, reason: str) -> None:
        """The forwarder of a refused message pays: budget, and the points ``reason`` costs."""
        key = _peer_bytes(forwarder)
        if key and self.waste is not None and reason not in UNCHARGED:
            self.waste.spend(key, len(msg.data), self.clock.now())
        peer = _peer_base58(forwarder)
        if peer and self.judge is not None:
            self.judge.gossip_rejected(peer, reason)

    def _check(self, forwarder: PeerKey | None, msg: GossipMessage) -> str | None:
        """None if the message is valid (its ops then wait in the cache), else the reason."""
        try:
            blocked, key = self.blocklist.has_bytes, _peer_bytes(forwarder)
            if blocked(key):
                return "blocked_peer"
            if blocked(bytes(msg.from_id)):
                return "blocked_origin"
            if key and self.waste is not None and self.waste.throttled(key, self.clock.now()):
                return "throttled"  # dropped unread: its flood costs us no decoding
            first_sight = forwarder is not None
            ops = self.validator.check(msg.data, self.clock.wall_ms(), first_sight=first_sight)
        except InvalidInput as exc:
            return exc.reason
        except Exception as exc:  # a validator must answer, whatever the input did
            log.warning("gossip validator error: %s: %s", type(exc).__name__, exc)
            return "internal"
        self._validated[_msg_key(msg)] = ops
        while len(self._validated) > VALIDATED_CACHE:
            self._validated.popitem(last=False)
        return None

    async def receive_loop(self, subscription: Subscription) -> None:
        """Apply every validated message from the subscription (our own are skipped).

        Messages are handed to the writer without waiting for each write: py-libp2p drops
        whatever does not fit its 32-message subscription channel, so this loop only
        waits while the writer's own bounded queue is full. ``_ack_loop`` waits for the
        writes (in order) and reports what was new.
        """
        acks_send, acks = trio.open_memory_channel[tuple[list[Op], WriteRequest]](ACK_WINDOW)
        async with trio.open_nursery() as nursery, acks_send:
            nursery.start_soon(self._ack_loop, acks)
            while True:
                msg = await subscription.get()
                if bytes(msg.from_id) == self.settings.own_peer_id:
                    continue
                ops = self._validated.pop(_msg_key(msg), None)
                if ops is None:  # validated before the cache turned over: validate again
                    if not self.validate(None, msg):
                        continue
                    ops = self._validated.pop(_msg_key(msg))
                self.publishers.heard(bytes(msg.from_id), self.clock.now())
                self.metrics.inc("gossip_messages_received", help="gossip messages accepted")
                self.metrics.inc("gossip_ops_received", len(ops), help="ops received by gossip")
                await acks_send.send((ops, await self.writer.enqueue(ops)))

    async def _ack_loop(
        self, acks: trio.MemoryReceiveChannel[tuple[list[Op], WriteRequest]]
    ) -> None:
        async with acks:
            async for ops, request in acks:
                try:
                    new = await self.writer.wait(request)
                except ChatsyncError as exc:  # counted by the writer; anti-entropy repairs it
                    log.info("gossip write failed: %s", exc)
                    continue
                self._applied([op for op, is_new in zip(ops, new, strict=True) if is_new])

    def _applied(self, fresh: list[Op]) -> None:
        """Count a message's ops that were new here; log their arrival and latency."""
        now = self.clock.wall_ms()
        if fresh:
            self.metrics.inc(
                "gossip_ops_applied", len(fresh), help="ops from gossip that were new here"
            )
            for op in fresh:
                self.metrics.observe_latency(now - op.hlc.physical_ms)
            self.arrivals.extend((op.hlc.pack(), now) for op in fresh)
        if self.on_applied is not None:
            self.on_applied(fresh)

    # --- outbound ---

    async def publish(self, ops: list[Op]) -> None:
        """Queue ops for gossip (waits while the publisher is behind)."""
        await self._outgoing.put(list(ops))

    async def publish_loop(self) -> None:
        """Gather queued ops into messages (``Batcher`` decides when one closes); publish them."""
        batcher = Batcher(self.settings)
        try:
            while True:
                if not batcher.pending:
                    batcher.add(await self._outgoing.get())
                now = self.clock.now()
                batcher.open(now, self.publishers.count(now))
                while True:
                    self._take_queued(batcher)
                    wake = batcher.wake_at(self.clock.now(), self.outbound_depth())
                    if wake is None:
                        break
                    with trio.move_on_at(wake):
                        batcher.add(await self._outgoing.get())
                batch = batcher.take()
                await self._wait_for_room(batcher)
                batcher.published(self.clock.now())
                await self._publish(batch)
        finally:
            self._outgoing.close()  # publishers learn that nobody publishes any more

    def _take_queued(self, batcher: Batcher) -> None:
        """Take what is queued, without waiting, while the message wants more."""
        while batcher.wants_more():
            try:
                batcher.add(self._outgoing.get_nowait())
            except trio.WouldBlock:
                break

    def outbound_depth(self) -> int:
        """RPCs waiting in the fullest of py-libp2p's per-peer outbound queues."""
        queues = self.pubsub.peer_queues
        return max((len(q) for q in list(queues.values())), default=0)

    async def _wait_for_room(self, batcher: Batcher) -> None:
        if not batcher.paced(self.outbound_depth()):
            return
        self.metrics.inc(
            "gossip_publish_paced", help="publishes held back by a deep outbound queue"
        )
        while batcher.hold_for_room(self.clock.now(), self.outbound_depth()):
            await trio.sleep(PACE_POLL_S)

    async def _publish(self, batch: list[Op]) -> None:
        s = self.settings
        for topic, ops in split_by_topic(batch, s.topic, s.num_shards, sharded=s.sharded):
            for count, data in encode_messages(ops, s.max_bytes):
                await self.pubsub.publish(topic, data)
                self.metrics.inc("gossip_messages_published", help="gossip messages published")
                self.metrics.inc("gossip_ops_published", count, help="ops published by gossip")


def _msg_key(msg: GossipMessage) -> bytes:
    return bytes(msg.from_id) + bytes(msg.seqno)


def _peer_base58(peer: PeerKey | None) -> str:
    return str(peer.to_base58()) if isinstance(peer, PeerId) else ""  # a stand-in may lack it


def _peer_bytes(peer: PeerKey | None) -> bytes:
    if peer is None:
        return b""
    try:
        return bytes(peer.to_bytes())
    except AttributeError:
        return b""
