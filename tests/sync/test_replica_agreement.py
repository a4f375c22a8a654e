"""``MemoryReplica`` and ``DbReplica`` agree: fed the same records in any order, with duplicates
and in any grouping, both end with the same Merkle roots, serve the same records, hold the
same messages back (a DbReplica opened again too), and show readers the same messages.

The simulator and the protocol tests run on ``MemoryReplica``; the node runs on ``DbReplica``
over RocksDB. Sync between them is only sound if both merge by the same rules.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import ChatDb, ChatDbConfig
from store.keys import NUM_BUCKETS
from store.kinds import MessageView, Tombstone
from store.messages import Direction
from store.reads import UNREAD_CAP
from sync.frames import Domain
from sync.replica import DbReplica, MemoryReplica, Record, Replica

from sync_support import (
    CHATS,
    MEMBER_OPS,
    RECORDS,
    domain_of,
    kinds,
    member,
    member_stamp,
    message,
)


def apply_in_groups(replica: Replica, records: list[Record], group: int) -> int:
    """Apply ``records`` in runs of at most ``group`` records of one domain, in order."""
    changed, run = 0, list[Record]()
    for record in records:
        if run and (len(run) == group or domain_of(run[0]) != domain_of(record)):
            changed += replica.apply(domain_of(run[0]), run)
            run = []
        run.append(record)
    if run:
        changed += replica.apply(domain_of(run[0]), run)
    return changed


def served(replica: Replica, domain: Domain) -> dict[bytes, bytes | None]:
    """Every record the replica lists in ``domain``, as sync would send it."""
    tree = replica.tree(domain)
    buckets = [b for b in range(NUM_BUCKETS) if tree.cell(b)[0]]
    ids = [i for b in buckets for i in replica.bucket_ids(domain, b, None)]
    return dict(zip(ids, replica.get_records(domain, ids, None), strict=True))


def ranged(replica: Replica, domain: Domain, lo: int, hi: int, cutoff: int | None) -> set[bytes]:
    blob = replica.ids_in_range(domain, lo, hi, cutoff)
    ids = [blob[i : i + 32] for i in range(0, len(blob), 32)]
    assert len(ids) == len(set(ids))  # each id once
    return set(ids)


# Few targets, everyone a member: edits, deletes (true and lying, by authors, admins and
# others), reactions and receipts meet their targets and each other often.
JOINED = [member(chat, user, member_stamp(0)) for chat in range(3) for user in range(4)]
CROWDED = st.one_of(st.integers(0, 5).map(message), MEMBER_OPS, kinds(st.integers(0, 5)))


@settings(max_examples=40)
@given(
    st.lists(RECORDS, max_size=40),
    st.randoms(use_true_random=False),
    st.integers(1, 8),
)
def test_memory_and_db_replicas_agree(
    tmp_path_factory: pytest.TempPathFactory,
    records: list[Record],
    rnd: object,
    group: int,
) -> None:
    check_agreement(tmp_path_factory, records, rnd, group)


@settings(max_examples=40)
@given(
    st.lists(CROWDED, max_size=30),
    st.randoms(use_true_random=False),
    st.integers(1, 8),
)
def test_memory_and_db_replicas_agree_on_what_edits_deletes_and_reactions_do(
    tmp_path_factory: pytest.TempPathFactory,
    records: list[Record],
    rnd: object,
    group: int,
) -> None:
    check_agreement(tmp_path_factory, JOINED + records, rnd, group)


def folded_walk(
    db: ChatDb, chat: bytes, limit: int, direction: Direction
) -> list[MessageView | Tombstone]:
    """Every page of the chat's folded history, its items and tombstones in (hlc, id) order."""
    out: list[MessageView | Tombstone] = []
    cursor = None
    while True:
        page = db.folded_range(chat, cursor, limit, direction)
        out += page.views() + page.tombstones
        if (cursor := page.next_cursor) is None:
            return sorted(out, key=lambda item: item.order)


def check_agreement(
    tmp_path_factory: pytest.TempPathFactory, records: list[Record], rnd: object, group: int
) -> None:
    shuffled = list(records) + records[: len(records) // 3]  # some arrive twice
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    memory = MemoryReplica()
    apply_in_groups(memory, records, 1)
    path: Path = tmp_path_factory.mktemp("db")
    with ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=path) as db:
        replica = DbReplica(db)
        half = len(shuffled) // 2
        apply_in_groups(replica, shuffled[:half], group)
        for domain in Domain:  # listings kept here are read again where leaves change
            replica.ids_in_range(domain, 0, NUM_BUCKETS, None)
        apply_in_groups(replica, shuffled[half:], group)
        reopened = DbReplica(db)  # trees rebuilt from what RocksDB holds
        for domain in Domain:
            assert replica.tree(domain) == memory.tree(domain), domain  # every leaf
            assert replica.tree(domain).root() == memory.tree(domain).root(), domain
            assert reopened.tree(domain) == memory.tree(domain), domain
            assert served(replica, domain) == served(memory, domain), domain
            for lo, hi in ((0, NUM_BUCKETS), (1_000, 40_000)):  # a sketch's range reads
                for cutoff in (None, 1_500) if domain is Domain.MESSAGES else (None,):
                    listed = {
                        i for b in range(lo, hi) for i in memory.bucket_ids(domain, b, cutoff)
                    }
                    assert ranged(memory, domain, lo, hi, cutoff) == listed, domain
                    assert ranged(replica, domain, lo, hi, cutoff) == listed, domain
            runs = [(0, 3), (1_000, 1_200), (5_000, 5_001), (40_000, NUM_BUCKETS)]
            for cutoff in (None, 1_500) if domain is Domain.MESSAGES else (None,):
                listed = {
                    i for lo, hi in runs for b in range(lo, hi)
                    for i in memory.bucket_ids(domain, b, cutoff)
                }  # fmt: skip
                for r in (memory, replica):  # a region's runs at once (one store iterator)
                    blob = r.ids_in_runs(domain, runs, cutoff)
                    assert sorted(blob[i : i + 32] for i in range(0, len(blob), 32)) == sorted(
                        listed
                    ), domain
        waiting = {m.msg_id for m in memory.waiting.waiting()}
        assert {m.msg_id for m in replica.waiting.waiting()} == waiting
        assert {m.msg_id for m in reopened.waiting.waiting()} == waiting  # kept in the store
        for chat in CHATS:
            assert replica.visible_ids(chat) == memory.visible_ids(chat)
            view = memory.view(chat)
            assert replica.view(chat) == view  # edits, deletes, reactions, reads
            for limit, direction in ((2, Direction.BACKWARD), (3, Direction.FORWARD)):
                assert folded_walk(db, chat, limit, direction) == view.items
            readers = {m.sender for m in memory.messages.values()} | set(view.read_positions)
            for user in readers:  # the chat list's numbers, from the store's own indexes
                position = db.read_position(chat, user)
                assert position == view.read_positions.get(user)
                assert db.unread_count(chat, user, position) == min(UNREAD_CAP, view.unread(user))
        assert db.hidden_chats() >= {
            c
            for c in CHATS
            if memory.visible_ids(c) != {i for i, m in memory.messages.items() if m.chat_id == c}
        }


def test_agreement_is_not_vacuous(tmp_path: Path) -> None:
    """The comparison sees a difference: one member op more on one side changes its root."""
    memory = MemoryReplica()
    apply_in_groups(memory, [member(0, 0, 2, role=1)], 1)
    with ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=tmp_path) as db:
        replica = DbReplica(db)
        apply_in_groups(replica, [member(0, 0, 2, role=1), member(0, 0, 3, remove=True)], 1)
        assert replica.tree(Domain.MEMBERS).root() != memory.tree(Domain.MEMBERS).root()
        assert served(replica, Domain.MEMBERS) != served(memory, Domain.MEMBERS)
