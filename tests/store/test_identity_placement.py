"""Identities by user (store/identity.py): what a scoped replica reads to place an identity
in its user's user shard — each record id's user, listed or asked for — and the drop when a
scope stops indexing a user; a ``seen_identity`` row that is not a user id is a
``DecodeError``, never a wrong user."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from store import ChatDb, ChatDbConfig, DecodeError, Hlc
from store.leaving import drop_users
from store.ops import make_identity
from store.signing import key_from_seed

KEYS = [key_from_seed(bytes([0x71 + i]) * 32) for i in range(3)]


@pytest.fixture
def db(tmp_path: Path) -> Iterator[ChatDb]:
    with ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=tmp_path / "db") as store:
        yield store


def test_identities_are_read_and_dropped_by_their_user(db: ChatDb) -> None:
    records = [make_identity(k, bytes([i]) * 32, Hlc(1_000)) for i, k in enumerate(KEYS)]
    db.apply_ops(records)
    newer = make_identity(KEYS[0], b"\x09" * 32, Hlc(2_000))  # replaces the first
    db.apply_ops([newer])
    current = {r.user_id: r.record_id for r in (newer, *records[1:])}
    assert dict(db.iter_identity_users()) == {rid: user for user, rid in current.items()}
    asked = [records[0].record_id, newer.record_id, b"\x00" * 32]
    assert db.identity_users_of(asked) == [None, newer.user_id, None]  # replaced, held, never

    gone = drop_users(db, lambda user: user != records[1].user_id).ids["seen_identity"]
    assert sorted(gone) == sorted([newer.record_id, records[2].record_id])
    assert [u for _, u in db.iter_identity_users()] == [records[1].user_id]
    assert db.get_identity(newer.user_id) is None and db.get_identity(records[2].user_id) is None
    assert db.get_identity(records[1].user_id) is not None


@pytest.mark.parametrize("row", [b"", b"\x01" * 19, b"\x01" * 21])
def test_a_seen_identity_row_that_is_not_a_user_id_is_a_decode_error(
    db: ChatDb, row: bytes
) -> None:
    record_id = b"\x03" * 32
    batch = db.rocks.new_batch()
    batch.put(record_id, row, db.rocks.handle["seen_identity"])
    db.rocks.write(batch)
    with pytest.raises(DecodeError):
        list(db.iter_identity_users())
    for asked in ([record_id], [record_id, record_id]):  # a point get, a multi_get
        with pytest.raises(DecodeError):
            db.identity_users_of(asked)
