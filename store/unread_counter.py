"""A reader's unread counter in a chat (pure): its row's bytes and how new messages move it.

The chat list's unread count is a function of the stored messages (``store.reads``: shown
content messages by others stamped after the reader's position, the greatest position of
their shown receipts, counted up to ``UNREAD_CAP``). Scanning for it on every list cost
most of a chat list, so ``store.unread`` keeps the result per (chat, reader) — derived
state, written in the same WriteBatch as every write that changes it, and equal to a
recount at every point (``tests/store/test_unread_counters.py``).

A counter row's value: the count (4 bytes, big-endian, at most ``UNREAD_CAP``), then the
reader's position (8 bytes, a packed HLC) if they have one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from store.errors import DecodeError

UNREAD_CAP = 1000  # counted up to here: a client shows "999+" (the same on every replica)
COUNT_LEN = 4
POSITION_LEN = 8

# (reader's position: a packed HLC, None: no receipt shown; their count)
Counter = tuple[int | None, int]
# A shown message stored now: (packed HLC, sender, is content, receipt position or None)
Shown = tuple[int, bytes, bool, int | None]


def encode_counter(position: int | None, count: int) -> bytes:
    if not 0 <= count <= UNREAD_CAP:
        raise ValueError(f"unread count {count} outside 0..{UNREAD_CAP}")
    head = count.to_bytes(COUNT_LEN, "big")
    return head if position is None else head + position.to_bytes(POSITION_LEN, "big")


def decode_counter(raw: bytes) -> Counter:
    """A counter row's value; anything else raises DecodeError."""
    if type(raw) is not bytes or len(raw) not in (COUNT_LEN, COUNT_LEN + POSITION_LEN):
        size = len(raw) if isinstance(raw, (bytes, bytearray)) else type(raw).__name__
        raise DecodeError(f"unread counter: {size} bytes, expected 4 or 12")
    count = int.from_bytes(raw[:COUNT_LEN], "big")
    if count > UNREAD_CAP:
        raise DecodeError(f"unread counter: count {count} over {UNREAD_CAP}")
    position = int.from_bytes(raw[COUNT_LEN:], "big") if len(raw) > COUNT_LEN else None
    return position, count


def follow_counters(
    counters: dict[bytes, Counter],
    shown: Sequence[Shown],
    recount: Callable[[bytes, int], int],
) -> dict[bytes, Counter]:
    """The counters of a chat's readers that change once ``shown`` (its messages shown now,
    not yet on disk) are stored.

    A reader's position moves to their greatest receipt among them, if greater; then their
    count is ``recount(reader, new position)`` (what is on disk after it) plus the new
    content by others after it. Otherwise the new content by others after the position is
    added, capped.
    """
    moves: dict[bytes, int] = {}
    contents: list[tuple[int, bytes]] = []
    by_sender: dict[bytes, int] = {}
    for packed, sender, content, at in shown:
        if content:
            contents.append((packed, sender))
            by_sender[sender] = by_sender.get(sender, 0) + 1
        elif at is not None and at > moves.get(sender, -1):
            moves[sender] = at
    oldest = min(contents)[0] if contents else None
    changed: dict[bytes, Counter] = {}
    for reader, (position, count) in counters.items():
        moved = moves.get(reader)
        if moved is not None and (position is None or moved > position):
            position, count = moved, recount(reader, moved)
        elif oldest is None or count == UNREAD_CAP:
            continue  # nothing to add
        if oldest is None:
            pass
        elif position is None or position < oldest:  # (most readers) after every new one
            count += len(contents) - by_sender.get(reader, 0)
        else:
            count += sum(1 for p, s in contents if p > position and s != reader)
        new = (position, min(count, UNREAD_CAP))
        if new != counters[reader]:
            changed[reader] = new
    return changed
