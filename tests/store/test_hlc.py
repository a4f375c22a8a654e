"""Hybrid logical clock: packing, byte order, send and receive rules, overflow, drift."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from store import ClockDriftError, Hlc, HlcClock, InvalidInput
from store.hlc import (
    DEFAULT_MAX_OFFSET_MS,
    HLC_ZERO,
    MAX_LOGICAL,
    MAX_PACKED,
    MAX_PHYSICAL,
    VIRTUAL_EPOCH_MS,
)

from store_support import hlcs

physical_times = st.integers(0, MAX_PHYSICAL)


# --- packing ------------------------------------------------------------------------------


@given(hlcs)
def test_pack_unpack_round_trip(stamp: Hlc) -> None:
    packed = stamp.pack()
    assert 0 <= packed <= MAX_PACKED
    assert packed == (stamp.physical_ms << 16) | stamp.logical
    assert Hlc.unpack(packed) == stamp
    assert len(stamp.to_bytes()) == 8
    assert Hlc.from_bytes(stamp.to_bytes()) == stamp


@given(st.integers(0, MAX_PACKED))
def test_unpack_pack_round_trip(packed: int) -> None:
    assert Hlc.unpack(packed).pack() == packed


@given(hlcs, hlcs)
def test_big_endian_bytes_sort_in_time_order(a: Hlc, b: Hlc) -> None:
    time_order = (a.physical_ms, a.logical) < (b.physical_ms, b.logical)
    assert (a < b) == time_order
    assert (a.pack() < b.pack()) == time_order
    assert (a.to_bytes() < b.to_bytes()) == time_order
    assert (a.to_bytes() == b.to_bytes()) == (a == b)


@given(st.lists(hlcs, max_size=30))
def test_sorting_bytes_sorts_stamps(stamps: list[Hlc]) -> None:
    by_bytes = sorted(stamps, key=Hlc.to_bytes)
    assert by_bytes == sorted(stamps)


@pytest.mark.parametrize(
    ("physical", "logical"),
    [(-1, 0), (MAX_PHYSICAL + 1, 0), (0, -1), (0, MAX_LOGICAL + 1)],
)
def test_out_of_range_parts_raise(physical: int, logical: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        Hlc(physical, logical)


@pytest.mark.parametrize("packed", [-1, MAX_PACKED + 1])
def test_unpack_out_of_range_raises(packed: int) -> None:
    with pytest.raises(ValueError, match="u64"):
        Hlc.unpack(packed)


@pytest.mark.parametrize("data", [b"", b"\x00" * 7, b"\x00" * 9])
def test_from_bytes_wrong_length_raises(data: bytes) -> None:
    with pytest.raises(ValueError, match="8 bytes"):
        Hlc.from_bytes(data)


def test_extremes() -> None:
    top = Hlc(MAX_PHYSICAL, MAX_LOGICAL)
    assert top.pack() == MAX_PACKED
    assert top.to_bytes() == b"\xff" * 8
    assert HLC_ZERO.to_bytes() == bytes(8)
    assert Hlc(1, 0).to_bytes() == bytes(5) + b"\x01\x00\x00"


# --- send rule: now() ---------------------------------------------------------------------


@given(st.lists(physical_times, min_size=1, max_size=60))
def test_now_is_strictly_increasing_for_any_physical_times(times: list[int]) -> None:
    clock = HlcClock()
    previous = clock.last
    for physical in times:
        stamp = clock.now(physical)
        assert stamp > previous
        assert stamp.physical_ms >= physical
        assert clock.last == stamp
        previous = stamp


@given(st.lists(st.integers(0, 50), min_size=1, max_size=60))
def test_now_with_a_clock_going_backwards_stays_close(times: list[int]) -> None:
    """A stamp is ``physical`` when time moves ahead, else the last stamp + 1 logical."""
    clock = HlcClock()
    for physical in times:
        last = clock.last
        stamp = clock.now(physical)
        if physical > last.physical_ms:
            assert stamp == Hlc(physical, 0)
        else:
            assert stamp == Hlc(last.physical_ms, last.logical + 1)


def test_now_takes_physical_time_as_an_argument() -> None:
    """No wall clock is read: two clocks fed the same times give the same stamps."""
    times = [5, 5, 3, 10, 10**12, 7, 10**12]
    a, b = HlcClock(), HlcClock()
    stamps = [a.now(t) for t in times]
    assert stamps == [b.now(t) for t in times]
    assert stamps[:4] == [Hlc(5, 0), Hlc(5, 1), Hlc(5, 2), Hlc(10, 0)]
    assert stamps[4:] == [Hlc(10**12, 0), Hlc(10**12, 1), Hlc(10**12, 2)]
    # a fresh clock at physical 0 still moves past ZERO
    assert HlcClock().now(0) == Hlc(0, 1)


def test_clock_starts_from_a_given_last_stamp() -> None:
    clock = HlcClock(last=Hlc(100, 7))
    assert clock.now(50) == Hlc(100, 8)


def test_logical_overflow_carries_into_physical() -> None:
    clock = HlcClock()
    p = 1_000
    first = clock.now(p)
    assert first == Hlc(p, 0)
    for _ in range(MAX_LOGICAL):  # 65,535 more events in the same millisecond
        clock.now(p)
    assert clock.last == Hlc(p, MAX_LOGICAL)
    # the 65,537th event borrows the next millisecond
    assert clock.now(p) == Hlc(p + 1, 0)
    # real time catching up to the borrowed millisecond keeps counting from there
    assert clock.now(p + 1) == Hlc(p + 1, 1)
    assert clock.now(p + 2) == Hlc(p + 2, 0)


def test_update_overflow_carries_into_physical() -> None:
    clock = HlcClock(last=Hlc(10, 3))
    assert clock.update(Hlc(20, MAX_LOGICAL), 15) == Hlc(21, 0)
    clock = HlcClock(last=Hlc(20, MAX_LOGICAL))
    assert clock.update(Hlc(20, 5), 20) == Hlc(21, 0)


def test_exhausted_clock_raises_overflow() -> None:
    clock = HlcClock(last=Hlc(MAX_PHYSICAL, MAX_LOGICAL))
    with pytest.raises(OverflowError):
        clock.now(MAX_PHYSICAL)
    assert clock.last == Hlc(MAX_PHYSICAL, MAX_LOGICAL)


def test_now_near_the_top_of_the_physical_range() -> None:
    clock = HlcClock(last=Hlc(MAX_PHYSICAL, 5))
    assert clock.now(MAX_PHYSICAL) == Hlc(MAX_PHYSICAL, 6)
    assert clock.now(MAX_PHYSICAL - 10) == Hlc(MAX_PHYSICAL, 7)


# --- receive rule: update() ---------------------------------------------------------------


@st.composite
def receive_cases(draw: st.DrawFn) -> tuple[Hlc, Hlc, int]:
    """(clock.last, remote, physical) with the remote within the default max offset."""
    physical = draw(st.integers(0, 10_000))
    last = draw(st.builds(Hlc, st.integers(0, 10_000), st.integers(0, MAX_LOGICAL)))
    remote_physical = draw(st.integers(0, physical + DEFAULT_MAX_OFFSET_MS))
    remote = Hlc(remote_physical, draw(st.integers(0, MAX_LOGICAL)))
    return last, remote, physical


@given(receive_cases())
def test_update_result_exceeds_last_and_remote(case: tuple[Hlc, Hlc, int]) -> None:
    last, remote, physical = case
    clock = HlcClock(last=last)
    stamp = clock.update(remote, physical)
    assert stamp > last
    assert stamp > remote
    assert stamp.physical_ms >= physical
    assert clock.last == stamp
    # and it is the smallest such stamp unless a logical counter overflowed
    top = max(last.physical_ms, remote.physical_ms, physical)
    assert stamp.physical_ms in (top, top + 1)
    if stamp.physical_ms == top + 1:
        assert stamp.logical == 0


def test_update_rules_case_by_case() -> None:
    # all three physical parts equal: max logical + 1
    assert HlcClock(last=Hlc(10, 4)).update(Hlc(10, 9), 10) == Hlc(10, 10)
    assert HlcClock(last=Hlc(10, 9)).update(Hlc(10, 4), 10) == Hlc(10, 10)
    # local last ahead
    assert HlcClock(last=Hlc(12, 4)).update(Hlc(10, 9), 11) == Hlc(12, 5)
    # remote ahead
    assert HlcClock(last=Hlc(10, 4)).update(Hlc(12, 9), 11) == Hlc(12, 10)
    # physical time ahead of both
    assert HlcClock(last=Hlc(10, 4)).update(Hlc(11, 9), 20) == Hlc(20, 0)


@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 200), st.integers(0, 300), st.integers(0, 3)),
        min_size=1,
        max_size=50,
    )
)
def test_mixed_send_and_receive_events_strictly_increase(
    events: list[tuple[bool, int, int, int]],
) -> None:
    clock = HlcClock(max_offset_ms=1_000)
    previous = clock.last
    for is_receive, physical, remote_physical, remote_logical in events:
        if is_receive:
            stamp = clock.update(Hlc(remote_physical, remote_logical), physical)
            assert stamp > Hlc(remote_physical, remote_logical)
        else:
            stamp = clock.now(physical)
        assert stamp > previous
        assert stamp.physical_ms >= physical
        previous = stamp


@given(
    last=st.builds(Hlc, st.integers(0, 10**6), st.integers(0, 5)),
    physical=st.integers(0, 10**6),
    max_offset=st.integers(0, 10**5),
    excess=st.integers(1, 10**6),
)
def test_update_too_far_ahead_raises_and_leaves_clock_unchanged(
    last: Hlc, physical: int, max_offset: int, excess: int
) -> None:
    clock = HlcClock(max_offset_ms=max_offset, last=last)
    remote = Hlc(physical + max_offset + excess, 0)
    with pytest.raises(ClockDriftError) as info:
        clock.update(remote, physical)
    assert clock.last == last
    assert isinstance(info.value, InvalidInput)
    assert info.value.reason == "clock_drift"
    # exactly max_offset ahead is still accepted
    at_limit = Hlc(physical + max_offset, 0)
    assert clock.update(at_limit, physical) > at_limit


def test_default_max_offset_is_120_seconds() -> None:
    clock = HlcClock()
    assert clock.max_offset_ms == DEFAULT_MAX_OFFSET_MS == 120_000
    clock.update(Hlc(1_000 + 120_000, 0), 1_000)
    with pytest.raises(ClockDriftError):
        HlcClock().update(Hlc(1_000 + 120_001, 0), 1_000)


def test_max_offset_is_configurable() -> None:
    strict = HlcClock(max_offset_ms=10)
    with pytest.raises(ClockDriftError):
        strict.update(Hlc(111, 0), 100)
    assert strict.last == HLC_ZERO
    assert strict.update(Hlc(110, 0), 100) == Hlc(110, 1)
    zero = HlcClock(max_offset_ms=0)
    with pytest.raises(ClockDriftError):
        zero.update(Hlc(101, 0), 100)
    assert zero.update(Hlc(100, 3), 100) == Hlc(100, 4)


def test_negative_max_offset_rejected() -> None:
    with pytest.raises(ValueError, match="max_offset_ms"):
        HlcClock(max_offset_ms=-1)


@given(hlcs, st.integers(0, MAX_PHYSICAL))
def test_check_drift_matches_update(remote: Hlc, physical: int) -> None:
    clock = HlcClock(max_offset_ms=1_000)
    too_far = remote.physical_ms - physical > 1_000
    raised = False
    try:
        clock.check_drift(remote, physical)
    except ClockDriftError:
        raised = True
    assert raised == too_far
    assert clock.last == HLC_ZERO


@given(st.lists(st.integers(0, MAX_PHYSICAL + 1_000), min_size=1, max_size=20))
def test_now_beyond_the_physical_range_stays_increasing(times: list[int]) -> None:
    """Physical times past 48 bits are clamped, never allowed to go back in time."""
    clock = HlcClock(last=Hlc(MAX_PHYSICAL - 3, 0))
    previous = clock.last
    for physical in times:
        assume(clock.last != Hlc(MAX_PHYSICAL, MAX_LOGICAL))
        stamp = clock.now(physical)
        assert stamp > previous
        previous = stamp


def test_the_virtual_epoch_is_2026_01_01_utc() -> None:
    # simulated traces and benchmarks start here; recorded traces depend on it staying put
    assert datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000 == VIRTUAL_EPOCH_MS
