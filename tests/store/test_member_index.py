"""The member index on RocksDB (store/member_index.py): member ops kept by the user they name,
listed by sync bucket, folded into the rows a holder of the chat folds, dropped by user; a
row that is not ``user | op`` is a ``DecodeError``, never a wrong user."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from store import ChatDb, ChatDbConfig, DecodeError, Hlc, Role
from store.authz import new_group
from store.leaving import drop_users
from store.ops import MembershipAction, MembershipOp, member_op_id
from store.signing import key_from_seed, public_key, user_id_from_key

CREATOR = key_from_seed(b"\x51" * 32)
GROUPS = [new_group(CREATOR, bytes([0xA0 + i]) * 16) for i in range(2)]
ANN, BEN = (user_id_from_key(public_key(key_from_seed(bytes([s]) * 32))) for s in (0x61, 0x62))


def op(group: int, user: bytes, ms: int, action: MembershipAction) -> MembershipOp:
    proof = GROUPS[group]
    return MembershipOp.create(
        CREATOR, proof.chat_id(), user, action, Hlc(ms), Role.PARTICIPANT, proof=proof
    )


@pytest.fixture
def db(tmp_path: Path) -> Iterator[ChatDb]:
    with ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=tmp_path / "db") as store:
        yield store


def test_ops_are_listed_read_and_folded_by_the_user_they_name(db: ChatDb) -> None:
    index = db.member_index
    add_ann, add_ben = (
        op(0, ANN, 1_000, MembershipAction.ADD),
        op(1, BEN, 1_000, MembershipAction.ADD),
    )
    remove_ann = op(0, ANN, 2_000, MembershipAction.REMOVE)
    ops = [add_ann, add_ben, remove_ann, add_ann]  # the last once more: not new
    new, ids = index.put(ops)
    assert new == [True, True, True, False] and ids == [member_op_id(o.encode()) for o in ops]
    held = set(ids)
    assert {i for i, _ in index.iter_users()} == held
    assert {i for i in ids for i in index.bucket_ids((i[0] << 8) | i[1])} == held
    assert set(index.range_ids(0, 1 << 16)) == held
    assert index.records_by_ids([ids[0], b"\x00" * 32]) == [add_ann.encode(), None]
    assert index.users_of(ids[:2]) == [ANN, BEN]
    rows = set(index.rows_of(None))  # Ann added, then removed; Ben added
    assert rows == {(GROUPS[0].chat_id(), ANN, False), (GROUPS[1].chat_id(), BEN, True)}
    assert set(index.rows_of([BEN])) == {(GROUPS[1].chat_id(), BEN, True)}
    assert index.indexed_members(GROUPS[1].chat_id()) == [BEN]
    assert index.indexed_members(GROUPS[0].chat_id()) == []  # removed
    gone = drop_users(db, lambda user: user == ANN).ids["member_index"]
    assert sorted(gone) == sorted([ids[0], ids[2]])
    assert {u for _, u in index.iter_users()} == {BEN}


@pytest.mark.parametrize("row", [b"", b"\x01" * 20, b"\x01" * 19])
def test_a_row_with_no_op_after_its_user_is_a_decode_error(db: ChatDb, row: bytes) -> None:
    batch = db.rocks.new_batch()
    batch.put(b"\x02" * 32, row, db.rocks.handle["member_index"])
    db.rocks.write(batch)
    reads = (
        lambda: list(db.member_index.iter_users()),
        lambda: db.member_index.users_of([b"\x02" * 32]),  # what a session's scope check reads
        lambda: db.member_index.records_by_ids([b"\x02" * 32]),  # what a session ships
        lambda: list(db.member_index.rows_of(None)),
    )
    for read in reads:
        with pytest.raises(DecodeError):
            read()
