"""Kept listings (sync.listing_cache): always the store's listing, read again only where a
leaf changed, never newer than the leaf count it was kept at."""

from __future__ import annotations

import random

from store.keys import NUM_BUCKETS
from sync.listing_cache import ListingCache
from sync.merkle import VersionedTree


class Store:
    """Ids by bucket, listed in id order, counting the ids each range read lists."""

    def __init__(self, ids: list[bytes]) -> None:
        self.ids = set(ids)
        self.listed = 0

    def read(self, lo: int, hi: int) -> bytes:
        ids = sorted(i for i in self.ids if lo <= int.from_bytes(i[:2], "big") < hi)
        self.listed += len(ids)
        return b"".join(ids)


def _ids(rng: random.Random, count: int) -> list[bytes]:
    return [rng.randbytes(32) for _ in range(count)]


def test_kept_listings_are_the_stores_and_only_changed_leaves_are_read_again() -> None:
    rng = random.Random(1)
    ids = _ids(rng, 3_000)
    store, tree, cache = Store(ids), VersionedTree.from_ids(ids), ListingCache()
    for lo, hi in ((0, NUM_BUCKETS), (100, 9_000), (0, 1)):
        assert cache.read(tree.versions, lo, hi, None, store.read) == store.read(lo, hi)
    store.listed = 0
    assert cache.read(tree.versions, 0, NUM_BUCKETS, None, store.read) == store.read(0, NUM_BUCKETS)
    assert store.listed == len(ids)  # the comparison's read only: nothing read again
    new, gone = rng.randbytes(32), ids[5]
    store.ids = (store.ids | {new}) - {gone}
    tree.insert(new)
    tree.remove(gone)
    store.listed = 0
    assert cache.read(tree.versions, 0, NUM_BUCKETS, None, store.read) == store.read(0, NUM_BUCKETS)
    assert store.listed - len(store.ids) <= 2 * 3  # the two changed buckets' few ids


def test_a_write_during_a_read_is_read_again() -> None:
    """The writer writes the store, then the tree. A write that lands just after our store
    read leaves the listing kept at the count from before it: the next read lists the bucket
    again (kept at the count after it, the listing would miss the new id for good)."""
    rng = random.Random(2)
    ids = _ids(rng, 500)
    store, tree, cache = Store(ids), VersionedTree.from_ids(ids), ListingCache()
    late = rng.randbytes(32)

    def racing(lo: int, hi: int) -> bytes:
        listing = store.read(lo, hi)
        store.ids.add(late)  # the writer, right after our read: the store...
        tree.insert(late)  # ...then its leaf
        return listing

    cache.read(tree.versions, 0, NUM_BUCKETS, None, racing)
    blob = cache.read(tree.versions, 0, NUM_BUCKETS, None, store.read)
    assert blob == store.read(0, NUM_BUCKETS) and late in {
        blob[i : i + 32] for i in range(0, len(blob), 32)
    }


def test_another_cutoff_or_no_room_reads_the_store() -> None:
    rng = random.Random(3)
    ids = _ids(rng, 400)
    store, tree = Store(ids), VersionedTree.from_ids(ids)
    cache = ListingCache()
    cache.read(tree.versions, 0, NUM_BUCKETS, None, store.read)
    store.listed = 0
    cache.read(tree.versions, 0, NUM_BUCKETS, 1_500, store.read)
    assert store.listed == len(ids)  # another cutoff lists other ids: read again
    unkept = ListingCache(max_ids=0)
    for _ in range(2):
        store.listed = 0
        assert unkept.read(tree.versions, 0, NUM_BUCKETS, None, store.read) == store.read(
            0, NUM_BUCKETS
        )
        assert store.listed == 2 * len(ids)


def test_a_listing_out_of_id_order_is_kept_by_bucket() -> None:
    rng = random.Random(4)
    ids = _ids(rng, 300)
    tree, cache = VersionedTree.from_ids(ids), ListingCache()

    def shuffled(lo: int, hi: int) -> bytes:
        inside = [i for i in ids if lo <= int.from_bytes(i[:2], "big") < hi]
        rng.shuffle(inside)
        return b"".join(inside)

    cache.read(tree.versions, 0, NUM_BUCKETS, None, shuffled)
    blob = cache.read(tree.versions, 2_000, 30_000, None, shuffled)
    listed = [blob[i : i + 32] for i in range(0, len(blob), 32)]
    assert sorted(listed) == sorted(
        i for i in ids if 2_000 <= int.from_bytes(i[:2], "big") < 30_000
    )
