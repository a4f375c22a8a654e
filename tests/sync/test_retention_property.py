"""Retention across replicas with skewed clocks: GC, sync and ops in any interleaving.

After GC nothing older than a replica's cutoff survives on it, an expired message never
comes back (not by sync, not by a replayed op), and nothing newer than every cutoff is lost.
"""

from __future__ import annotations

from functools import cache

from hypothesis import event, given, settings
from hypothesis import strategies as st

from store import Hlc, MsgV1
from sync.frames import Domain
from sync.loopback import run_session
from sync.protocol import SyncConfig
from sync.replica import MemoryReplica

from sync_support import CHATS, KEYS, assert_trees_match_contents

WINDOW_MS = 10_000  # retention


@cache
def authored(t: int) -> MsgV1:
    """The message authored at time t (ms)."""
    return MsgV1.create(KEYS[t % 4], CHATS[t % 3], Hlc(t), b"r%d" % t)


post = st.tuples(st.just("post"), st.integers(0, 3_000), st.integers(0, 2))  # lag behind now
events = st.lists(
    st.one_of(
        post,
        post,
        post,
        st.tuples(st.just("tick"), st.integers(100, 9_000)),
        st.tuples(st.just("tick"), st.integers(100, 9_000)),
        st.tuples(st.just("gc"), st.integers(0, 2)),
        st.tuples(st.just("sync"), st.integers(0, 2), st.integers(0, 2)),
    ),
    min_size=10,
    max_size=80,
)


@settings(max_examples=60)
@given(st.lists(st.integers(-5_000, 5_000), min_size=3, max_size=3), events)
def test_gc_and_sync_with_skewed_clocks(offsets: list[int], steps: list[tuple]) -> None:  # type: ignore[type-arg]
    replicas = [MemoryReplica() for _ in range(3)]
    cutoffs: list[int | None] = [None, None, None]
    ever: set[int] = set()  # authoring times of every message accepted somewhere
    now = 20_000

    def gc(i: int) -> None:
        cutoffs[i] = now + offsets[i] - WINDOW_MS
        replicas[i].expire_messages(cutoffs[i])

    def sync(i: int, j: int) -> None:
        run_session(
            replicas[i], replicas[j], config=SyncConfig(cutoff_ms=cutoffs[i]),
            responder_config=SyncConfig(cutoff_ms=cutoffs[j]), salt_seed=b"%d" % now,
        )  # fmt: skip

    def check() -> None:
        for r in replicas:
            expire = r.expire_before_ms
            assert expire is None or all(m.hlc.physical_ms > expire for m in r.messages.values())
            assert_trees_match_contents(r)

    for step in steps:
        if step[0] == "post":
            t, i = now - step[1], step[2]  # an author's present, delivered a little late
            if replicas[i].apply(Domain.MESSAGES, [authored(t)]):  # refused if expired there
                ever.add(t)
        elif step[0] == "tick":
            now += step[1]
        elif step[0] == "gc":
            gc(step[1])
        elif step[1] != step[2]:
            sync(step[1], step[2])
        check()

    for i in range(3):  # the end: everyone GCs at their own clock, then a full round of sync
        gc(i)
    for i, j in ((0, 1), (1, 2), (2, 0), (0, 1)):
        sync(i, j)
    check()
    latest = max(c for c in cutoffs if c is not None)
    size = "none" if not ever else "1-4" if len(ever) < 5 else "5-14" if len(ever) < 15 else "15+"
    event(f"accepted {size}, some expired: {any(t <= latest for t in ever)}")
    newer = {authored(t).msg_id for t in ever if t > latest}
    for r in replicas:
        assert newer <= set(r.messages), "a message newer than every cutoff was lost"
        assert set(r.messages) <= {authored(t).msg_id for t in ever}
