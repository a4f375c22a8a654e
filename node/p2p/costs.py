"""Costs of py-libp2p 0.8.1 that buy nothing, taken out (``chatsync bench gossip``).

Profiled on bare peers gossiping 20-op messages, the first two were a third of its CPU:

* **A WINDOW_UPDATE per read.** Its yamux streams give back receive credit after every
  read (``PY_YAMUX_RELEASE_ON_READ``, on by default): one more encrypted frame written per
  frame read. Off, credit goes back once half the window is used, as go-yamux does. An
  operator's own setting of the variable is kept.
* **A signature check of the same record in every RPC.** Each pubsub RPC carries the
  sender's signed peer record, and ``maybe_consume_signed_record`` parses it and checks
  its signature every time — twice per RPC (pubsub, then the router). A record whose bytes
  were accepted from that peer in the last ``RECHECK_S`` is not checked again (the peerstore
  keeps a record 2 h from its last check); any other bytes go the whole way.
* **Our own signed peer record, looked up again for every RPC sent.** Each outgoing pubsub
  RPC carries it, and ``env_to_send_in_RPC`` rebuilds the host's listen multiaddrs (CID and
  IP parsing) to check the cached record is current: 7 % of a node's CPU in a loaded
  12-node cluster (``py-spy``). Reused for ``OWN_RECORD_S``; a changed address set is
  picked up then.
* **Every message kept whole to spot equivocation.** GossipSub remembers the first message
  of each (origin, seqno), up to 1,000 of them, to compare a second one with: the messages
  themselves, 30–400 KB each for our batches — most of the 1.1 GB a node held after storing
  a million messages. A 32-byte BLAKE3 digest of the data and topics compares the same.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import blake3
import libp2p.pubsub.gossipsub as gossipsub_module
import libp2p.pubsub.pubsub as pubsub_module
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub

log = logging.getLogger(__name__)

RECORDS_REMEMBERED = 4096  # (peer, record bytes) pairs accepted: one or two per peer
RECHECK_S = 600.0
OWN_RECORD_S = 10.0

Consume = Callable[..., bool]


def take_out_costs() -> None:
    """Apply all four, once per process (the node and the benchmark's bare peers alike)."""
    os.environ.setdefault("PY_YAMUX_RELEASE_ON_READ", "0")
    GossipSub._check_equivocation = _check_equivocation  # type: ignore[method-assign, assignment]
    for module in (pubsub_module, gossipsub_module):
        consume = module.maybe_consume_signed_record
        if not isinstance(consume, RememberedRecords):
            module.maybe_consume_signed_record = RememberedRecords(consume)  # type: ignore[attr-defined]
        own = module.env_to_send_in_RPC
        if not isinstance(own, ReusedOwnRecord):
            module.env_to_send_in_RPC = ReusedOwnRecord(own)  # type: ignore[attr-defined]


class ReusedOwnRecord:
    """``env_to_send_in_RPC``, answered from the last result for ``OWN_RECORD_S`` per host."""

    def __init__(
        self,
        build: Callable[[Any], tuple[bytes, bool]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.build = build
        self.clock = clock
        # host -> (when, envelope bytes); weak: a host that is gone takes its record along
        self.built: weakref.WeakKeyDictionary[Any, tuple[float, bytes]] = (
            weakref.WeakKeyDictionary()
        )

    def __call__(self, host: Any) -> tuple[bytes, bool]:
        now = self.clock()
        cached = self.built.get(host)
        if cached is not None and now - cached[0] < OWN_RECORD_S:
            return cached[1], False
        envelope, created = self.build(host)
        self.built[host] = (now, envelope)
        return envelope, created


class RememberedRecords:
    """``maybe_consume_signed_record``, skipped for the bytes it last accepted from a peer."""

    def __init__(self, consume: Consume, clock: Callable[[], float] = time.monotonic) -> None:
        self.consume = consume
        self.clock = clock
        self.accepted: OrderedDict[tuple[Any, bytes], float] = OrderedDict()  # -> when

    def __call__(self, msg: Any, host: Any, peer_id: Any) -> bool:
        if not msg.HasField("senderRecord"):
            return self.consume(msg, host, peer_id)
        key, now = (peer_id, bytes(msg.senderRecord)), self.clock()
        if now - self.accepted.get(key, -RECHECK_S) < RECHECK_S:
            return True
        ok = self.consume(msg, host, peer_id)
        if ok:
            self.accepted[key] = now
            self.accepted.move_to_end(key)
            while len(self.accepted) > RECORDS_REMEMBERED:
                self.accepted.popitem(last=False)
        return ok


def _check_equivocation(router: GossipSub, msg: Any) -> bool:
    """``GossipSub._check_equivocation``, remembering a digest of each first message (its
    store, ``equivocation_detection``, is pruned by size in the router's heartbeat)."""
    seen: dict[bytes, Any] = router.equivocation_detection
    key = msg.from_id + msg.seqno
    digest = blake3.blake3(msg.data + b"\0".join(t.encode() for t in msg.topicIDs)).digest()
    first = seen.get(key)
    if first is None:
        seen[key] = digest
        return True
    if first == digest:
        return True
    log.warning("Equivocation detected from peer %s", ID(msg.from_id))
    if router.scorer is not None:
        router.scorer.penalize_equivocation(ID(msg.from_id), 100.0)
    return False
