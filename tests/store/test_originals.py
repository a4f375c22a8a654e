"""ChatDb.member_ops_page / deletes_page: a chat's signed originals, byte for byte, paged."""

from __future__ import annotations

import pytest

from store import ChatDb, Hlc, InvalidInput, MessageKind, MsgV1
from store.authz import new_group
from store.kinds import Claims
from store.ops import MembershipAction, MembershipOp

from store_support import AUTHOR_IDS, GROUP_CHAT, KEYS, group_op

OTHER = new_group(KEYS[0], b"originals-other!")


def all_pages(read, chat: bytes, limit: int) -> list[bytes]:  # type: ignore[no-untyped-def]
    got, cursor = [], None
    while True:
        page = read(chat, cursor, limit)
        assert len(page.originals) <= limit
        got += page.originals
        if page.next_cursor is None:
            return got
        cursor = page.next_cursor


def test_member_ops_come_back_as_signed_in_every_page_size(db: ChatDb) -> None:
    ops = [group_op(0, 1), group_op(1, 2), group_op(2, 3), group_op(1, 9, remove=True)]
    db.apply_member_ops(ops)
    other = MembershipOp.create(
        KEYS[0], OTHER.chat_id(), AUTHOR_IDS[1], MembershipAction.ADD, Hlc(5), proof=OTHER
    )
    db.apply_member_ops([other])  # another chat's op never shows up
    for limit in (1, 2, 3, 50):
        got = all_pages(db.member_ops_page, GROUP_CHAT, limit)
        assert sorted(got) == sorted(op.encode() for op in ops)
    assert all_pages(db.member_ops_page, OTHER.chat_id(), 50) == [other.encode()]
    assert all_pages(db.member_ops_page, bytes(32), 50) == []


def delete_of(target: MsgV1, ms: int) -> MsgV1:
    claims = Claims.of(target).encode()
    return MsgV1.create(
        KEYS[0], GROUP_CHAT, Hlc(ms), claims, kind=MessageKind.DELETE, ref=target.msg_id
    )


def test_deletes_come_back_as_signed(db: ChatDb) -> None:
    db.apply_member_ops([group_op(0, 1)])
    targets = [MsgV1.create(KEYS[0], GROUP_CHAT, Hlc(10 + i), b"t%d" % i) for i in range(3)]
    deletes = [delete_of(t, 20 + i) for i, t in enumerate(targets)]
    db.put_authorized(targets + deletes)
    for limit in (1, 2, 50):
        assert sorted(all_pages(db.deletes_page, GROUP_CHAT, limit)) == sorted(
            d.encoded for d in deletes
        )


def test_a_foreign_or_malformed_cursor_and_a_bad_limit_are_refused(db: ChatDb) -> None:
    db.apply_member_ops([group_op(0, 1), group_op(1, 2)])
    cursor = db.member_ops_page(GROUP_CHAT, None, 1).next_cursor
    assert cursor is not None
    with pytest.raises(InvalidInput, match="cursor"):
        db.member_ops_page(OTHER.chat_id(), cursor, 1)  # another chat's
    with pytest.raises(InvalidInput, match="cursor"):
        db.deletes_page(GROUP_CHAT, cursor, 1)  # a member-ops key is not a deletes key
    with pytest.raises(InvalidInput, match="cursor"):
        db.deletes_page(GROUP_CHAT, "not base64!", 1)
    with pytest.raises(InvalidInput, match="limit"):
        db.member_ops_page(GROUP_CHAT, None, 0)
    with pytest.raises(ValueError):
        db.member_ops_page(b"\x01" * 31)
