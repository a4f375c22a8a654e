"""Gossip of signed ops: a synchronous validator, a receiver feeding the writer, a batching publisher.

The validator is what py-libp2p calls for every message, ours included: size,
envelope and op schema, each op's signature and HLC drift. It must be cheap and
must not raise (a raise would be a bug in the router's hands), so every failure
is a logged, counted ``False``. Decoded ops are kept for the receiver, so a
message is decoded once. Our own publishes are not checked again: their ops were
checked by ``Node.submit_ops`` before they were written.

The receiver hands each message to the writer and moves on (the writer's bounded
queue is the backpressure); a second task waits for the writes in order. Waiting
for each write before taking the next message left py-libp2p's 32-slot
subscription channel to overflow, and what overflows is lost to gossip for good.

The publisher batches: a message closes ``batch_delay`` after its first op but
no sooner than ``min_interval`` after the previous one, and only once py-libp2p's
per-peer outbound queues have room, so messages grow with the load instead of
overflowing those queues (32 RPCs, then silent drops). py-libp2p spends ~10 ms of
CPU per message on each of 5 peers whatever its size (``chatsync bench gossip``'s
floor): the message rate, not the op rate, is what saturates a small cluster.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import trio

from node.limits import TokenBuckets
from node.metrics import Metrics
from node.writer import DbWriter, WriteRequest
from store.errors import InvalidInput
from store.ops import Op, decode_ops, encode_ops, op_author, validate_op

log = logging.getLogger(__name__)

MAX_OPS_PER_MESSAGE = 4096
VALIDATED_CACHE = 4096
PACE_DEPTH = 8  # hold publishes while a peer's outbound queue (32 RPCs, then drops) has this many
PACE_POLL_S = 0.005
PACE_MAX_WAIT_S = 1.0
OUTGOING_LISTS = 256  # publish() calls waiting for the publisher
ACK_WINDOW = 4096  # gossip messages handed to the writer and not yet acknowledged
# (packed HLC, arrival ms) of the newest ops gossip delivered, for GET /debug/latency
ARRIVAL_LOG = 100_000


class GossipService:
    def __init__(
        self,
        pubsub: Any,
        topic: str,
        writer: DbWriter,
        metrics: Metrics,
        *,
        own_peer_id: bytes,
        clock_ms: Callable[[], int],
        max_offset_ms: int,
        max_payload: int,
        max_bytes: int,
        batch_ops: int,
        batch_delay_ms: int,
        min_interval_ms: int = 0,
        is_blocked: Callable[[bytes], bool] = lambda peer: False,
        on_applied: Callable[[list[Op]], None] | None = None,
        author_limits: TokenBuckets | None = None,
        new_to_us: Callable[[list[Op]], list[Op]] | None = None,
        on_reject: Callable[[str, str], None] | None = None,
    ) -> None:
        self.pubsub = pubsub
        self.topic = topic
        self.writer = writer
        self.metrics = metrics
        self.own_peer_id = own_peer_id
        self.clock_ms = clock_ms
        self.max_offset_ms = max_offset_ms
        self.max_payload = max_payload
        self.max_bytes = max_bytes
        self.batch_ops = batch_ops
        self.batch_delay_s = batch_delay_ms / 1000
        self.min_interval_s = min_interval_ms / 1000
        self.is_blocked = is_blocked
        self.on_applied = on_applied
        self.author_limits = author_limits  # shared with the API: one budget per author
        self.new_to_us = new_to_us  # the ops this replica does not hold yet (node.new_to_us)
        self.on_reject = on_reject  # (forwarding peer id, reason): the node's penalties
        self._validated: OrderedDict[bytes, list[Op]] = OrderedDict()
        self.arrivals: deque[tuple[int, int]] = deque(maxlen=ARRIVAL_LOG)
        # lists of ops, one per publish() call (an API request: at most 1,024 ops)
        self._outgoing_send, self._outgoing = trio.open_memory_channel[list[Op]](OUTGOING_LISTS)
        metrics.gauge(
            "gossip_outbound_queue",
            lambda: {(): self.outbound_depth()},
            help="RPCs in the fullest per-peer outbound queue of py-libp2p (drops at 32)",
        )

    # --- inbound ---

    def validate(self, forwarder: Any, msg: Any) -> bool:
        """py-libp2p topic validator (synchronous). Never raises.

        Our own publishes (forwarder = us: only ``Pubsub.publish`` passes that) carry ops
        ``Node.submit_ops`` validated (and rate-limited) already; they are not checked twice.
        A rejection is counted, and charged to the peer that forwarded the message.
        """
        if forwarder is not None and _peer_bytes(forwarder) == self.own_peer_id:
            return True
        reason = self._check(forwarder, msg)
        if reason is None:
            return True
        try:
            self._reject(reason)
            peer = _peer_base58(forwarder)
            if peer and self.on_reject is not None:
                self.on_reject(peer, reason)
        except Exception as exc:  # e.g. at shutdown; the answer stands
            log.warning("gossip rejection bookkeeping failed: %s: %s", type(exc).__name__, exc)
        return False

    def _check(self, forwarder: Any, msg: Any) -> str | None:
        """None if the message is valid (its ops then wait in the cache), else the reason."""
        try:
            if self.is_blocked(bytes(msg.from_id)) or self.is_blocked(_peer_bytes(forwarder)):
                return "blocked_peer"
            if len(msg.data) > self.max_bytes:
                return "too_large"
            ops = decode_ops(
                msg.data,
                max_bytes=self.max_bytes,
                max_ops=MAX_OPS_PER_MESSAGE,
                max_payload=self.max_payload,
            )
            now = self.clock_ms()
            if ops and max(op.hlc.physical_ms for op in ops) - now > 2 * self.max_offset_ms:
                # beyond any honest clock difference: as bad as a forgery (and checked before
                # the signatures, so a forged far-future op is not the cheaper offence)
                return "far_future"
            fresh = ops
            if forwarder is not None and self.new_to_us is not None:  # not a re-validation
                # A held message has these very bytes (its id hashes them, signature
                # included) and was verified when stored: only the others are checked.
                fresh = self.new_to_us(ops)
                if not fresh:
                    return "nothing_new"  # a replay: neither written nor forwarded
            for op in fresh:
                validate_op(op, now_ms=now, max_offset_ms=self.max_offset_ms)
            if forwarder is not None and not self._within_author_rates(fresh):
                return "rate_limited"
        except InvalidInput as exc:
            return exc.reason
        except Exception as exc:  # a validator must answer, whatever the input did
            log.warning("gossip validator error: %s: %s", type(exc).__name__, exc)
            return "internal"
        self._validated[_msg_key(msg)] = ops
        while len(self._validated) > VALIDATED_CACHE:
            self._validated.popitem(last=False)
        return None

    def _within_author_rates(self, ops: list[Op]) -> bool:
        """Take each author's new ops from its token bucket; False if one is over its rate.

        Only ops this replica does not hold count: replaying an author's old ops must not
        spend the author's budget. The whole message is refused when one author is over (a
        validator accepts or drops a message, not parts of it): nothing of it is written or
        forwarded. Anti-entropy is not limited per author — it carries history — so the ops
        still arrive later, at sync's pace.
        """
        if self.author_limits is None:
            return True
        per_author: dict[bytes, int] = {}
        for op in ops:
            author = op_author(op)
            per_author[author] = per_author.get(author, 0) + 1
        now = trio.current_time()
        return all(self.author_limits.take(a, n, now) for a, n in per_author.items())

    def _reject(self, reason: str) -> None:
        self.metrics.inc(
            "gossip_rejected", reason=reason, help="gossip messages rejected by the validator"
        )

    async def receive_loop(self, subscription: Any) -> None:
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
                if bytes(msg.from_id) == self.own_peer_id:
                    continue
                ops = self._validated.pop(_msg_key(msg), None)
                if ops is None:  # validated before the cache turned over: validate again
                    if not self.validate(None, msg):
                        continue
                    ops = self._validated.pop(_msg_key(msg))
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
                except Exception as exc:  # counted by the writer; anti-entropy repairs it
                    log.info("gossip write failed: %s", exc)
                    continue
                fresh = [op for op, is_new in zip(ops, new, strict=True) if is_new]
                now = self.clock_ms()
                self.arrivals.extend((op.hlc.pack(), now) for op in fresh)
                if self.on_applied is not None:
                    self.on_applied(fresh)

    # --- outbound ---

    async def publish(self, ops: list[Op]) -> None:
        """Queue ops for gossip (waits while the publisher is behind)."""
        await self._outgoing_send.send(list(ops))

    async def publish_loop(self) -> None:
        """Gather queued ops into messages and publish them.

        A message closes when it holds ``batch_ops`` ops or half of ``max_bytes``, or
        ``batch_delay`` after its first op, and no sooner than ``min_interval`` after the
        previous message: py-libp2p costs every peer milliseconds of CPU per message
        whatever its size, so the message rate, not the op rate, is what saturates a
        cluster at moderate load (``chatsync bench gossip``'s floor). After a quiet spell
        the first op still leaves after ``batch_delay``. Nor does a message close while
        py-libp2p's outbound queue to some peer holds ``PACE_DEPTH`` RPCs or more (that
        queue drops what does not fit in 32): then the publisher keeps gathering, so under
        load messages grow instead of being dropped. It waits for room at most
        ``PACE_MAX_WAIT_S`` (a stuck peer must not stall gossip to the others;
        anti-entropy repairs what that peer misses).
        """
        pending: list[Op] = []
        last_publish = -math.inf
        async with self._outgoing:
            while True:
                if not pending:
                    pending = await self._outgoing.receive()
                now = trio.current_time()
                deadline = max(now + self.batch_delay_s, last_publish + self.min_interval_s)
                give_up = deadline + PACE_MAX_WAIT_S
                while not self._full(pending):
                    now = trio.current_time()
                    if now >= deadline:
                        if now >= give_up or self.outbound_depth() < PACE_DEPTH:
                            break
                        wake = min(now + PACE_POLL_S, give_up)
                    else:
                        wake = deadline
                    with trio.move_on_at(wake):
                        pending += await self._outgoing.receive()
                batch, pending = self._take(pending)
                await self._wait_for_room(give_up)
                last_publish = trio.current_time()
                await self._publish_batch(batch)

    def _full(self, pending: list[Op]) -> bool:
        """Drain what is queued without waiting; True once a message's worth is pending."""
        while len(pending) < self.batch_ops:
            try:
                pending += self._outgoing.receive_nowait()
            except trio.WouldBlock:
                break
        return len(pending) >= self.batch_ops or _size(pending) > self.max_bytes // 2

    def _take(self, pending: list[Op]) -> tuple[list[Op], list[Op]]:
        """One message's worth from the head of ``pending``, and the rest."""
        size, n = 0, 0
        for op in pending[: self.batch_ops]:
            size += _op_size(op)
            n += 1
            if size > self.max_bytes // 2:
                break
        return pending[:n], pending[n:]

    def outbound_depth(self) -> int:
        """RPCs waiting in the fullest of py-libp2p's per-peer outbound queues."""
        queues = getattr(self.pubsub, "peer_queues", None) or {}
        return max((len(q) for q in list(queues.values())), default=0)

    async def _wait_for_room(self, give_up: float) -> None:
        if self.outbound_depth() < PACE_DEPTH:
            return
        self.metrics.inc(
            "gossip_publish_paced", help="publishes held back by a deep outbound queue"
        )
        while self.outbound_depth() >= PACE_DEPTH and trio.current_time() < give_up:
            await trio.sleep(PACE_POLL_S)

    async def _publish_batch(self, batch: list[Op]) -> None:
        data = encode_ops(batch)
        while len(data) > self.max_bytes and len(batch) > 1:
            half = len(batch) // 2
            await self._publish_batch(batch[:half])
            batch = batch[half:]
            data = encode_ops(batch)
        await self.pubsub.publish(self.topic, data)
        self.metrics.inc("gossip_messages_published", help="gossip messages published")
        self.metrics.inc("gossip_ops_published", len(batch), help="ops published by gossip")


def _size(ops: list[Op]) -> int:
    return sum(_op_size(op) for op in ops)


def _op_size(op: Op) -> int:
    return len(op.encoded) if hasattr(op, "encoded") else 256


def _msg_key(msg: Any) -> bytes:
    return bytes(msg.from_id) + bytes(msg.seqno)


def _peer_base58(peer: Any) -> str:
    try:
        return str(peer.to_base58()) if peer is not None else ""
    except AttributeError:
        return ""


def _peer_bytes(peer: Any) -> bytes:
    if peer is None:
        return b""
    try:
        return bytes(peer.to_bytes())
    except AttributeError:
        return b""
