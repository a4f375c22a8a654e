"""A view row: what a history page shows of a message its edits and reactions change. Pure.

``views[target's messages key] = edit length:4 | the latest applying edit's bytes | reactions``,
where the reactions are, by key ascending, ``key length:1 | key | users:2 | user ids:20 each``
(ascending). ``changes_of`` is the one rule (``store.kinds``: ``latest_edit``,
``reactions_of``) applied to a message's shown referrers; a row is kept only where that
changes the message (``store.view_rows`` writes them, ``store.views`` reads them).
Malformed rows are a ``DecodeError``, and no invalid row can be encoded.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from itertools import pairwise

from store.errors import DecodeError
from store.keys import USER_ID_LEN
from store.kinds import MAX_REACTION_KEY, latest_edit, reactions_of
from store.records import MessageKind, MsgV1

Reactions = dict[bytes, tuple[bytes, ...]]  # reaction key -> the users reacting, ascending
Changes = tuple[MsgV1 | None, Reactions]  # the latest applying edit, the reactions

_EDIT_LEN = 4
_U32 = struct.Struct(">I").unpack_from  # the edit's length
_MAX_USERS = 0xFFFF
REACTION = MessageKind.REACTION


def changes_of(target: MsgV1, refs: Iterable[MsgV1]) -> Changes:
    """What ``refs`` (the shown edits and reactions referring to ``target``) change of it:
    ``store.kinds``' rule, as ``fold_chat`` applies it."""
    refs = list(refs)
    return latest_edit(target, refs), reactions_of(r for r in refs if r.kind is REACTION)


def encode_view(edit: MsgV1 | None, reactions: Reactions) -> bytes | None:
    """The row of these changes (None: nothing changed, no row)."""
    if edit is None and not reactions:
        return None
    encoded = b"" if edit is None else edit.encoded
    parts = [len(encoded).to_bytes(_EDIT_LEN, "big"), encoded]
    last = b""
    for key, users in reactions.items():
        if not 1 <= len(key) <= MAX_REACTION_KEY or key <= last:
            raise ValueError("reaction keys are 1..64 bytes, ascending")
        if not 1 <= len(users) <= _MAX_USERS or list(users) != sorted(set(users)):
            raise ValueError("a reaction's users are 1..65535 distinct ids, ascending")
        if any(len(user) != USER_ID_LEN for user in users):
            raise ValueError(f"a user id is {USER_ID_LEN} bytes")
        parts += [bytes([len(key)]), key, len(users).to_bytes(2, "big"), *users]
        last = key
    return b"".join(parts)


def decode_view(row: bytes) -> tuple[bytes | None, Reactions]:
    """(the edit's bytes or None, the reactions) of a row; DecodeError if malformed. The
    edit's bytes are this replica's own (checked when stored): the caller makes them a
    ``StoredMsg``. (A folded page decodes one per changed message: one user a reaction
    key, the common case, is sliced without a loop.)"""
    size = len(row)
    if size < _EDIT_LEN:
        raise DecodeError("a view row is shorter than its edit's length")
    at = _EDIT_LEN + _U32(row)[0]
    if at > size:
        raise DecodeError("a view row's edit runs past its end")
    edit = row[_EDIT_LEN:at] or None
    reactions: Reactions = {}
    last = b""
    while at < size:
        key_len = row[at]
        key_end = at + 1 + key_len
        users_at = key_end + 2
        key = row[at + 1 : key_end]
        if not 1 <= key_len <= MAX_REACTION_KEY or users_at > size or key <= last:
            raise DecodeError("a view row's reaction key is malformed or out of order")
        count = row[key_end] << 8 | row[key_end + 1]
        end = users_at + count * USER_ID_LEN
        if count == 0 or end > size:
            raise DecodeError("a view row's reaction has no users or runs past its end")
        if count == 1:
            users: tuple[bytes, ...] = (row[users_at:end],)
        else:
            users = tuple(row[i : i + USER_ID_LEN] for i in range(users_at, end, USER_ID_LEN))
            if any(a >= b for a, b in pairwise(users)):
                raise DecodeError("a view row's users are not ascending")
        reactions[key] = users
        at, last = end, key
    if edit is None and not reactions:
        raise DecodeError("an empty view row")
    return edit, reactions
