"""The waiting room (store/waiting.py) against a plain list: bounded, oldest out first.

A message waits until an op admits it; the room must never hold more than its bounds, evict
in arrival order, and give back exactly the messages of the chats released.
"""

from __future__ import annotations

from functools import cache

from hypothesis import given
from hypothesis import strategies as st

from store.hlc import Hlc
from store.records import MessageKind, MsgV1
from store.waiting import DEFAULT_MAX_BYTES, DEFAULT_MAX_MESSAGES, WaitingRoom

CHATS = [bytes([0x60 + i]) * 32 for i in range(3)]
SENDER = bytes([0x21]) * 20


@cache
def message(n: int) -> MsgV1:
    """Message n: in chat n % 3, with a payload of n % 7 * 10 bytes (sizes differ)."""
    payload = b"x" * (n % 7 * 10)
    return MsgV1(
        CHATS[n % 3], SENDER, Hlc(n + 1), MessageKind.NEW, payload, None, bytes(32), bytes(64)
    )


# park(n) or release(set of chat indexes)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("park"), st.integers(0, 20)),
        st.tuples(st.just("release"), st.frozensets(st.integers(0, 2), max_size=2)),
    ),
    max_size=40,
)


@given(steps, st.integers(1, 6), st.integers(150, 600))
def test_the_room_behaves_like_a_bounded_list_evicting_the_oldest(
    script: list[tuple[str, object]], max_messages: int, max_bytes: int
) -> None:
    room = WaitingRoom(max_messages=max_messages, max_bytes=max_bytes)
    model: list[MsgV1] = []  # oldest first
    parked = released = evicted = 0
    for action, arg in script:
        if action == "park":
            msg = message(arg)  # type: ignore[arg-type]
            gone: list[bytes] = []  # what park must report evicted, oldest first
            if msg not in model:
                model.append(msg)
                parked += 1
                while len(model) > max_messages or sum(len(m.encoded) for m in model) > max_bytes:
                    gone.append(model.pop(0).msg_id)
                    evicted += 1
            assert room.park(msg) == gone
        else:
            chats = {CHATS[i] for i in arg}  # type: ignore[attr-defined]
            out = room.release_chats(chats)
            expected = [m for m in model if m.chat_id in chats]
            assert sorted(m.msg_id for m in out) == sorted(m.msg_id for m in expected)
            for chat in chats:  # chat by chat (a set: any order of chats), ids in order
                ids = [m.msg_id for m in out if m.chat_id == chat]
                assert ids == sorted(ids)
            model = [m for m in model if m.chat_id not in chats]
            released += len(out)
        assert room.waiting() == model
        assert len(room) == len(model)
        assert room.bytes == sum(len(m.encoded) for m in model)
        assert all(m.msg_id in room for m in model)
        assert (room.stats.parked, room.stats.released, room.stats.evicted) == (
            parked,
            released,
            evicted,
        )


def test_a_released_chat_comes_out_in_id_order_and_leaves_the_others() -> None:
    room = WaitingRoom()
    for n in (0, 3, 6, 1, 4):  # chats 0, 0, 0, 1, 1
        room.park(message(n))
    out = room.release_chats({CHATS[0]})
    assert [m.msg_id for m in out] == sorted(message(n).msg_id for n in (0, 3, 6))
    assert room.waiting() == [message(1), message(4)]
    assert room.release_chats({CHATS[0], CHATS[2]}) == []
    assert message(0).msg_id not in room and message(1).msg_id in room


def test_a_message_larger_than_the_room_is_not_held() -> None:
    big = message(6)  # the largest payload
    room = WaitingRoom(max_bytes=len(big.encoded) - 1)
    room.park(message(0))
    # evicted at once, and everything older with it
    assert room.park(big) == [message(0).msg_id, big.msg_id]
    assert len(room) == 0 and room.bytes == 0 and room.stats.evicted == 2


def test_the_default_bounds() -> None:
    # SECURITY.md: a key that was never a member occupies at most this much of a replica
    room = WaitingRoom()
    assert (room.max_messages, room.max_bytes) == (DEFAULT_MAX_MESSAGES, DEFAULT_MAX_BYTES)
    assert (DEFAULT_MAX_MESSAGES, DEFAULT_MAX_BYTES) == (4_096, 8 * 1024 * 1024)


def test_a_room_exactly_full_keeps_everything_and_forgets_drained_chats() -> None:
    first, second = message(1), message(2)  # chats 1 and 2
    room = WaitingRoom(max_messages=2, max_bytes=len(first.encoded) + len(second.encoded))
    assert room.park(first) == room.park(second) == []  # at both bounds exactly: none evicted
    assert room.waiting() == [first, second] and room.stats.evicted == 0
    room.release_chats({CHATS[1]})
    room.park(message(3))  # chat 0; evicts chat 2's only message
    room.release_chats({CHATS[0]})
    # nothing waits, so nothing of any chat is remembered (the room's memory is what it holds)
    assert len(room) == 0 and room.bytes == 0 and room._by_chat == {}
