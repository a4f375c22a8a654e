"""Retention GC on a real ChatDb: exactly the expired messages go, nothing comes back."""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import ChatDb, ChatDbConfig, Hlc, MessageKind, MsgV1, Role
from store.hlc import VIRTUAL_EPOCH_MS
from store.kinds import reaction_payload
from store.retention import (
    GcResult,
    RetentionPolicy,
    gc_messages,
    size_cutoff,
    storage_bytes,
    trim_chats,
)
from store.signing import key_from_seed, public_key, user_id_from_key
from sync.frames import Domain
from sync.merkle import MerkleTree
from sync.replica import DbReplica

from store_support import fresh_db

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


def test_a_chat_whose_content_expired_points_at_nothing_though_a_reaction_stays(
    tmp_path: Path,
) -> None:
    """The preview is the newest shown content message: when it expires, a reaction stamped
    later that stays does not keep the chat pointing at a message that is gone."""
    with open_db(tmp_path / "db") as db:
        db.add_member_synced(CHATS[0], USER, Role.ADMIN, Hlc(1))
        post = msg(0)
        reaction = MsgV1.create(
            KEY, CHATS[0], Hlc(post.hlc.physical_ms + 5_000), reaction_payload(b"+1"),
            kind=MessageKind.REACTION, ref=post.msg_id,
        )  # fmt: skip
        previous = {CHATS[0]: db.load_meta(CHATS[0]).last_ts}
        db.put_messages([post, reaction])
        db.refresh_inboxes([post, reaction], previous)
        assert db.load_meta(CHATS[0]).last_msg_id == post.msg_id
        gc_messages(db, post.hlc.physical_ms)  # the post, not the reaction
        assert db.get_message(reaction.msg_id) is not None
        assert db.load_meta(CHATS[0]).last_msg_id == bytes(32)
        assert db.list_user_chats(USER).items[0].entry.last_msg_id == bytes(32)


@pytest.mark.parametrize("stamp", [Hlc(0, 0), Hlc(0, 1)], ids=["epoch", "epoch-logical"])
def test_a_chat_whose_only_message_was_stamped_at_the_epoch_points_at_nothing_once_it_expired(
    tmp_path: Path, stamp: Hlc
) -> None:
    """Physical ms 0 is a stamp like any other (a peer's clock may say so): "no newest
    message" is the zero id, not a zero stamp."""
    with open_db(tmp_path / "db") as db:
        db.add_member_synced(CHATS[0], USER, Role.ADMIN, Hlc(0))
        post = MsgV1.create(KEY, CHATS[0], stamp, b"at the epoch")
        previous = {CHATS[0]: db.load_meta(CHATS[0]).last_ts}
        db.put_messages([post])
        db.refresh_inboxes([post], previous)
        assert db.load_meta(CHATS[0]).last_msg_id == post.msg_id
        gc_messages(db, 0)
        assert db.get_message(post.msg_id) is None
        assert db.load_meta(CHATS[0]).last_msg_id == bytes(32)
        assert db.list_user_chats(USER).items[0].entry.last_msg_id == bytes(32)


def test_a_chat_whose_newest_message_stays_keeps_pointing_at_it(tmp_path: Path) -> None:
    with open_db(tmp_path / "db") as db:
        db.add_member_synced(CHATS[0], USER, Role.ADMIN, Hlc(1))
        old, new = msg(0), msg(3)  # both in CHATS[0]
        previous = {CHATS[0]: db.load_meta(CHATS[0]).last_ts}
        db.put_messages([old, new])
        db.refresh_inboxes([old, new], previous)
        gc_messages(db, old.hlc.physical_ms)  # the old one only
        assert db.get_message(old.msg_id) is None
        assert db.load_meta(CHATS[0]).last_msg_id == new.msg_id
        assert db.list_user_chats(USER).items[0].entry.last_msg_id == new.msg_id


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


# --- exact boundaries, at realistic clock values ----------------------------------------------
# Stamps near the virtual epoch (2**40.7 ms) fill every byte of a packed HLC, so a stamp read
# from one byte too far in a key differs.

EPOCH = VIRTUAL_EPOCH_MS
DAY = 86_400_000  # written out: DAY_MS is under test too


@cache
def dated(chat: int, offset_ms: int) -> MsgV1:
    return MsgV1.create(KEY, CHATS[chat], Hlc(EPOCH + offset_ms, 3), b"d%d" % offset_ms)


def test_trim_takes_a_chat_whose_oldest_message_is_exactly_at_the_cutoff(tmp_path: Path) -> None:
    with open_db(tmp_path / "db") as db:
        db.put_messages([dated(0, 0), dated(0, 10), dated(1, 1), dated(1, 5), dated(2, 20)])
        assert trim_chats(db, EPOCH) == [CHATS[0]]  # chat 1 starts 1 ms after the cutoff
        assert db.expire_before_ms == EPOCH
        assert trim_chats(db, EPOCH + 5) == [CHATS[1]]  # chat 0 now starts at +10
        left = {m.msg_id for c in CHATS for m in (i.msg for i in db.range(c, limit=50).items)}
        assert left == {dated(0, 10).msg_id, dated(2, 20).msg_id}


def test_the_refusal_horizon_never_moves_back(tmp_path: Path) -> None:
    with open_db(tmp_path / "db") as db:
        db.put_messages([dated(0, 0), dated(0, 100)])
        trim_chats(db, EPOCH + 50)
        trim_chats(db, EPOCH + 10)  # an older cutoff (a smaller policy) keeps the horizon
        assert db.expire_before_ms == EPOCH + 50
        assert db.put_messages([dated(1, 40)])[0].expired


def test_an_emptied_chat_reads_as_new_from_cache_and_disk(tmp_path: Path) -> None:
    with open_db(tmp_path / "db") as db:
        db.add_member_synced(CHATS[0], USER, Role.ADMIN, Hlc(1))
        msgs = [dated(0, 0), dated(0, 7)]
        previous = {CHATS[0]: db.load_meta(CHATS[0]).last_ts}
        db.put_messages(msgs)
        db.refresh_inboxes(msgs, previous)
        result, expired = gc_messages(db, EPOCH + 7)
        assert result == GcResult(EPOCH + 7, chats_trimmed=1, messages_expired=2)
        assert sorted(expired) == sorted(m.msg_id for m in msgs)
        for meta in (db.load_meta(CHATS[0]), db.get_chat_meta(CHATS[0])):  # cache, then disk
            assert meta is not None
            assert (meta.last_ts, meta.last_msg_ts, meta.last_msg_id) == (0, 0, bytes(32))
        entry = db.list_user_chats(USER).items[0].entry
        assert (entry.last_ts, entry.last_msg_id, entry.chat_id) == (0, bytes(32), CHATS[0])


def test_no_cutoff_collects_nothing(tmp_path: Path) -> None:
    with open_db(tmp_path / "db") as db:
        db.put_messages([dated(0, 0)])
        assert gc_messages(db, None) == (GcResult(None, 0, 0), [])
        assert len(list(db.iter_msg_ids())) == 1


@settings(max_examples=30)
@given(
    st.lists(st.integers(0, 10_000), unique=True, min_size=1, max_size=30),
    st.integers(1, 10**9),
    st.integers(1, 10**9),
)
def test_the_size_cutoff_expires_the_fewest_oldest_messages_that_cover_the_excess(
    offsets: list[int], max_bytes: int, used_bytes: int
) -> None:
    with fresh_db() as db:
        db.put_messages([dated(0, o) for o in offsets])
        cutoff = size_cutoff(db, max_bytes=max_bytes, used_bytes=used_bytes)
        if used_bytes <= max_bytes:
            assert cutoff is None
            return
        assert cutoff is not None
        expired = sum(EPOCH + o <= cutoff for o in offsets)
        share = (used_bytes - max_bytes) / used_bytes  # of the bytes, so of the messages
        assert expired >= 1 and expired / len(offsets) >= share
        assert (expired - 1) / len(offsets) < share  # one fewer would not cover it


def test_a_zero_byte_budget_means_unlimited(tmp_path: Path) -> None:
    with open_db(tmp_path / "db") as db:
        db.put_messages([dated(0, 0), dated(0, 1)])
        assert size_cutoff(db, max_bytes=0, used_bytes=1_000) is None
        assert size_cutoff(db, max_bytes=1, used_bytes=1_000) == EPOCH + 1
        assert size_cutoff(db, max_bytes=999, used_bytes=1_000) == EPOCH  # one message covers it
        assert size_cutoff(db, max_bytes=1_000, used_bytes=1_000) is None


def test_the_policy_cutoff_is_the_later_of_age_and_size(tmp_path: Path) -> None:
    with open_db(tmp_path / "db") as db:
        rnd = random.Random(2)  # incompressible: the files really hold the bytes
        # many small messages: a budget 1 KiB off moves the cutoff by a message or more
        db.put_messages(
            [
                MsgV1.create(KEY, CHATS[i % 3], Hlc(EPOCH + i), rnd.randbytes(600))
                for i in range(4_000)
            ]
        )
        db.flush()
        used = storage_bytes(db)
        assert used > 2 * 1024 * 1024  # over the 1 MB cap below
        by_size = size_cutoff(db, max_bytes=1024 * 1024, used_bytes=used)
        assert by_size is not None and EPOCH < by_size < EPOCH + 3_999
        assert size_cutoff(db, max_bytes=1025 * 1024, used_bytes=used) != by_size
        size_only = RetentionPolicy(max_storage_mb=1)
        assert size_only.cutoff(db, EPOCH) == by_size
        assert RetentionPolicy().cutoff(db, EPOCH + 10 * DAY) is None  # 0 and 0: keep all
        now_late = by_size + 2 + DAY  # an age cutoff after the size cutoff wins
        assert RetentionPolicy(1, 1).cutoff(db, now_late) == by_size + 2
        now_early = by_size - 2 + DAY  # and before it, the size cutoff wins
        assert RetentionPolicy(1, 1).cutoff(db, now_early) == by_size
        assert RetentionPolicy(0.5).cutoff(db, EPOCH + DAY) == EPOCH + DAY // 2
        assert RetentionPolicy(-1).age_cutoff(EPOCH) is None


def test_storage_bytes_counts_the_sst_and_wal_files_only(tmp_path: Path) -> None:
    with open_db(tmp_path / "db") as db:
        db.put_messages([dated(0, 0)])
        db.flush()
        files = {f.suffix: f.stat().st_size for f in (tmp_path / "db").iterdir()}
        data = sum(
            f.stat().st_size for f in (tmp_path / "db").iterdir() if f.suffix in (".sst", ".log")
        )
        assert ".sst" in files and storage_bytes(db) == data > 0
        (tmp_path / "db" / "notes.txt").write_bytes(b"x" * 1000)  # not data
        assert storage_bytes(db) == data
