"""The arrival log keeps the newest arrivals, oldest first, in 16 bytes each (node/arrivals.py)."""

from __future__ import annotations

import sys
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.arrivals import ArrivalLog

stamps = st.integers(0, (1 << 64) - 1)
times = st.integers(-(1 << 63), (1 << 63) - 1)


@given(st.integers(1, 8), st.lists(st.lists(st.tuples(stamps, times), max_size=12), max_size=6))
def test_it_keeps_the_newest_in_order_as_a_bounded_deque_would(
    size: int, batches: list[list[tuple[int, int]]]
) -> None:
    log, expected = ArrivalLog(size), []
    for batch in batches:
        log.extend(batch)
        expected = (expected + batch)[-size:]
        assert list(log) == expected and len(log) == len(expected)


def test_a_log_of_no_arrivals_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        ArrivalLog(0)


def test_a_full_log_takes_16_bytes_an_arrival() -> None:
    log = ArrivalLog(100_000)
    log.extend((n << 16, 1_795_000_000_000 + n) for n in range(150_000))
    held = sys.getsizeof(log._stamps) + sys.getsizeof(log._times)
    assert held < 16 * 100_000 + 1_000
    assert next(iter(log)) == (50_000 << 16, 1_795_000_050_000)


def test_a_reader_never_sees_half_an_extend() -> None:
    log = ArrivalLog(1_000)
    stop = threading.Event()

    def write() -> None:
        n = 0
        while not stop.is_set():
            log.extend([(n, n)] * 100)  # each extend: 100 copies of one arrival
            n += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(200):
            seen = list(log)
            counts: dict[tuple[int, int], int] = {}
            for arrival in seen:
                counts[arrival] = counts.get(arrival, 0) + 1
            assert all(c == 100 for c in counts.values()) or len(seen) < 1_000
    finally:
        stop.set()
        writer.join()
