"""A peer's budget for gossip that brings nothing: replays spend it, a flood is throttled
(dropped unread) and then banned, an honest relay of new ops beside it is untouched.

The node's own services (``build_services``, no libp2p), its validator called as py-libp2p
calls it, on trio's ``MockClock`` moved by hand."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from node.clock import Clock
from node.config import NodeConfig
from node.gossip.validation import GossipValidator
from node.limits import GossipWaste
from node.services import build_services
from node.verify import ProcessVerifier
from store.ops import encode_ops
from sync.replica import DbReplica

from node_support import messages, seed, small_db


class _Pubsub:
    def __init__(self) -> None:
        self.peer_queues: dict[bytes, list[object]] = {}

    async def publish(self, topic_id: str, data: bytes) -> None:
        pass


def test_the_waste_budget_throttles_after_its_burst_and_pays_debts_back() -> None:
    waste = GossipWaste(messages_per_s=2, bytes_per_s=1_000, burst_s=10)  # 20 msgs, 10 kB
    for _ in range(20):
        assert not waste.throttled("p", 0.0)
        waste.spend("p", 10, 0.0)
    assert waste.throttled("p", 0.0) and not waste.throttled("q", 0.0)
    assert not waste.throttled("p", 0.5)  # one message back after 0.5 s
    waste.spend("p", 30_000, 0.5)  # one huge message: in debt (floored at the burst)
    assert waste.throttled("p", 10.0) and not waste.throttled("p", 20.6)


async def test_a_replay_flood_is_throttled_then_banned_while_an_honest_relay_gets_through(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    """2,000 replays of a held op in 10 s, beside 100 new ops from an honest relay: the
    flooder spends its burst (200 messages), is throttled — its messages dropped before they
    are decoded — and banned by the drops' points; every honest op is accepted."""
    db = small_db(tmp_path / "node")
    held = messages(0, 1)
    seed(db, held)
    services = build_services(
        NodeConfig(), DbReplica(db), clock=Clock.system(), pubsub=_Pubsub(),
        own_peer_id=b"me", verifier=ProcessVerifier(0),
    )  # fmt: skip
    decoded = _count_decodes(services.gossip.validator)
    flooder, relay = _peer(), _peer()
    honest_ok = 0
    try:
        fresh = iter(messages(100, 100))
        for tick in range(2_000):  # 5 ms apart: 10 s
            services.gossip.validate(flooder, _message(flooder, tick, encode_ops(held)))
            if tick % 20 == 0:  # 10 new ops per second from the relay
                op = next(fresh)
                honest_ok += services.gossip.validate(
                    relay, _message(relay, tick, encode_ops([op]))
                )
            mock_clock.jump(0.005)
        metrics = services.metrics
        assert honest_ok == 100
        assert flooder.to_base58() in services.blocklist
        assert relay.to_base58() not in services.blocklist
        nothing_new = metrics.counter("gossip_rejected", reason="nothing_new")
        throttled = metrics.counter("gossip_rejected", reason="throttled")
        blocked = metrics.counter("gossip_rejected", reason="blocked_peer")
        # the burst, and what the rate (20/s) paid back while the flood spent it (~1.1 s)
        assert 200 <= nothing_new <= 240
        assert 20 <= throttled <= 25  # 0.5 points each (less a little decay): the ban at 10
        assert nothing_new + throttled + blocked == 2_000
        assert decoded() == nothing_new + 100  # throttled and blocked: never decoded
    finally:
        db.close()


def _peer() -> ID:
    return ID.from_pubkey(create_new_key_pair().public_key)


def _message(origin: ID, seqno: int, data: bytes) -> Any:
    return SimpleNamespace(from_id=origin.to_bytes(), seqno=seqno.to_bytes(8, "big"), data=data)


def _count_decodes(validator: GossipValidator) -> Any:
    calls = [0]
    check = validator.check

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return check(*args, **kwargs)

    validator.check = counted  # type: ignore[method-assign]
    return lambda: calls[0]
