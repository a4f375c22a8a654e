"""The nemesis schedule: a function of its seed, and within its rules."""

from __future__ import annotations

import itertools

import pytest

from chaos.schedule import (
    KINDS,
    PARTITION_KINDS,
    PROCESS_KINDS,
    SKEW,
    SKEW_FAR,
    ScheduleParams,
    actions,
    from_json,
    make_schedule,
    to_json,
)


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    params = ScheduleParams(seed=7, nodes=5, duration_s=300)
    first = make_schedule(params)
    assert first == make_schedule(ScheduleParams(seed=7, nodes=5, duration_s=300))
    assert first != make_schedule(ScheduleParams(seed=8, nodes=5, duration_s=300))
    assert from_json(to_json(first)) == first


@pytest.mark.parametrize("seed", range(20))
def test_a_default_run_has_every_kind_and_keeps_the_rules(seed: int) -> None:
    params = ScheduleParams(seed=seed, nodes=5, duration_s=300)
    faults = make_schedule(params)
    assert {f.kind for f in faults} == set(KINDS)
    limit = params.max_offset_ms
    for f in faults:
        assert params.warmup_s <= f.start_s < f.end_s <= params.duration_s
        assert 0 <= f.node < 5 and f.node in f.group
        if f.kind == SKEW:
            assert 0 < abs(f.offset_ms) <= limit  # within the drift limit
        elif f.kind == SKEW_FAR:
            assert abs(f.offset_ms) > limit  # beyond it
        if f.kind in PARTITION_KINDS:
            assert 1 <= len(f.group) <= 2
    for t in [x / 2 for x in range(600)]:
        on = [f for f in faults if f.start_s <= t < f.end_s]
        process = [f.node for f in on if f.kind in PROCESS_KINDS]
        assert len(process) == len(set(process)) <= 2  # one per node, at most (5 - 1) // 2
        assert sum(1 for f in on if f.kind in PARTITION_KINDS) <= 1


def test_actions_run_in_time_order_ends_first_at_equal_times() -> None:
    faults = make_schedule(ScheduleParams(seed=1, nodes=3, duration_s=60, kinds=("kill", "pause")))
    steps = actions(faults)
    assert len(steps) == 2 * len(faults)
    assert [s.at_s for s in steps] == sorted(s.at_s for s in steps)
    for a, b in itertools.pairwise(steps):
        if a.at_s == b.at_s:
            assert not (a.begin and not b.begin)


def test_unknown_kinds_are_refused() -> None:
    with pytest.raises(ValueError, match="nemesis kinds"):
        make_schedule(ScheduleParams(seed=1, nodes=3, duration_s=60, kinds=("flood",)))
