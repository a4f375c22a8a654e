"""Whom a node joining a shard dials (``sync/joining.py``, pure): a connected holder first (no
dial), none known (nothing dialled, said why), the next holder after a failure, and the bounds
a flood of joins cannot pass."""

from __future__ import annotations

from sync.joining import (
    CAUGHT_UP,
    CONNECTED_HOLDER,
    DROPPED,
    GAVE_UP,
    NO_HOLDER,
    TIMED_OUT,
    Dial,
    Ended,
    JoinDials,
    Target,
    new_targets,
)

SHARD, OTHER, USERS = Target(3), Target(5), Target(3, user=True)


def test_a_connected_holder_is_preferred_and_nothing_is_dialled() -> None:
    joins = JoinDials()
    joins.add([SHARD])
    dials, ended = joins.step(0, {SHARD: ["far", "near"]}, connected={"near", "other"})
    assert dials == [] and ended == [Ended(SHARD, CONNECTED_HOLDER, "near")]
    assert joins.targets() == []


def test_no_holder_known_dials_nothing_and_says_so() -> None:
    joins = JoinDials()
    joins.add([SHARD, USERS])
    dials, ended = joins.step(0, {SHARD: []}, connected={"other"})
    assert dials == []
    assert ended == [Ended(SHARD, NO_HOLDER), Ended(USERS, NO_HOLDER)]


def test_the_best_holder_is_dialled_then_the_next_after_a_failure() -> None:
    joins = JoinDials()
    joins.add([SHARD])
    ranked = {SHARD: ["h1", "h2", "h3", "h4"]}
    assert joins.step(0, ranked, set()) == ([Dial(SHARD, "h1")], [])
    assert joins.step(100, ranked, set()) == ([], [])  # in flight: not dialled twice
    assert joins.waiting_on() == {"h1"}
    joins.dialled("h1", ok=False, now_ms=200)
    assert joins.step(300, ranked, set()) == ([Dial(SHARD, "h2")], [])
    joins.dialled("h2", ok=False, now_ms=400)
    assert joins.step(500, ranked, set()) == ([Dial(SHARD, "h3")], [])
    joins.dialled("h3", ok=False, now_ms=600)
    assert joins.step(20_000, ranked, set()) == ([], [Ended(SHARD, GAVE_UP)])  # 3 tries


def test_a_dialled_holder_catches_the_join_up_once_a_later_session_converged() -> None:
    joins = JoinDials()
    joins.add([SHARD, OTHER])
    ranked = {SHARD: ["h1"], OTHER: ["h1"]}
    dials, _ = joins.step(0, ranked, set())
    assert dials == [Dial(SHARD, "h1")]  # OTHER shares the dial
    joins.dialled("h1", ok=True, now_ms=1_000)
    assert joins.step(1_500, ranked, {"h1"}) == ([], [])  # its sessions run
    assert joins.synced("h1", converged=True, started_ms=900) == []  # before the dial
    assert joins.synced("h1", converged=False, started_ms=1_200) == []
    assert joins.synced("h1", converged=True, started_ms=1_300) == [
        Ended(SHARD, CAUGHT_UP, "h1"),
        Ended(OTHER, CAUGHT_UP, "h1"),
    ]
    assert joins.waiting_on() == set()


def test_a_holder_that_leaves_before_the_join_is_caught_up_is_replaced() -> None:
    joins = JoinDials()
    joins.add([SHARD])
    ranked = {SHARD: ["h1", "h2"]}
    joins.step(0, ranked, set())
    joins.dialled("h1", ok=True, now_ms=10)
    assert joins.step(20, ranked, set()) == ([Dial(SHARD, "h2")], [])  # h1 disconnected
    joins.dialled("h2", ok=True, now_ms=30)
    assert joins.step(30 + 600_000, ranked, {"h2"}) == ([], [Ended(SHARD, TIMED_OUT, "h2")])


def test_a_flood_of_joins_is_capped_and_its_dials_rate_limited() -> None:
    """2 x 256 targets (every shard and user shard of a network) joined at once, each with a
    holder of its own that never answers: at most 64 kept, 2 dials at once, and over a
    minute at most burst + 60 s / 5 s = 16 dials."""
    joins = JoinDials()
    targets = new_targets([], range(256), [], range(256))
    dropped = joins.add(targets)
    assert len(joins.targets()) == 64 and len(dropped) == 512 - 64
    assert {e.result for e in dropped} == {DROPPED}
    ranked = {t: [f"h{t.shard}-{t.user}-{n}" for n in range(3)] for t in targets}
    dialled = 0
    for now in range(0, 60_001, 100):  # a step every 100 ms; each dial fails after 100 ms
        for peer in list(joins.waiting_on()):
            joins.dialled(peer, ok=False, now_ms=now)
        dials, _ = joins.step(now, ranked, set())
        assert len(joins.waiting_on()) <= 2
        dialled += len(dials)
    assert dialled == 4 + 60_000 // 5_000


def test_new_targets_are_the_shards_a_widening_added() -> None:
    assert new_targets([1], [1, 2], [7], [7, 8]) == [Target(2), Target(8, user=True)]
