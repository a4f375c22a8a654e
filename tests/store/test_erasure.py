"""Erased on bytes (MESSAGES.md, "Erased on disk"): after a delete, the payload of the deleted
message — and of its edits and reactions — is in no file of the database directory: not in
an SST (compaction rewrote them), not in a write-ahead log (the memtables were flushed) —
once ``compact_erased`` ran, as the node's erasure task does within a second of the delete.

Payloads are random (incompressible, so an SST holds them verbatim) and the test first sees
them on disk: a search that can find nothing would prove nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from store import ChatDb, ChatDbConfig, Hlc, MessageKind, MsgV1
from store.kinds import Claims, reaction_payload
from sync.replica import DbReplica

from store_support import KEYS, group_op

CONFIG = ChatDbConfig(block_cache_mb=8, memtable_mb=8)


def files_holding(path: Path, needle: bytes) -> list[str]:
    return sorted(f.name for f in path.rglob("*") if f.is_file() and needle in f.read_bytes())


def test_a_delete_leaves_no_byte_of_the_payloads_on_disk(tmp_path: Path) -> None:
    secret, edited = os.urandom(4096), os.urandom(4096)
    key = os.urandom(32)  # a reaction key the client encrypted
    target = MsgV1.create(KEYS[1], group_op(1, 1).chat_id, Hlc(100), secret)
    edit = MsgV1.create(
        KEYS[1], target.chat_id, Hlc(110), edited, kind=MessageKind.EDIT, ref=target.msg_id
    )
    reaction = MsgV1.create(
        KEYS[2], target.chat_id, Hlc(120), reaction_payload(key), kind=MessageKind.REACTION,
        ref=target.msg_id,
    )  # fmt: skip
    delete = MsgV1.create(
        KEYS[1], target.chat_id, Hlc(200), Claims.of(target).encode(), kind=MessageKind.DELETE,
        ref=target.msg_id,
    )  # fmt: skip
    needles = [secret[1000:1064], edited[1000:1064], key]
    with ChatDb(CONFIG, path=tmp_path) as db:
        replica = DbReplica(db)
        replica.apply_ops([group_op(1, 1), group_op(2, 1), target, edit, reaction])
        db.flush()
        assert all(files_holding(tmp_path, needle) for needle in needles)  # the control
        replica.apply_ops([delete])
        assert db.erasure_pending()
        assert db.compact_erased() == 3  # what the node's erasure task does within a second
        for needle in needles:
            assert files_holding(tmp_path, needle) == []
        assert [db.get_message(m.msg_id) for m in (target, edit, reaction)] == [None] * 3
    for needle in needles:  # closing wrote nothing back
        assert files_holding(tmp_path, needle) == []


def test_a_lying_delete_leaves_no_byte_of_the_reactions_it_erases(tmp_path: Path) -> None:
    """A delete whose claims do not match its target erases only the reactions to that id
    (MESSAGES.md): the target stays, and the reactions' bytes — also copied in the target's
    ``referred`` rows — go from every file all the same."""
    key = os.urandom(32)
    target = MsgV1.create(KEYS[1], group_op(1, 1).chat_id, Hlc(100), b"stays")
    reaction = MsgV1.create(
        KEYS[2], target.chat_id, Hlc(120), reaction_payload(key), kind=MessageKind.REACTION,
        ref=target.msg_id,
    )  # fmt: skip
    lie = Claims(reaction.sender, target.hlc, target.kind).encode()  # not the target's author
    delete = MsgV1.create(
        KEYS[2], target.chat_id, Hlc(200), lie, kind=MessageKind.DELETE, ref=target.msg_id
    )
    with ChatDb(CONFIG, path=tmp_path) as db:
        replica = DbReplica(db)
        replica.apply_ops([group_op(1, 1), group_op(2, 1), target, reaction])
        db.flush()
        assert files_holding(tmp_path, key)  # the control
        replica.apply_ops([delete])
        db.compact_erased()
        assert files_holding(tmp_path, key) == []
        assert db.get_message(target.msg_id) == target and db.get_message(reaction.msg_id) is None
