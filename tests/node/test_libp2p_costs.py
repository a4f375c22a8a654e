"""py-libp2p's costs taken out (node/libp2p_costs.py), on real hosts' records and a real router.

A record is checked once per peer and bytes: the same bytes again cost nothing, other bytes
(a new record, a forgery, another peer's) are checked in full, a refused one is never
remembered, and a remembered one is checked again after ``RECHECK_S``.
"""

from __future__ import annotations

import os
from typing import Any

import blake3
import libp2p.pubsub.gossipsub as gossipsub_module
import libp2p.pubsub.pubsub as pubsub_module
import pytest
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.peerstore import env_to_send_in_RPC
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.utils import maybe_consume_signed_record

import node.p2p.costs as costs
from node.p2p.costs import RECHECK_S, RememberedRecords
from node.p2p.host import GOSSIP_PROTOCOLS


class Counted:
    """py-libp2p's own function, counting the calls that reach it."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, msg: Any, host: Any, peer_id: Any) -> bool:
        self.calls += 1
        return bool(maybe_consume_signed_record(msg, host, peer_id))


@pytest.fixture
def hosts() -> tuple[Any, Any]:
    return new_host(key_pair=create_new_key_pair()), new_host(key_pair=create_new_key_pair())


def record_of(host: Any) -> Any:
    envelope, _ = env_to_send_in_RPC(host)
    return rpc_pb2.RPC(senderRecord=envelope)


def test_the_same_record_from_the_same_peer_is_checked_once(hosts: tuple[Any, Any]) -> None:
    sender, receiver = hosts
    counted, now = Counted(), [0.0]
    remembered = RememberedRecords(counted, clock=lambda: now[0])
    rpc = record_of(sender)
    assert all(remembered(rpc, receiver, sender.get_id()) for _ in range(5))
    assert counted.calls == 1
    now[0] = RECHECK_S - 0.001
    assert remembered(rpc, receiver, sender.get_id()) and counted.calls == 1
    now[0] = RECHECK_S
    assert remembered(rpc, receiver, sender.get_id()) and counted.calls == 2  # checked again


def test_forged_or_misattributed_records_are_checked_every_time(hosts: tuple[Any, Any]) -> None:
    sender, receiver = hosts
    counted = Counted()
    remembered = RememberedRecords(counted)
    rpc = record_of(sender)
    forged = bytearray(rpc.senderRecord)
    forged[-5] ^= 1
    for _ in range(3):
        assert not remembered(rpc_pb2.RPC(senderRecord=bytes(forged)), receiver, sender.get_id())
        assert not remembered(rpc, receiver, receiver.get_id())  # another peer's record
    assert counted.calls == 6
    assert remembered(rpc, receiver, sender.get_id())  # the genuine one still passes
    assert counted.calls == 7


def test_an_rpc_without_a_record_goes_straight_through(hosts: tuple[Any, Any]) -> None:
    sender, receiver = hosts
    counted = Counted()
    remembered = RememberedRecords(counted)
    assert remembered(rpc_pb2.RPC(), receiver, sender.get_id())
    assert remembered(rpc_pb2.RPC(), receiver, sender.get_id())
    assert counted.calls == 2


def test_the_memory_is_bounded(hosts: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(costs, "RECORDS_REMEMBERED", 2)
    sender, receiver = hosts
    remembered = RememberedRecords(Counted())
    rpc = record_of(sender)
    peers = [new_host(key_pair=create_new_key_pair()).get_id() for _ in range(3)]
    for peer in peers:  # each claims the sender's record: refused, so never remembered
        remembered(rpc, receiver, peer)
    remembered(rpc, receiver, sender.get_id())
    assert len(remembered.accepted) == 1


def test_window_updates_wait_for_half_the_window_unless_the_operator_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PY_YAMUX_RELEASE_ON_READ", raising=False)
    costs.take_out_costs()
    assert os.environ["PY_YAMUX_RELEASE_ON_READ"] == "0"
    monkeypatch.setenv("PY_YAMUX_RELEASE_ON_READ", "1")
    costs.take_out_costs()
    assert os.environ["PY_YAMUX_RELEASE_ON_READ"] == "1"
    for module in (pubsub_module, gossipsub_module):  # wrapped once, however often applied
        assert isinstance(module.maybe_consume_signed_record, RememberedRecords)
        assert not isinstance(module.maybe_consume_signed_record.consume, RememberedRecords)


def pubsub_message(data: bytes, topics: tuple[str, ...] = ("t",), seqno: bytes = b"\x01") -> Any:
    return rpc_pb2.Message(from_id=b"\x00\x25peer", seqno=seqno, data=data, topicIDs=topics)


def test_equivocation_is_caught_by_a_digest_not_by_keeping_the_message() -> None:
    costs.take_out_costs()
    router = GossipSub(GOSSIP_PROTOCOLS, degree=6, degree_low=4, degree_high=12)
    big = bytes(300_000)
    assert router._check_equivocation(pubsub_message(big))
    assert router._check_equivocation(pubsub_message(big))  # the same again: fine
    (kept,) = router.equivocation_detection.values()
    assert kept == blake3.blake3(big + b"t").digest()  # 32 bytes, not the 300 KB message
    assert not router._check_equivocation(pubsub_message(big + b"x"))  # other data
    assert not router._check_equivocation(pubsub_message(big, ("t", "u")))  # other topics
    assert router._check_equivocation(pubsub_message(big + b"x", seqno=b"\x02"))  # a new one
    assert len(router.equivocation_detection) == 2


def test_our_own_record_is_built_once_per_interval_and_per_host(hosts: tuple[Any, Any]) -> None:
    a, b = hosts
    builds: list[Any] = []

    def build(host: Any) -> tuple[bytes, bool]:
        builds.append(host)
        return env_to_send_in_RPC(host)

    clock = [0.0]
    reused = costs.ReusedOwnRecord(build, clock=lambda: clock[0])
    first = [reused(a)[0] for _ in range(100)]
    assert len(builds) == 1 and len(set(first)) == 1
    assert reused(b)[0] != first[0] and len(builds) == 2  # each host its own record
    clock[0] = costs.OWN_RECORD_S
    assert reused(a)[0] == first[0] and len(builds) == 3  # looked up again after the interval
