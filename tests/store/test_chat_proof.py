"""ChatDb.chat_proof: who controls a chat, read back from the signed member ops it stores."""

from __future__ import annotations

import pytest

from store import ChatDb, Hlc, MemberInfo, Role
from store.authz import DmProof, new_group
from store.ops import MembershipAction, MembershipOp
from store.records import dm_chat_id

from store_support import AUTHOR_IDS, KEYS

GROUP = new_group(KEYS[0], b"chat-proof-test!")  # KEYS[0] created it


def apply(db: ChatDb, *ops: MembershipOp) -> None:
    db.apply_member_ops(list(ops))


def test_a_group_answers_with_its_group_proof(db: ChatDb) -> None:
    chat = GROUP.chat_id()
    assert db.chat_proof(chat) is None
    add = MembershipOp.create(
        KEYS[0], chat, AUTHOR_IDS[1], MembershipAction.ADD, Hlc(10), proof=GROUP
    )
    apply(db, add)
    assert db.chat_proof(chat) == GROUP
    assert db.chat_proof(bytes(32)) is None  # another chat


def test_a_dm_answers_with_its_two_users(db: ChatDb) -> None:
    proof = DmProof(AUTHOR_IDS[0], AUTHOR_IDS[1])
    chat = dm_chat_id(AUTHOR_IDS[0], AUTHOR_IDS[1])
    add = MembershipOp.create(
        KEYS[1], chat, AUTHOR_IDS[0], MembershipAction.ADD, Hlc(10), proof=proof
    )
    apply(db, add)
    assert db.chat_proof(chat) == proof


def test_a_tombstone_row_or_an_unsigned_row_before_it(db: ChatDb) -> None:
    chat = GROUP.chat_id()
    # an unsigned row (tests, admin tooling) sorts first here and carries no proof
    db.apply_member_states([(chat, b"\x00" * 20, MemberInfo(Role.PARTICIPANT, Hlc(5)))])
    assert db.chat_proof(chat) is None
    leave = MembershipOp.create(
        KEYS[2], chat, AUTHOR_IDS[2], MembershipAction.LEAVE, Hlc(10), proof=GROUP
    )
    apply(db, leave)  # a remove alone
    assert db.chat_proof(chat) == GROUP


def test_a_short_chat_id_is_refused(db: ChatDb) -> None:
    with pytest.raises(ValueError):
        db.chat_proof(b"\x01" * 31)
