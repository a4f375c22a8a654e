"""Kept listings follow the replica's own writes (``ListingCache.track``): after any
interleaving of writes, erasures, trims, cutoff moves, reads racing the writer and sessions,
every listing kept at its leaf's current count is the store's listing, and sessions still
converge, fetching exactly the differences."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import ChatDb, ChatDbConfig
from store.keys import NUM_BUCKETS
from sync.frames import Domain
from sync.listing_cache import ListingCache
from sync.loopback import run_session
from sync.merkle import VersionedTree
from sync.protocol import SyncConfig
from sync.replica import DbReplica, Record

from sync_support import MEMBER_OPS, domain_of, kinds, message

ID_LEN = 32


def split(blob: bytes) -> list[bytes]:
    return [blob[i : i + ID_LEN] for i in range(0, len(blob), ID_LEN)]


def bucket_of(record_id: bytes) -> int:
    return (record_id[0] << 8) | record_id[1]


class StampedStore:
    """A store of ids with stamps; the writer writes here first, then the tree (``track``)."""

    def __init__(self) -> None:
        self.ids: dict[bytes, int] = {}

    def listed(self, lo: int, hi: int, cutoff: int | None) -> list[bytes]:
        return sorted(
            i
            for i, stamp in self.ids.items()
            if lo <= bucket_of(i) < hi and (cutoff is None or stamp > cutoff)
        )

    def runs(self, runs: list[tuple[int, int]], cutoff: int | None) -> list[bytes]:
        return [b"".join(self.listed(lo, hi, cutoff)) for lo, hi in runs]

    def stamped(self, runs: list[tuple[int, int]], cutoff: int) -> list[tuple[bytes, bytes]]:
        out = []
        for lo, hi in runs:
            ids = self.listed(lo, hi, cutoff)
            out.append((b"".join(ids), b"".join(self.ids[i].to_bytes(8, "big") for i in ids)))
        return out


# ids in four buckets at both ends of the range (a multi-bucket run splits them), and ids
# whose bytes repeat, so one id can be found inside two others
BUCKETS = [0, 1, 2, NUM_BUCKETS - 1]
ID = st.builds(
    lambda b, tail: b.to_bytes(2, "big") + tail,
    st.sampled_from(BUCKETS),
    st.sampled_from([bytes([k]) * 30 for k in range(6)] + [b"\x00\x01" * 15, b"\x01\x00" * 15]),
)
CUTOFF = st.sampled_from([None, 10, 20, 30])
STEP = st.one_of(
    st.tuples(st.just("write"), ID, st.integers(0, 40)),  # an add (or removal, if held)
    st.tuples(st.just("write"), ID, st.integers(0, 40)),
    st.tuples(st.just("flush"), st.booleans()),  # the writer's tree changes (some or all)
    st.tuples(st.just("read"), st.sampled_from([(0, 3), (0, NUM_BUCKETS), (1, 2)]), CUTOFF),
    st.tuples(st.just("read_racing"), ID, st.integers(0, 40), CUTOFF),
    st.tuples(st.just("trim"), st.integers(0, 40)),  # every id stamped at or before it goes
)


@settings(max_examples=150, deadline=None)
@given(st.lists(STEP, max_size=60), st.sampled_from([1 << 21, 3]), st.booleans())
def test_kept_listings_are_the_stores_after_any_interleaving(
    steps: list[tuple],
    max_ids: int,
    with_stamps: bool,  # type: ignore[type-arg]
) -> None:
    store, tree, cache = StampedStore(), VersionedTree(), ListingCache(max_ids)
    pending: list[tuple[bytes | None, bytes | None, int | None]] = []  # in the store, not the tree

    def write(record_id: bytes, stamp: int) -> None:
        if record_id in store.ids:
            del store.ids[record_id]
            pending.append((record_id, None, None))
        else:
            store.ids[record_id] = stamp
            pending.append((None, record_id, stamp))

    def read(runs: list[tuple[int, int]], cutoff: int | None, race: tuple | None = None) -> bytes:  # type: ignore[type-arg]
        def plain(stale: list[tuple[int, int]]) -> list[bytes]:
            out = store.runs(stale, cutoff)
            if race is not None:
                write(*race)  # lands just after our store read, before its tree change
            return out

        def stamped(stale: list[tuple[int, int]]) -> list[tuple[bytes, bytes]]:
            assert cutoff is not None
            out = store.stamped(stale, cutoff)
            if race is not None:
                write(*race)
            return out

        return cache.read_runs(tree.versions, runs, cutoff, plain, stamped if with_stamps else None)

    for step in steps:
        if step[0] == "write":
            write(step[1], step[2])
        elif step[0] == "flush":
            n = len(pending) if step[1] else len(pending) // 2
            cache.track(tree, pending[:n])
            del pending[:n]
        elif step[0] == "read":
            blob = read([step[1]], step[2])
            if not pending:
                assert sorted(split(blob)) == store.listed(*step[1], step[2])
        elif step[0] == "read_racing":
            read([(0, 3), (NUM_BUCKETS - 1, NUM_BUCKETS)], step[3], (step[1], step[2]))
        else:
            for record_id in [i for i, s in store.ids.items() if s <= step[1]]:
                del store.ids[record_id]
                pending.append((record_id, None, None))
        if not pending:
            check_kept(cache, tree, lambda b, c: store.listed(b, b + 1, c))
    cache.track(tree, pending)
    check_kept(cache, tree, lambda b, c: store.listed(b, b + 1, c))
    for cutoff in (None, 10, 20, 30):
        blob = read([(0, NUM_BUCKETS)], cutoff)
        assert sorted(split(blob)) == store.listed(0, NUM_BUCKETS, cutoff)


def check_kept(cache: ListingCache, tree: VersionedTree, fresh, buckets=BUCKETS) -> None:  # type: ignore[no-untyped-def]
    """Every listing kept at its leaf's current count is the store's, for the cache's cutoff
    (in ``buckets``: the others never held an id)."""
    kept = cache.kept_versions()
    for bucket in buckets:
        if kept[bucket] == tree.versions[bucket]:
            listing = cache.listing(bucket)
            assert listing is not None
            ids = split(listing)
            assert len(ids) == len(set(ids))  # each id once
            assert sorted(ids) == fresh(bucket, cache.cutoff_ms), bucket


def test_the_replicas_writes_keep_the_listing_current_and_nothing_is_read_again() -> None:
    tree, cache = VersionedTree(), ListingCache()
    store = StampedStore()
    first = [bytes([k, 7]) + bytes(30) for k in range(4)]
    for i in first:
        store.ids[i] = 50
    cache.track(tree, [(None, i, 50) for i in first])
    cache.read(tree.versions, 0, NUM_BUCKETS, 20, lambda lo, hi: b"", store.stamped_one)
    read_before = cache.ids_read
    new = bytes([1, 7]) + b"\x01" * 30
    store.ids[new] = 60
    del store.ids[first[0]]
    cache.track(tree, [(first[0], None, None), (None, new, 60)])
    blob = cache.read(tree.versions, 0, NUM_BUCKETS, 20, lambda lo, hi: b"", store.stamped_one)
    assert cache.ids_read == read_before  # patched, not read again
    assert sorted(split(blob)) == store.listed(0, NUM_BUCKETS, 20)
    # a later cutoff filters the kept listings by their stamps: nothing read again either
    blob = cache.read(tree.versions, 0, NUM_BUCKETS, 55, lambda lo, hi: b"", store.stamped_one)
    assert split(blob) == [new] and cache.ids_read == read_before


def _stamped_one(self: StampedStore, lo: int, hi: int) -> tuple[bytes, bytes]:
    return self.stamped([(lo, hi)], 20)[0]


StampedStore.stamped_one = _stamped_one  # type: ignore[attr-defined]


# --- on RocksDB: DbReplica's write paths, trims and sessions ---

RECORD = st.one_of(st.integers(0, 40).map(message), MEMBER_OPS, kinds(st.integers(0, 40)))
DB_STEP = st.one_of(
    st.tuples(st.just("apply"), st.integers(0, 1), st.lists(RECORD, min_size=1, max_size=6)),
    st.tuples(st.just("apply"), st.integers(0, 1), st.lists(RECORD, min_size=1, max_size=6)),
    st.tuples(st.just("gc"), st.integers(0, 1), st.integers(1_000, 1_300)),
    st.tuples(st.just("sync"), st.integers(0, 1), st.booleans()),
    st.tuples(st.just("read"), st.integers(0, 1), st.sampled_from([None, 1_050, 1_200])),
)


@settings(max_examples=15, deadline=None)
@given(st.lists(DB_STEP, max_size=14))
def test_db_replicas_keep_exact_listings_and_converge(
    tmp_path_factory: pytest.TempPathFactory,
    steps: list[tuple],  # type: ignore[type-arg]
) -> None:
    paths = [tmp_path_factory.mktemp("a"), tmp_path_factory.mktemp("b")]
    config = ChatDbConfig(block_cache_mb=8, memtable_mb=8)
    with ChatDb(config, path=paths[0]) as db_a, ChatDb(config, path=paths[1]) as db_b:
        replicas = [DbReplica(db_a, admit_all=True), DbReplica(db_b, admit_all=True)]
        for step in steps:
            side = replicas[step[1]]
            if step[0] == "apply":
                for record in step[2]:
                    side.apply(domain_of(record), [record])
            elif step[0] == "gc":
                side.expire_messages(step[2])
            elif step[0] == "read":
                for domain in Domain:  # a session's reads at another cutoff
                    side.ids_in_runs(domain, [(0, NUM_BUCKETS)], cutoff_of(domain, step[2]))
            else:
                sync(replicas[step[1]], replicas[1 - step[1]], sketch=step[2])
            for replica in replicas:
                check_db_kept(replica)
        sync(replicas[0], replicas[1], sketch=True)
        for replica in replicas:
            check_db_kept(replica)


def cutoff_of(domain: Domain, cutoff: int | None) -> int | None:
    return cutoff if domain is Domain.MESSAGES else None


def held(replica: DbReplica, domain: Domain, cutoff: int | None) -> set[bytes]:
    cutoff = cutoff_of(domain, cutoff)
    return set(replica._range_ids(domain, 0, NUM_BUCKETS, cutoff))


def sync(initiator: DbReplica, responder: DbReplica, *, sketch: bool) -> None:
    cutoffs = [initiator.cutoff_ms, responder.cutoff_ms]
    later = max((c for c in cutoffs if c is not None), default=None)
    before = {d: (held(initiator, d, later), held(responder, d, later)) for d in Domain}
    result = run_session(
        initiator,
        responder,
        config=SyncConfig(cutoff_ms=cutoffs[0], sketch=sketch),
        responder_config=SyncConfig(cutoff_ms=cutoffs[1], sketch=sketch),
    )
    assert result.error is None
    for domain in Domain:
        a, b = held(initiator, domain, later), held(responder, domain, later)
        assert a == b, domain  # converged on what both keep
        if domain is not Domain.MESSAGES:
            assert initiator.tree(domain) == responder.tree(domain), domain
    old_a, old_b = before[Domain.MESSAGES]
    erased = (old_a | old_b) - held(initiator, Domain.MESSAGES, later)  # by deletes that arrived
    if not erased:  # exactly the differences fetched, nothing more (a member op is in the
        # index as well as in its domain: one change)
        differing = [len(a ^ b) for d, (a, b) in before.items() if d is not Domain.INDEX]
        assert result.records_applied == sum(differing)


def check_db_kept(replica: DbReplica) -> None:
    for domain in Domain:
        cache = replica._listings[domain]
        tree = replica.trees[domain]
        assert isinstance(tree, VersionedTree)
        check_kept(
            cache,
            tree,
            lambda b, c, d=domain: sorted(replica._range_ids(d, b, b + 1, c)),
            [b for b in range(NUM_BUCKETS) if tree.versions[b]],  # every bucket ever changed
        )


def test_sessions_between_db_replicas_read_only_what_others_wrote(tmp_path: Path) -> None:
    """A replica's own writes patch its kept listings: a session after them reads nothing
    from RocksDB for the buckets those writes changed."""
    config = ChatDbConfig(block_cache_mb=8, memtable_mb=8)
    with (
        ChatDb(config, path=tmp_path / "a") as db_a,
        ChatDb(config, path=tmp_path / "b") as db_b,
    ):
        a, b = DbReplica(db_a, admit_all=True), DbReplica(db_b, admit_all=True)
        shared: list[Record] = [message(n) for n in range(60)]
        for replica in (a, b):
            replica.apply(Domain.MESSAGES, shared)
            replica.ids_in_range(Domain.MESSAGES, 0, NUM_BUCKETS, None)  # every listing kept
        sync(a, b, sketch=True)
        a.apply(Domain.MESSAGES, [message(n) for n in range(60, 70)])
        b.apply(Domain.MESSAGES, [message(n) for n in range(70, 80)])
        read = [r._listings[Domain.MESSAGES].ids_read for r in (a, b)]
        for r in (a, b):  # every listing kept and current
            check_db_kept(r)
            kept = r._listings[Domain.MESSAGES].kept_versions()
            assert kept == r.trees[Domain.MESSAGES].versions  # type: ignore[attr-defined]
        sync(a, b, sketch=True)
        # what the session stored came from the peer: patched too, nothing listed again
        assert [r._listings[Domain.MESSAGES].ids_read for r in (a, b)] == read
