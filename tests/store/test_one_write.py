"""A plan's replicated changes are one WriteBatch: all of them are written, or none.

``Admission._carry_out`` writes the member ops, identities, deletes, erasures, messages and
waiting room of a plan inside ``EventLog.one_write``; here a message the store refuses
(over its payload limit) fails the batch, and the member op planned with it is not written
either — nor left in a cache that would make the store look as if it were.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from store import ChatDb, ChatDbConfig, Hlc, MsgV1
from store.errors import TooLarge

from store_support import AUTHOR_IDS, GROUP_CHAT, KEYS, group_op


def test_a_refused_message_fails_the_whole_plan_and_nothing_is_written(tmp_path: Path) -> None:
    db = ChatDb(ChatDbConfig(path=str(tmp_path / "db"), max_payload=64))
    try:
        join = group_op(0, 1)
        ok = MsgV1.create(KEYS[0], GROUP_CHAT, Hlc(10), b"fits")
        big = MsgV1.create(KEYS[0], GROUP_CHAT, Hlc(11), b"x" * 100)
        position = db.last_position
        with pytest.raises(TooLarge):
            db.apply_ops([join, ok, big])
        assert db.members.member_ops_of(GROUP_CHAT, AUTHOR_IDS[0]) == []
        assert db.members.member_history(GROUP_CHAT, AUTHOR_IDS[0]).adds == ()  # no cached history
        assert not db.has_message(ok.msg_id) and db.last_position == position
        assert db.metas.load(GROUP_CHAT).members == ()  # no cached meta either
        plan = db.apply_ops([join, ok])  # the same ops without the refused one: all written
        assert plan.new == [True, True] and db.has_message(ok.msg_id)
        assert db.last_position == position + 2  # the member op's event and the message's
    finally:
        db.close()
