"""Retention GC on a real ChatDb: exactly the expired messages go, nothing comes back."""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from store import ChatDb, ChatDbConfig, Hlc, MsgV1, Role
from store.retention import RetentionPolicy, gc_messages, size_cutoff, storage_bytes
from store.signing import key_from_seed, public_key, user_id_from_key
from sync.frames import Domain
from sync.merkle import MerkleTree
from sync.replica import DbReplica

KEY = key_from_seed(b"\x31" * 32)
USER = user_id_from_key(public_key(KEY))
CHATS = [bytes([0xA0 + i]) * 32 for i in range(3)]


@cache
def msg(n: int) -> MsgV1:
    return MsgV1.create(KEY, CHATS[n % 3], Hlc(10_000 + n * 100, n % 3), b"p%d" % n)


def open_db(path: Path) -> ChatDb:
    return ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=path)


@settings(max_examples=25)
@given(st.lists(st.integers(0, 80), unique=True, min_size=1), st.integers(9_000, 19_000))
def test_gc_removes_exactly_the_expired_and_refuses_them_after(
    tmp_path_factory, numbers: list[int], cutoff: int
) -> None:  # type: ignore[no-untyped-def]
    db = open_db(tmp_path_factory.mktemp("gc"))
    try:
        msgs = [msg(n) for n in numbers]
        db.put_messages(msgs)
        replica = DbReplica(db)
        expired = replica.expire_messages(cutoff, batch=7)
        old = {m.msg_id for m in msgs if m.hlc.physical_ms <= cutoff}
        assert set(expired) == old
        kept = {i for i, _ in db.iter_msg_ids()}
        assert kept == {m.msg_id for m in msgs} - old
        for chat in CHATS:  # the messages CF agrees with the index
            for item in db.range(chat, limit=200).items:
                assert item.msg.hlc.physical_ms > cutoff
        assert replica.tree(Domain.MESSAGES) == MerkleTree.from_ids(kept)
        # a replay of an expired message (gossip, sync) is refused: no resurrection
        results = db.put_messages(msgs)
        assert all(r.expired for r, m in zip(results, msgs, strict=True) if m.msg_id in old)
        assert {i for i, _ in db.iter_msg_ids()} == kept
    finally:
        db.close()


def test_an_emptied_chat_has_consistent_meta_and_inbox(tmp_path: Path) -> None:
    with open_db(tmp_path / "db") as db:
        db.add_member_synced(CHATS[0], USER, Role.ADMIN, Hlc(1))
        msgs = [msg(n) for n in (0, 3, 6)]  # all in CHATS[0]
        previous = {CHATS[0]: db.load_meta(CHATS[0]).last_ts}
        db.put_messages(msgs)
        db.refresh_inboxes(msgs, previous)
        gc_messages(db, 10_000 + 6 * 100)  # everything in the chat
        meta = db.get_chat_meta(CHATS[0])
        assert meta is not None and meta.last_msg_ts == 0 and meta.last_msg_id == bytes(32)
        assert meta.last_seq == 3  # a local counter: it never goes back
        entry = db.list_user_chats(USER).items[0].entry
        assert entry.last_msg_id == bytes(32)  # no pointer to a deleted message


def test_compaction_reclaims_space(tmp_path: Path) -> None:
    with open_db(tmp_path / "db") as db:
        rnd = random.Random(1)  # incompressible payloads: Zstd would hide repeated bytes
        big = [
            MsgV1.create(KEY, CHATS[i % 3], Hlc(1_000 + i), rnd.randbytes(4_000))
            for i in range(600)
        ]
        db.put_messages(big)
        db.flush()
        before = storage_bytes(db)
        _, expired = gc_messages(db, 1_000 + 599)
        db.compact()
        after = storage_bytes(db)
        assert len(expired) == 600
        assert before > 600 * 4_000 and after < before / 10, (before, after)


def test_size_policy_expires_the_oldest_first(tmp_path: Path) -> None:
    with open_db(tmp_path / "db") as db:
        db.put_messages([msg(n) for n in range(40)])
        times = sorted(m.hlc.physical_ms for m in (msg(n) for n in range(40)))
        cutoff = size_cutoff(db, max_bytes=750, used_bytes=1_000)
        assert cutoff == times[9]  # a quarter over the cap: the oldest quarter
        assert size_cutoff(db, max_bytes=1_000, used_bytes=900) is None
        policy = RetentionPolicy(retention_days=1)
        assert policy.age_cutoff(10 * 86_400_000) == 9 * 86_400_000
        assert RetentionPolicy().cutoff(db, 10**12) is None
