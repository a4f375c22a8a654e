"""The unread counters' arithmetic (pure): their rows' bytes and how new messages move them.

The chat list's unread count of a reader is the number of shown content messages by others
stamped after their position (``store.reads``). Scanning for it cost most of a chat list, so
``store.unread`` keeps, in the same WriteBatch as every write that changes them:

- per chat, ``total``: its shown content messages;
- per (chat, user) who sent any, a ``Tally``: ``own``, how many of those they sent, and,
  for a reader (a user with a chat-list entry), ``below`` — how many are stamped at or
  before their position — ``own_below`` — how many of those are theirs — and the position.

The count is then ``(total - below) - (own - own_below)``, capped at ``UNREAD_CAP``. A new
message changes two rows (the total and its sender's tally), not one per reader: the
readers' parts change only when a message is stamped at or before their position (rare:
it came late), or when their own receipt moves the position (a scan after the new one).

Rows: the total is 8 bytes (big-endian); a tally 8 (``own``), 24 (a reader with no position
yet: ``own``, ``below``, ``own_below``) or 32 bytes (then the packed position).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from store.errors import DecodeError

UNREAD_CAP = 1000  # counted up to here: a client shows "999+" (the same on every replica)
_U64 = 8
U64_LIMIT = 1 << 64

# A shown message stored now: (packed HLC, sender, is content, receipt position or None)
Shown = tuple[int, bytes, bool, int | None]


class Reader(NamedTuple):
    below: int  # shown content of the chat stamped at or before ``position``
    own_below: int  # of which the reader's own
    position: int | None  # packed HLC (None: no receipt of theirs shown)


class Tally(NamedTuple):
    own: int  # the user's shown content in the chat
    reader: Reader | None  # the reader's part, for a user with a chat-list entry


def unread_of(total: int, tally: Tally) -> int:
    """A reader's unread count: shown content by others after their position, capped."""
    reader = tally.reader
    assert reader is not None
    return min(UNREAD_CAP, (total - reader.below) - (tally.own - reader.own_below))


def encode_total(total: int) -> bytes:
    if not 0 <= total < U64_LIMIT:
        raise ValueError(f"total {total} outside u64")
    return total.to_bytes(_U64, "big")


def decode_total(raw: bytes) -> int:
    if type(raw) is not bytes or len(raw) != _U64:
        raise DecodeError(f"unread total: {_size(raw)}, expected 8 bytes")
    return int.from_bytes(raw, "big")


def encode_tally(tally: Tally) -> bytes:
    own, reader = tally
    if reader is None:  # (most rows: a sender's)
        if not 0 <= own < U64_LIMIT:
            raise ValueError(f"tally {tally} outside u64")
        return own.to_bytes(_U64, "big")
    below, own_below, position = reader
    fields = (own, below, own_below) if position is None else (own, below, own_below, position)
    if min(fields) < 0 or max(fields) >= U64_LIMIT:
        raise ValueError(f"tally {tally} outside u64")
    if not own_below <= min(own, below):
        raise ValueError(f"tally {tally}: more own messages below the position than exist")
    return b"".join([n.to_bytes(_U64, "big") for n in fields])


def decode_tally(raw: bytes) -> Tally:
    """A tally row's value; anything else raises DecodeError."""
    if type(raw) is not bytes or len(raw) not in (_U64, 3 * _U64, 4 * _U64):
        raise DecodeError(f"unread tally: {_size(raw)}, expected 8, 24 or 32 bytes")
    fields = [int.from_bytes(raw[at : at + _U64], "big") for at in range(0, len(raw), _U64)]
    if len(fields) == 1:
        return Tally(fields[0], None)
    own, below, own_below = fields[:3]
    if own_below > min(own, below):
        raise DecodeError(f"unread tally: {own_below} own below the position, of {own}/{below}")
    return Tally(own, Reader(below, own_below, fields[3] if len(fields) == 4 else None))


def count_of(total_raw: bytes, tally_raw: bytes) -> int | None:
    """``unread_of`` straight from a total row and a tally row (None: not a reader) — the
    chat list's read, with ``decode_total``'s and ``decode_tally``'s checks and errors."""
    total = decode_total(total_raw)
    if type(tally_raw) is not bytes or len(tally_raw) not in (24, 32):
        decode_tally(tally_raw)  # raises, or it is a sender's (8 bytes): not a reader
        return None
    own = int.from_bytes(tally_raw[:8], "big")
    below = int.from_bytes(tally_raw[8:16], "big")
    own_below = int.from_bytes(tally_raw[16:24], "big")
    if own_below > min(own, below):
        decode_tally(tally_raw)  # raises
    return min(UNREAD_CAP, (total - below) - (own - own_below))


def _size(raw: object) -> str:
    return f"{len(raw)} bytes" if isinstance(raw, (bytes, bytearray)) else type(raw).__name__


# after(user, position) -> (shown content stamped after it on disk, of which the user's)
After = Callable[[bytes, int], tuple[int, int]]


def follow_tallies(
    total: int,
    tallies: dict[bytes, Tally],
    shown: Sequence[Shown],
    after: After,
    last_position: int = U64_LIMIT,
) -> tuple[int, dict[bytes, Tally]]:
    """A chat's total and the tallies that change once ``shown`` (its messages shown now, not
    yet on disk) are stored; ``after`` counts what is on disk after a position.

    Each content message adds one to the total and to its sender's ``own``, and to the
    ``below`` (and ``own_below``) of each reader positioned at or after its stamp. A reader
    whose receipt moves their position gets ``below`` and ``own_below`` anew: the totals
    less what is stamped after the new position (on disk and here). ``last_position``: at
    or after every reader's position (the readers are walked only if a message is stamped
    at or before it, or a receipt moves).
    """
    contents: list[tuple[int, bytes]] = []
    moves: dict[bytes, int] = {}
    changed: dict[bytes, Tally] = {}
    for packed, sender, content, at in shown:
        if content:
            contents.append((packed, sender))
            own, reader = changed.get(sender) or tallies.get(sender) or (0, None)
            changed[sender] = Tally(own + 1, reader)
        elif at is not None and at > moves.get(sender, -1):
            moves[sender] = at
    total += len(contents)
    if not contents and not moves:
        return total, changed
    oldest = min(contents)[0] if contents else None
    if not moves and (oldest is None or oldest > last_position):
        return total, changed  # (most batches: new messages after every reader's position)
    for user, tally in tallies.items():
        reader = tally.reader
        if reader is None:
            continue
        below, own_below, position = reader
        moved = moves.get(user)
        if moved is None and (position is None or oldest is None or oldest > position):
            continue  # (most readers: nothing of theirs moves)
        own = changed[user].own if user in changed else tally.own
        if moved is not None and (position is None or moved > position):
            later, own_later = after(user, moved)
            for packed, sender in contents:
                if packed > moved:
                    later += 1
                    own_later += sender == user
            reader = Reader(total - later, own - own_later, moved)
        elif position is not None and oldest is not None and oldest <= position:
            for packed, sender in contents:  # (came late: stamped at or before the position)
                if packed <= position:
                    below += 1
                    own_below += sender == user
            reader = Reader(below, own_below, position)
        else:
            continue
        changed[user] = Tally(own, reader)
    return total, changed
