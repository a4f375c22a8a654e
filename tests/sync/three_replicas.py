"""The harness of the convergence tests: three ``DbReplica``s on RocksDB, fed ops one by one
or in batches (as HTTP and gossip hand them to the writer), twice or never, and synced by
anti-entropy sessions between any two — cut short at random, on skewed clocks, while some
pairs never talk (a partition). A test subclasses the machine ``three_replicas(ops)`` makes
and checks what the replicas hold in ``check_convergence``, after ``settle``."""

from __future__ import annotations

import os
import tempfile

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from store import ChatDb, ChatDbConfig
from store.ops import Op
from sync.loopback import run_session
from sync.protocol import SyncConfig
from sync.replica import DbReplica

TMP = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def three_replicas(ops: st.SearchStrategy[Op]) -> type[RuleBasedStateMachine]:
    class ThreeReplicas(RuleBasedStateMachine):
        initial_ops: tuple[Op, ...] = ()  # every replica holds these from the start

        @initialize()
        def open(self) -> None:
            self.dirs = [tempfile.TemporaryDirectory(prefix="three-", dir=TMP) for _ in range(3)]
            config = ChatDbConfig(block_cache_mb=8, memtable_mb=8)
            self.dbs = [ChatDb(config, path=d.name) for d in self.dirs]
            self.replicas = [DbReplica(db) for db in self.dbs]
            for replica in self.replicas:
                replica.apply_ops(self.initial_ops)
            self.delivered: list[Op] = list(self.initial_ops)
            self.cut: set[frozenset[int]] = set()  # pairs that do not talk until the heal

        @rule(op=ops, to=st.integers(0, 2))
        def deliver_one(self, op: Op, to: int) -> None:
            self.replicas[to].apply_ops([op])
            self.delivered.append(op)

        @rule(ops=st.lists(ops, min_size=2, max_size=8), to=st.integers(0, 2))
        def deliver_a_batch(self, ops: list[Op], to: int) -> None:
            self.replicas[to].apply_ops(ops)
            self.delivered += ops

        @rule(a=st.integers(0, 2), b=st.integers(0, 2))
        def partition(self, a: int, b: int) -> None:
            if a != b:
                self.cut.add(frozenset((a, b)))

        @precondition(lambda self: bool(self.cut))
        @rule()
        def heal(self) -> None:
            self.cut.clear()

        @rule(
            a=st.integers(0, 2),
            b=st.integers(0, 2),
            cut_after=st.none() | st.integers(1, 6),
            skew=st.integers(-5_000, 5_000),
        )
        def sync(self, a: int, b: int, cut_after: int | None, skew: int) -> None:
            if a == b or frozenset((a, b)) in self.cut:
                return
            now = 100_000
            run_session(
                self.replicas[a], self.replicas[b], now_ms=now, responder_now_ms=now + skew,
                config=self.config(), cut_after=cut_after, raise_errors=False,
            )  # fmt: skip

        def config(self) -> SyncConfig:
            return SyncConfig(authenticate=True, max_offset_ms=60_000)

        def settle(self) -> None:
            """Every pair syncs, until nothing moves."""
            for _ in range(3):
                for a, b in ((0, 1), (1, 2), (0, 2)):
                    run_session(self.replicas[a], self.replicas[b], config=self.config())

        def check_convergence(self) -> None:
            raise NotImplementedError

        def teardown(self) -> None:
            if not hasattr(self, "dbs"):
                return
            try:
                self.check_convergence()
            finally:
                for db in self.dbs:
                    db.close()
                for d in self.dirs:
                    d.cleanup()

    return ThreeReplicas
