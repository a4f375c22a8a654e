"""Deletes on both replicas, case by case (MESSAGES.md): what a valid delete erases goes, on
every path and in every order, and never comes back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from store import ChatDb, ChatDbConfig, MessageKind
from store.kinds import Tombstone
from store.records import Role
from sync.replica import DbReplica, MemoryReplica

from sync_support import (
    USERS,
    delete_of,
    member,
    member_stamp,
    message,
    reaction_to,
    refers,
)

Replica = MemoryReplica | DbReplica
JOINED = [member(chat, user, member_stamp(0)) for chat in range(3) for user in range(4)]
TARGET = message(1)  # by USERS[1] in CHATS[1]
AUTHOR, OTHER = 1, 2


@pytest.fixture(params=["memory", "rocksdb"])
def replica(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Replica]:
    if request.param == "memory":
        yield MemoryReplica()
        return
    with ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=tmp_path) as db:
        yield DbReplica(db)


def held(replica: Replica, msg_id: bytes) -> bool:
    if isinstance(replica, MemoryReplica):
        return msg_id in replica.messages
    return replica.db.get_message(msg_id) is not None


def test_a_delete_before_its_target_keeps_the_target_out_for_good(replica: Replica) -> None:
    replica.apply_ops([*JOINED, delete_of(1, AUTHOR, 5)])
    assert replica.apply_ops([TARGET]).new == [False]
    assert replica.apply_ops([TARGET]).new == [False]  # a re-post of the same bytes
    assert not held(replica, TARGET.msg_id)
    (item,) = replica.view(TARGET.chat_id).items
    assert isinstance(item, Tombstone) and item.sender == USERS[AUTHOR]


def test_an_edit_or_reaction_after_the_delete_is_refused(replica: Replica) -> None:
    edit = refers(MessageKind.EDIT, 1, AUTHOR, 9, b"too late")
    reaction = reaction_to(1, OTHER, 9)
    replica.apply_ops([*JOINED, TARGET, delete_of(1, AUTHOR, 5)])
    assert replica.apply_ops([edit, reaction]).new == [False, False]
    assert not any(held(replica, m.msg_id) for m in (TARGET, edit, reaction))


def test_someone_else_s_delete_erases_once_they_are_made_admin(replica: Replica) -> None:
    delete = delete_of(1, OTHER, 5)
    replica.apply_ops([*JOINED, TARGET, delete])
    assert held(replica, TARGET.msg_id)  # not the author, not an admin
    grant = member(1, OTHER, member_stamp(0) + 1, role=Role.ADMIN)  # stamped before the delete
    replica.apply_ops([grant])
    assert not held(replica, TARGET.msg_id)


def test_an_admin_add_after_the_delete_s_stamp_does_not_validate_it(replica: Replica) -> None:
    replica.apply_ops([*JOINED, TARGET, delete_of(1, OTHER, 5)])
    replica.apply_ops([member(1, OTHER, TARGET.hlc.physical_ms + 6, role=Role.ADMIN)])
    assert held(replica, TARGET.msg_id)


def test_a_lying_delete_takes_the_reactions_and_leaves_the_message(replica: Replica) -> None:
    edit = refers(MessageKind.EDIT, 1, AUTHOR, 3, b"edited")
    reaction = reaction_to(1, OTHER, 4)
    replica.apply_ops([*JOINED, TARGET, edit, reaction, delete_of(1, OTHER, 5, lie=True)])
    assert held(replica, TARGET.msg_id) and held(replica, edit.msg_id)
    assert not held(replica, reaction.msg_id)
    (item,) = replica.view(TARGET.chat_id).items
    assert not isinstance(item, Tombstone) and item.payload == b"edited"


def test_a_waiting_message_a_delete_erases_leaves_the_waiting_room(replica: Replica) -> None:
    """Its sender has no add yet, so it waits; the creator's delete erases it there too (its
    payload must not stay in the room, nor in the store's copy of the room)."""
    replica.apply_ops([member(1, 0, member_stamp(0)), TARGET])
    assert TARGET.msg_id in replica.waiting
    replica.apply_ops([delete_of(1, 0, 5)])  # by USERS[0], the group's creator
    assert TARGET.msg_id not in replica.waiting
    if isinstance(replica, DbReplica):
        assert replica.db.load_waiting() == []
    replica.apply_ops([member(1, AUTHOR, member_stamp(0))])  # the add comes: nothing to store
    assert not held(replica, TARGET.msg_id)


def test_a_message_that_comes_after_the_delete_that_erases_it_never_waits(
    replica: Replica,
) -> None:
    replica.apply_ops([member(1, 0, member_stamp(0)), delete_of(1, 0, 5)])
    replica.apply_ops([TARGET])  # its sender has no add: it would wait, but it is erased
    assert TARGET.msg_id not in replica.waiting
    if isinstance(replica, DbReplica):
        assert replica.db.load_waiting() == []
