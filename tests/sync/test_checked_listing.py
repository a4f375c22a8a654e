"""A region's listing checked against the tree that located it (``SyncSession._checked_listing``):
against a plain-Python model of the rule, for listings that agree with the tree, that list
too many ids in a bucket, and that name buckets outside the region."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from sync.buckets import runs_of
from sync.frames import Domain
from sync.protocol import SessionRole, SyncSession
from sync.replica import MemoryReplica

# a few buckets, so that ids share them
BUCKETS = st.integers(min_value=0, max_value=40).map(lambda b: b * 1_601)


def _id(bucket: int, n: int) -> bytes:
    return bucket.to_bytes(2, "big") + n.to_bytes(30, "big")


def _model(filed: Counter[int], region: list[int], ids: list[bytes]) -> tuple[bytes, set[int]]:
    """The rule: a bucket of the region whose listing holds more ids than the tree files is
    left out, and so is every id outside the region; a listing with neither is kept whole."""
    listed = Counter(int.from_bytes(i[:2], "big") for i in ids)
    inside = set(region)
    over = {b for b, n in listed.items() if b in inside and n > filed[b]}
    outside = any(b not in inside for b in listed)
    if not over and not outside:
        return b"".join(ids), set()
    kept = [i for i in ids if (b := int.from_bytes(i[:2], "big")) in inside and b not in over]
    return b"".join(kept), over


@settings(max_examples=300, deadline=None)
@given(
    held=st.lists(BUCKETS, max_size=40),
    extra=st.lists(BUCKETS, max_size=6),
    region=st.sets(BUCKETS, max_size=30).map(sorted),
)
def test_a_listing_is_checked_against_the_tree_as_the_rule_says(
    held: list[int], extra: list[int], region: list[int]
) -> None:
    """``held``: ids the tree files (and the listing names); ``extra``: ids the listing names
    beyond them — one too many in a held bucket, or in a bucket the tree has none of."""
    replica = MemoryReplica()
    tree = replica.trees[Domain.MESSAGES]
    ids = [_id(b, n) for n, b in enumerate(held)]
    for record_id in ids:
        tree.insert(record_id)
    ids += [_id(b, 1_000 + n) for n, b in enumerate(extra)]
    session = SyncSession(SessionRole.INITIATOR, replica, now_ms=0)
    got = session._checked_listing(Domain.MESSAGES, runs_of(region), b"".join(ids))
    want = _model(Counter(held), region, ids)
    assert got == want
    assert session.stats.inconsistent_buckets == len(want[1])
