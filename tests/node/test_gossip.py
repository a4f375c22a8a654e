"""Gossip's pure parts: the validator's checks and their order, the batcher's decisions (fast).

No trio, no libp2p: ``GossipValidator.check`` takes the bytes and ``now_ms``, ``Batcher``
takes ``now`` and the outbound depth. The service around them (``GossipService``) runs in
``test_config_and_parts.py`` (the publisher on trio's clock) and against real peers in
``test_cluster.py`` / ``test_limits.py``.
"""

from __future__ import annotations

import cbor2
import pytest

from node.gossip import Batcher, GossipSettings, GossipValidator
from node.gossip.batching import (
    PACE_DEPTH,
    PACE_MAX_WAIT_S,
    PACE_POLL_S,
    Publishers,
    encode_messages,
)
from node.limits import AuthorRates
from store.errors import InvalidInput
from store.hlc import Hlc
from store.ops import Op, decode_ops, encode_ops
from store.records import MsgV1

from node_support import CHAT, KEYS, messages

NOW_MS = 10_000
SETTINGS = GossipSettings(
    topic="t", own_peer_id=b"me", max_bytes=64 * 1024, max_payload=1024, max_offset_ms=1_000,
    batch_ops=10, batch_delay_ms=20, min_interval_ms=500,
)  # fmt: skip


def reason(validator: GossipValidator, data: bytes, *, first_sight: bool = True) -> str | None:
    try:
        validator.check(data, NOW_MS, first_sight=first_sight)
    except InvalidInput as exc:
        return exc.reason
    return None


def forged(msg: MsgV1) -> bytes:
    """``msg``'s envelope with one payload byte changed: its signature no longer verifies."""
    return encode_ops([msg]).replace(msg.payload, b"X" + msg.payload[1:])


def stamped(ms: int) -> MsgV1:
    return MsgV1.create(KEYS[0], CHAT, Hlc(ms), b"at %d" % ms)


# --- the validator ----------------------------------------------------------------------------


def test_a_valid_message_gives_its_ops() -> None:
    ops = messages(0, 3)
    assert GossipValidator(SETTINGS).check(encode_ops(ops), NOW_MS) == ops


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"\x00" * (SETTINGS.max_bytes + 1), "too_large"),
        (cbor2.dumps([1, [[9, b"?"]]]), "unknown_kind"),
        (b"\xff\xff", "malformed"),
        (cbor2.dumps([2, []]), "unknown_version"),
    ],
)
def test_size_and_schema_come_first(data: bytes, expected: str) -> None:
    assert reason(GossipValidator(SETTINGS), data) == expected


def test_a_far_future_stamp_is_refused_before_any_signature_is_checked() -> None:
    """Beyond twice the allowed drift: as bad as a forgery, and cheaper to tell."""
    far = stamped(NOW_MS + 2 * SETTINGS.max_offset_ms + 1)
    assert reason(GossipValidator(SETTINGS), forged(far)) == "far_future"
    near = stamped(NOW_MS + SETTINGS.max_offset_ms + 1)  # a clock difference, not an offence
    assert reason(GossipValidator(SETTINGS), encode_ops([near])) == "clock_drift"
    assert reason(GossipValidator(SETTINGS), forged(stamped(NOW_MS))) == "bad_signature"


def test_only_ops_not_held_are_checked_and_a_pure_replay_is_nothing_new() -> None:
    held = messages(0, 2)
    held_ids = {m.msg_id for m in held}

    def not_held(ops: list[Op]) -> list[Op]:
        return [op for op in ops if not (isinstance(op, MsgV1) and op.msg_id in held_ids)]

    validator = GossipValidator(SETTINGS, not_held=not_held)
    assert reason(validator, encode_ops(held)) == "nothing_new"
    # validated again by the receive loop: its ops are written, not judged as a replay
    assert reason(validator, encode_ops(held), first_sight=False) is None
    fresh = stamped(NOW_MS)
    assert validator.check(encode_ops([*held, fresh]), NOW_MS) == [*held, fresh]


def test_authors_rates_count_only_new_ops_and_only_on_first_sight() -> None:
    rates = AuthorRates(ops_per_s=0.001, burst=3)
    validator = GossipValidator(SETTINGS, not_held=lambda ops: ops[1:], author_rates=rates)
    ops = messages(0, 4)  # the first counts as held: 3 new ops, the whole burst
    assert reason(validator, encode_ops(ops)) is None
    assert reason(validator, encode_ops(ops), first_sight=False) is None  # not charged twice
    assert reason(validator, encode_ops(messages(10, 2))) == "rate_limited"


# --- the batcher ------------------------------------------------------------------------------


def test_a_message_closes_batch_delay_after_its_first_op() -> None:
    batcher = Batcher(SETTINGS)
    batcher.add(messages(0, 1))
    batcher.open(now=100.0)
    assert batcher.wake_at(100.0, depth=0) == pytest.approx(100.02)
    assert batcher.wake_at(100.02, depth=0) is None
    assert batcher.take() == messages(0, 1) and not batcher.pending


def test_the_next_message_waits_for_min_interval() -> None:
    batcher = Batcher(SETTINGS)
    batcher.published(100.0)
    batcher.add(messages(0, 1))
    batcher.open(now=100.1)
    assert batcher.wake_at(100.1, depth=0) == pytest.approx(100.5)
    assert batcher.wake_at(100.5, depth=0) is None
    batcher.published(100.5)
    batcher.open(now=200.0)  # after a quiet spell: batch_delay only
    assert batcher.wake_at(200.0, depth=0) == pytest.approx(200.02)


def test_more_publishers_space_each_ones_messages_up_to_a_cap() -> None:
    """Each node's share of the network's message budget: P / messages_per_s."""
    settings = GossipSettings(
        **{
            **SETTINGS.__dict__,
            "min_interval_ms": 200,
            "max_interval_ms": 600,
            "messages_per_s": 25,
        }
    )
    batcher = Batcher(settings)
    assert batcher.spacing(1) == pytest.approx(0.2)  # alone: the floor
    assert batcher.spacing(4) == pytest.approx(0.2)
    assert batcher.spacing(10) == pytest.approx(0.4)
    assert batcher.spacing(20) == pytest.approx(0.6)  # capped: latency stays bounded
    assert batcher.spacing(1000) == pytest.approx(0.6)
    batcher.published(100.0)
    batcher.add(messages(0, 1))
    batcher.open(now=100.1, publishers=10)
    assert batcher.wake_at(100.1, depth=0) == pytest.approx(100.4)


def test_publishers_are_counted_over_a_window_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("node.gossip.batching.PUBLISHERS_MAX", 50)
    publishers = Publishers()
    for i in range(200):
        publishers.heard(bytes([i]), now=float(i) / 100)
    assert publishers.count(now=2.0) == 51  # the newest 50, and us
    publishers.heard(b"late", now=20.0)
    assert publishers.count(now=20.0) == 2  # the others fell out of the window


def test_a_full_message_closes_at_once_and_holds_batch_ops() -> None:
    batcher = Batcher(SETTINGS)
    batcher.add(messages(0, 25))
    batcher.open(now=0.0)
    assert not batcher.wants_more() and batcher.wake_at(0.0, depth=0) is None
    assert len(batcher.take()) == 10 and len(batcher.pending) == 15


def test_a_message_holds_at_most_half_of_max_bytes() -> None:
    settings = GossipSettings(**{**SETTINGS.__dict__, "max_bytes": 1_000, "batch_ops": 100})
    batcher = Batcher(settings)
    batcher.add(messages(0, 20))
    batcher.open(now=0.0)
    assert batcher.full()
    batch = batcher.take()
    assert sum(len(m.encoded) for m in batch[:-1]) <= 500 < sum(len(m.encoded) for m in batch)


def test_a_deep_outbound_queue_holds_the_message_until_room_or_give_up() -> None:
    batcher = Batcher(SETTINGS)
    batcher.add(messages(0, 1))
    batcher.open(now=0.0)
    deadline = 0.02
    assert batcher.wake_at(deadline, depth=PACE_DEPTH) == pytest.approx(deadline + PACE_POLL_S)
    assert batcher.wake_at(deadline + 0.1, depth=PACE_DEPTH - 1) is None  # room: close
    give_up = deadline + PACE_MAX_WAIT_S
    assert batcher.wake_at(give_up, depth=PACE_DEPTH) is None  # a stuck peer stalls no one
    assert Batcher.paced(PACE_DEPTH) and not Batcher.paced(PACE_DEPTH - 1)
    assert batcher.hold_for_room(give_up - 0.01, PACE_DEPTH)
    assert not batcher.hold_for_room(give_up, PACE_DEPTH)


def test_an_oversized_batch_is_split_in_halves_in_order() -> None:
    ops = messages(0, 8)
    one = len(encode_ops(ops[:1]))
    parts = encode_messages(ops, max_bytes=3 * one)
    assert [n for n, _ in parts] == [2, 2, 2, 2]
    decoded = [op for _, data in parts for op in decode_ops(data, max_bytes=1 << 20, max_ops=99)]
    assert decoded == ops and all(len(data) <= 3 * one for _, data in parts)
