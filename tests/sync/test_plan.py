"""store.plan, the chat rules' one decision-maker, seen through its plans: each decision it makes
(store, hold, release, erase, refuse as erased, re-decide), and that planning writes nothing.

The replicas that carry plans out are compared record for record elsewhere
(``test_replica_agreement``: memory and RocksDB; ``tests/sim/test_replica``: the simulator's).
"""

from __future__ import annotations

from store.hlc import Hlc
from store.plan import plan_ops
from sync.replica import MemoryReplica

from sync_support import CHATS, USERS, contents, delete_of, member, message


def held(*ops) -> MemoryReplica:  # type: ignore[no-untyped-def]
    replica = MemoryReplica()
    replica.apply_ops(list(ops))
    return replica


def test_planning_writes_nothing_and_decides_alike_twice() -> None:
    replica = held(member(0, 0, 990), message(0))
    before = contents(replica)
    ops = [message(3), member(0, 3, 990), delete_of(0, 0, 5)]
    assert plan_ops(ops, replica) == plan_ops(ops, replica)
    assert contents(replica) == before


def test_a_message_waits_for_its_op_and_is_released_by_it() -> None:
    replica = MemoryReplica()
    plan = plan_ops([message(0)], replica)
    assert plan.park == [message(0)] and plan.new == [False] and not plan.store
    replica.apply_ops([message(0)])
    plan = plan_ops([member(0, 0, 990)], replica)
    assert plan.released_chats == {CHATS[0]}
    assert list(plan.store) == [message(0).msg_id] and plan.changed == 2 and not plan.park


def test_a_valid_delete_erases_and_what_it_erased_is_refused_later() -> None:
    replica = held(member(0, 0, 990), message(0))
    delete = delete_of(0, 0, 5)
    plan = plan_ops([delete], replica)
    assert list(plan.deletes) == [delete.msg_id] and list(plan.erase) == [message(0).msg_id]
    replica.apply_ops([delete])
    plan = plan_ops([message(0)], replica)
    assert plan.new == [False] and not plan.store and not plan.park


def test_a_message_and_its_delete_in_one_batch_decide_alike_in_either_order() -> None:
    replica = held(member(0, 0, 990))
    delete = delete_of(0, 0, 5)
    first, second = plan_ops([message(0), delete], replica), plan_ops([delete, message(0)], replica)
    for plan in (first, second):
        assert not plan.store and list(plan.deletes) == [delete.msg_id]
        assert plan.refused_erased == {message(0).msg_id: CHATS[0]}
    assert first.new == [False, True] and second.new == [True, False]


def test_an_admin_add_lets_a_held_delete_erase_what_it_names() -> None:
    """User 1's delete of user 3's message erases nothing until user 1 is an admin from a stamp
    at or before it — then the plan of the admin add erases it."""
    delete = delete_of(3, 1, 5)
    replica = held(member(0, 3, 990), member(0, 1, 990), message(3), delete)
    assert message(3).msg_id in replica.messages  # not valid yet: nothing erased
    plan = plan_ops([member(0, 1, 991, role=1)], replica)
    assert list(plan.erase) == [message(3).msg_id]


def test_a_removal_re_decides_the_senders_messages_from_its_stamp() -> None:
    replica = held(member(0, 0, 990), message(0))
    plan = plan_ops([member(0, 0, 995, remove=True)], replica)
    assert plan.redecide == {(CHATS[0], USERS[0]): Hlc(995)}
    replica.apply_ops([member(0, 0, 995, remove=True)])
    assert message(0).msg_id in replica.messages and not replica.is_visible(message(0))
