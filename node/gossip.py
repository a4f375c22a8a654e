"""Gossip of signed ops: a synchronous validator, a receiver feeding the writer, a batching publisher.

The validator is what py-libp2p calls for every message, ours included: size,
envelope and op schema, each op's signature and HLC drift. It must be cheap and
must not raise (a raise would be a bug in the router's hands), so every failure
is a logged, counted ``False``. Decoded ops are kept for the receiver, so a
message is decoded once.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import trio

from node.metrics import Metrics
from node.writer import DbWriter
from store.errors import InvalidInput
from store.ops import Op, decode_ops, encode_ops, validate_op

log = logging.getLogger(__name__)

MAX_OPS_PER_MESSAGE = 4096
VALIDATED_CACHE = 4096


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
        is_blocked: Callable[[bytes], bool] = lambda peer: False,
        on_applied: Callable[[list[Op]], None] | None = None,
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
        self.is_blocked = is_blocked
        self.on_applied = on_applied
        self._validated: OrderedDict[bytes, list[Op]] = OrderedDict()
        self._outgoing_send, self._outgoing = trio.open_memory_channel[Op](batch_ops * 16)

    # --- inbound ---

    def validate(self, forwarder: Any, msg: Any) -> bool:
        """py-libp2p topic validator (synchronous). Never raises."""
        try:
            if self.is_blocked(bytes(msg.from_id)) or self.is_blocked(_peer_bytes(forwarder)):
                self._reject("blocked_peer")
                return False
            if len(msg.data) > self.max_bytes:
                self._reject("too_large")
                return False
            ops = decode_ops(
                msg.data,
                max_bytes=self.max_bytes,
                max_ops=MAX_OPS_PER_MESSAGE,
                max_payload=self.max_payload,
            )
            now = self.clock_ms()
            for op in ops:
                validate_op(op, now_ms=now, max_offset_ms=self.max_offset_ms)
        except InvalidInput as exc:
            self._reject(exc.reason)
            return False
        except Exception as exc:  # a validator must answer, whatever the input did
            log.warning("gossip validator error: %s: %s", type(exc).__name__, exc)
            self._reject("internal")
            return False
        self._validated[_msg_key(msg)] = ops
        while len(self._validated) > VALIDATED_CACHE:
            self._validated.popitem(last=False)
        return True

    def _reject(self, reason: str) -> None:
        self.metrics.inc(
            "gossip_rejected", reason=reason, help="gossip messages rejected by the validator"
        )

    async def receive_loop(self, subscription: Any) -> None:
        """Apply every validated message from the subscription (our own are skipped)."""
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
            new = await self.writer.submit(ops)
            if self.on_applied is not None:
                self.on_applied([op for op, is_new in zip(ops, new, strict=True) if is_new])

    # --- outbound ---

    async def publish(self, ops: list[Op]) -> None:
        """Queue ops for gossip (waits while the publisher is behind)."""
        for op in ops:
            await self._outgoing_send.send(op)

    async def publish_loop(self) -> None:
        """Gather queued ops into messages of up to ``batch_ops`` ops / ``max_bytes`` and publish."""
        async with self._outgoing:
            while True:
                batch = [await self._outgoing.receive()]
                size = _op_size(batch[0])
                with trio.move_on_after(self.batch_delay_s):
                    while len(batch) < self.batch_ops:
                        op = await self._outgoing.receive()
                        batch.append(op)
                        size += _op_size(op)
                        if size > self.max_bytes // 2:
                            break
                await self._publish_batch(batch)

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


def _op_size(op: Op) -> int:
    return len(op.encoded) if hasattr(op, "encoded") else 256


def _msg_key(msg: Any) -> bytes:
    return bytes(msg.from_id) + bytes(msg.seqno)


def _peer_bytes(peer: Any) -> bytes:
    if peer is None:
        return b""
    try:
        return bytes(peer.to_bytes())
    except AttributeError:
        return b""
