"""The member index: signed member ops kept by the user they name (sync's INDEX domain).

A scoped node holds the member ops of its own chats only; to learn which chats its served
users are in it holds the ops naming them, whatever their chat, sharded by user
(docs/design/member-scopes.md). The ops are the MEMBERS domain's, verified and authorized
by the ingress as those are (authorization is a function of the op and its chat id alone),
and the store trusts them.

Column family ``member_index``: op id -> subject user id | the op's bytes. Keyed by the op
id, so a sync bucket is a prefix scan and a range of buckets one range scan; the user in
front lets a scope's check and a served user's rows skip the decode of other users' ops.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from store.errors import DecodeError
from store.keys import USER_ID_LEN, bucket_prefix, bucket_range_keys
from store.merge import merge_member_states
from store.ops import MembershipOp, decode_membership_op
from store.records import MemberInfo
from store.rocks import Rocks

CF = "member_index"


class MemberIndex:
    def __init__(self, rocks: Rocks) -> None:
        self._rocks = rocks

    def put(self, ops: list[MembershipOp]) -> tuple[list[bool], list[bytes]]:
        """Store the ops not held yet, in one WriteBatch: per op whether it was new, and
        each op's id."""
        encoded = [op.encode() for op in ops]
        ids = [op.op_id for op in ops]
        held = self._rocks.multi_get(CF, ids)
        new, fresh = [], set()
        batch = self._rocks.new_batch()
        handle = self._rocks.handle[CF]
        for op, data, op_id, seen in zip(ops, encoded, ids, held, strict=True):
            is_new = seen is None and op_id not in fresh
            new.append(is_new)
            if is_new:
                fresh.add(op_id)
                batch.put(op_id, op.user_id + data, handle)
        if fresh:
            self._rocks.write(batch)
        return new, ids

    def bucket_ids(self, bucket: int) -> list[bytes]:
        return [i for i, _ in self._rocks.iter_prefix(CF, bucket_prefix(bucket))]

    def range_ids(self, start: int, end: int) -> list[bytes]:
        return self._rocks.range_keys(CF, *bucket_range_keys(start, end))

    def records_by_ids(self, ids: list[bytes]) -> list[bytes | None]:
        """The encoded op per op id (None: not held)."""
        return [None if v is None else _op(v) for v in self._rocks.multi_get(CF, ids)]

    def users_of(self, ids: list[bytes]) -> list[bytes | None]:
        return [None if v is None else _user(v) for v in self._rocks.multi_get(CF, ids)]

    def iter_users(self) -> Iterator[tuple[bytes, bytes]]:
        """(op id, the user it names) of every op held."""
        for op_id, value in self._rocks.iter_all(CF):
            yield op_id, _user(value)

    def rows_of(self, users: Iterable[bytes] | None) -> Iterator[tuple[bytes, bytes, bool]]:
        """(chat, user, active) of each (chat, user) row the ops naming ``users`` (None:
        every user) fold to — the row a holder of the chat folds, as it folds the same ops
        (``sync.serving``)."""
        wanted = None if users is None else set(users)
        rows: dict[tuple[bytes, bytes], MemberInfo] = {}
        for _, value in self._rocks.iter_all(CF):
            if wanted is not None and _user(value) not in wanted:
                continue
            op = decode_membership_op(_op(value))
            key = (op.chat_id, op.user_id)
            merged = merge_member_states(rows.get(key), op.state())
            assert merged is not None
            rows[key] = merged
        for (chat, user), info in rows.items():
            yield chat, user, info.active

    def indexed_members(self, chat: bytes) -> list[bytes]:
        """The users the index folds to active members of ``chat`` (those it indexes)."""
        return [user for c, user, active in self.rows_of(None) if c == chat and active]


def _user(value: bytes) -> bytes:
    _check_row(value)
    return value[:USER_ID_LEN]


def _op(value: bytes) -> bytes:
    _check_row(value)
    return value[USER_ID_LEN:]


def _check_row(value: bytes) -> None:
    if len(value) <= USER_ID_LEN:
        raise DecodeError(f"a member-index row of {len(value)} bytes: no op after its user")
