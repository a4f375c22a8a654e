"""sync/peering.py: the peer book's bounds, the rotation's fairness, the exchange's frames."""

from __future__ import annotations

import contextlib
import itertools
import random

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sync.errors import RemoteProtocolError
from sync.peering import (
    EXCHANGE_MAX_PEERS,
    HEARD_MAX,
    HEARD_MAX_FAILURES,
    HEARD_PER_SOURCE,
    MAX_ADDRS,
    MAX_EXCHANGE_BYTES,
    TRIED_MAX,
    KnownPeer,
    PeerBook,
    SyncRotation,
    backoff_ms,
    decode_ask,
    decode_peers,
    encode_ask,
    encode_peers,
    surplus,
)


def _addr(n: int) -> str:
    return f"/ip4/127.0.0.1/tcp/{4000 + n}/p2p/p{n}"


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    rnd = random.Random(1)
    samples = [backoff_ms(n, 500, 30_000, rnd) for n in range(12)]
    assert all(500 <= s <= 30_000 for s in samples)
    assert max(samples[8:]) > max(samples[:2])  # grows
    assert len(set(samples)) == len(samples)  # jittered


def test_a_liar_fills_its_own_corner_of_heard_not_the_honest_entries() -> None:
    book = PeerBook("me")
    honest = [(f"h{i}", [_addr(i)]) for i in range(20)]
    book.heard("honest", honest, now_ms=1)
    for batch in range(100):  # 3,200 fake peers, 32 at a time
        fakes = [(f"fake{batch}-{i}", [_addr(i)]) for i in range(32)]
        book.heard("liar", fakes, now_ms=2 + batch)
    sources = [p.source for p in book.peers.values()]
    assert sources.count("honest") == 20
    assert sources.count("liar") == HEARD_PER_SOURCE
    assert len(book.peers) <= HEARD_MAX + TRIED_MAX


def test_many_liars_never_grow_the_book_past_its_bound() -> None:
    book = PeerBook("me")
    for liar in range(100):
        book.heard(f"liar{liar}", [(f"f{liar}-{i}", [_addr(i)]) for i in range(32)], liar)
    counts = book.counts()
    assert counts["heard"] == HEARD_MAX and counts["tried"] == 0


def test_hearsay_does_not_replace_the_address_of_a_peer_we_reached() -> None:
    book = PeerBook("me")
    book.connected("p1", [_addr(1)], now_ms=1)
    book.heard("liar", [("p1", ["/ip4/10.0.0.1/tcp/1/p2p/p1"])], now_ms=2)
    assert book.peers["p1"].addrs == (_addr(1),)


def test_a_heard_peer_is_forgotten_after_failed_dials_a_pinned_one_never() -> None:
    book, rnd = PeerBook("me"), random.Random(1)
    book.heard("x", [("p1", [_addr(1)])], now_ms=0)
    book.pin("boot", _addr(2))
    for _ in range(HEARD_MAX_FAILURES):
        book.dial_failed("p1", 0, rnd)
    for _ in range(50):
        book.dial_failed("boot", 0, rnd)
    assert "p1" not in book.peers
    assert book.peers["boot"].pinned and book.peers["boot"].next_dial_ms > 0


def test_to_dial_mixes_tried_and_heard_pins_last_respects_backoff_and_skip() -> None:
    book, rnd = PeerBook("me"), random.Random(1)
    book.pin("boot", _addr(99))
    book.heard("x", [(f"h{i}", [_addr(i)]) for i in range(10)], now_ms=0)
    for i in range(10):
        book.connected(f"t{i}", [_addr(50 + i)], now_ms=0)
    book.dial_failed("t9", now_ms=0, rnd=rnd)  # backing off
    picks = [p.peer_id for _ in range(200) for p in book.to_dial(2, {"h0"}, 1, rnd)]
    assert "t9" not in picks and "h0" not in picks and "boot" not in picks
    assert 150 < sum(p.startswith("t") for p in picks) < 250  # of 400: about half tried
    names = [p.peer_id for p in book.to_dial(30, skip={"h0"}, now_ms=1, rnd=rnd)]
    assert len(names) == 19 and names[-1] == "boot"  # every other due peer first
    only_pins = book.to_dial(3, skip=set(book.peers) - {"boot"}, now_ms=1, rnd=rnd)
    assert [p.peer_id for p in only_pins] == ["boot"]


def test_the_book_round_trips_through_its_saved_form_and_refuses_junk() -> None:
    book = PeerBook("me")
    for i in range(5):
        book.connected(f"t{i}", [_addr(i)], now_ms=i)
    book.heard("x", [("h", [_addr(9)])], now_ms=9)  # hearsay is not saved
    restored = PeerBook("me")
    assert restored.restore(book.saved(), now_ms=0) == 5
    assert {p for p, e in restored.peers.items() if e.tried} == {f"t{i}" for i in range(5)}
    junk = {"peers": [1, "x", {"id": 5}, {"id": "me", "addrs": [_addr(1)]}, {"id": "ok"}]}
    assert PeerBook("me").restore(junk, 0) == 0
    assert PeerBook("me").restore("not a dict", 0) == 0


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["heard", "connected", "failed"]),
            st.integers(0, 40),
            st.integers(0, 5),
        ),
        max_size=300,
    )
)
@settings(max_examples=60, deadline=None)
def test_whatever_happens_the_book_stays_bounded_and_pins_stay(
    events: list[tuple[str, int, int]],
) -> None:
    book, rnd = PeerBook("me"), random.Random(0)
    book.pin("boot", _addr(99))
    for t, (kind, peer, source) in enumerate(events):
        name = f"p{peer}"
        if kind == "heard":
            book.heard(f"s{source}", [(name, [_addr(peer)]), ("me", [_addr(0)])], t)
        elif kind == "connected":
            book.connected(name, [_addr(peer)], t)
        else:
            book.dial_failed(name, t, rnd)
            book.dial_failed("boot", t, rnd)
    assert "boot" in book.peers and "me" not in book.peers
    assert all(len(p.addrs) <= MAX_ADDRS for p in book.peers.values())
    heard_by = [p.source for p in book.peers.values() if not p.tried and not p.pinned]
    assert all(heard_by.count(s) <= HEARD_PER_SOURCE for s in set(heard_by))


def test_surplus_closes_only_the_connections_over_the_high_water() -> None:
    rnd = random.Random(1)
    peers = [f"p{i}" for i in range(12)]
    assert surplus(peers[:10], 10, rnd) == []
    closing = surplus(peers, 10, rnd)
    assert len(closing) == 2 and set(closing) <= set(peers)
    young = set(peers[:11])
    assert surplus(peers, 10, rnd, young) == ["p11"]  # the young are spared
    assert surplus(peers, 10, rnd, set(peers)) == []  # all young: over the water a while


def _sessions(peers: list[str], per_interval: int, intervals: int) -> dict[str, list[int]]:
    """When each peer got a session, with the scheduler looking every 250 ms."""
    rotation = SyncRotation(10_000, per_interval, random.Random(3))
    started: dict[str, list[int]] = {p: [] for p in peers}
    for now in range(0, intervals * 10_000, 250):
        for peer in rotation.pick(peers, now):
            started[peer].append(now)
    return started


def test_new_peers_go_at_once_then_few_per_interval_each_within_a_bound() -> None:
    peers = [f"p{i}" for i in range(10)]
    started = _sessions(peers, per_interval=2, intervals=30)
    assert all(times[0] == 0 for times in started.values())  # just connected: at once
    later = sum(len(t) - 1 for t in started.values())
    assert 2 * 30 * 0.8 <= later <= 2 * 30 * 1.3  # ~2 per interval, not 10
    for times in started.values():  # every peer within ceil(10 / 2) = 5 intervals (+ jitter)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert max(gaps) <= 5 * 10_000 * 1.3, gaps


def test_with_few_peers_each_is_synced_about_once_an_interval_not_more() -> None:
    started = _sessions(["a"], per_interval=2, intervals=20)
    gaps = [b - a for a, b in itertools.pairwise(started["a"])]
    assert all(7_500 <= g <= 12_500 for g in gaps), gaps


def test_a_session_that_asks_to_go_on_is_followed_at_once() -> None:
    rotation = SyncRotation(10_000, 2, random.Random(1))
    assert rotation.pick(["a", "b"], 0) == ["a", "b"]
    assert rotation.pick(["a", "b"], 250) == []
    rotation.go_on("b")
    assert rotation.pick(["a", "b"], 500) == ["b"]
    rotation.keep_only(["a"])
    assert rotation.pick(["a", "b"], 750) == ["b"]  # left and came back: new again


def test_exchange_frames_round_trip() -> None:
    peers = [KnownPeer(f"p{i}", (_addr(i), _addr(i + 100))) for i in range(40)]
    told = decode_peers(encode_peers(peers))
    assert len(told) == EXCHANGE_MAX_PEERS
    assert told[0] == ("p0", [_addr(0), _addr(100)])
    assert decode_ask(encode_ask([_addr(1)])) == [_addr(1)]


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\xff\xff",
        cbor2.dumps([2]),
        cbor2.dumps([1, [_addr(1)]]),  # an ask where peers are expected
        cbor2.dumps([2, "peers"]),
        cbor2.dumps([2, [["p", [_addr(1)]]] * (EXCHANGE_MAX_PEERS + 1)]),
        cbor2.dumps([2, [["p", [_addr(i) for i in range(MAX_ADDRS + 1)]]]]),
        cbor2.dumps([2, [["p", ["x" * 300]]]]),
        cbor2.dumps([2, [[7, [_addr(1)]]]]),
        cbor2.dumps([2, [["p" * 200, [_addr(1)]]]]),
        cbor2.dumps([2, [["p", []]]]),
        b"\x00" * (MAX_EXCHANGE_BYTES + 1),
    ],
)
def test_malformed_peer_frames_are_refused_with_our_error(frame: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        decode_peers(frame)


@pytest.mark.parametrize(
    "frame", [cbor2.dumps([1, "addr"]), cbor2.dumps([1, [1]]), cbor2.dumps([2, []]), b"\x81"]
)
def test_malformed_asks_are_refused_with_our_error(frame: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        decode_ask(frame)


@given(st.binary(max_size=512))
@settings(max_examples=300, deadline=None)
def test_garbage_never_escapes_as_another_exception(data: bytes) -> None:
    for decode in (decode_ask, decode_peers):
        with contextlib.suppress(RemoteProtocolError):
            decode(data)
