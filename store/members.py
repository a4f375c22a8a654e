"""Members: the signed member ops (the MEMBERS sync domain), the rows folded from them, and reads.

The replicated state is the grow-only set of signed, authorized member ops
(``member_ops``, indexed for sync by ``seen_member[op id]``). The member row
(``members``: role, added_at, removed_at) is a local fold of them: every change
joins an op's state into the stored row (``merge_member_states``), and when the
join differs writes the row and the chat's member set in chats_meta — all in the
WriteBatch that stores the ops. ``apply_member_states`` folds unsigned states into
rows only (tests, tools): rows that no op backs are never shipped by sync.

Per (chat, user) the ops' stamps form a ``MemberHistory`` (``store.access``),
cached: it decides which of the user's messages are admitted and shown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

from rocksdict import WriteBatch

from store.access import MemberHistory
from store.authz import ChatProof, DmProof
from store.events import Event, EventKind, EventLog
from store.hlc import Hlc
from store.keys import (
    CHAT_ID_LEN,
    MEMBERS_KEY_LEN,
    bucket_prefix,
    bucket_range_keys,
    check_len,
    key_member_ops,
    key_members,
    parse_key_members,
)
from store.merge import add_op_state, merge_member_states, meta_after_membership, remove_op_state
from store.messages import take_until
from store.metas import Metas
from store.ops import MembershipAction, MembershipOp, decode_membership_op
from store.records import (
    ChatMeta,
    MemberInfo,
    Role,
    decode_member_info,
    member_record_id,
)
from store.rocks import Rocks

HISTORY_CACHE = 1 << 16  # (chat, user) histories kept in memory
_ADD, _REMOVE = b"\x01", b"\x00"  # a member_ops value: this flag, then the op's bytes


@dataclass(frozen=True, slots=True)
class MemberChange:
    """What one member write did to a row (``old_id``/``new_id``: the row's state ids)."""

    chat_id: bytes
    user_id: bytes
    old_id: bytes | None  # row state id before (None: no row existed)
    new_id: bytes  # row state id after (== old_id when nothing changed)
    info: MemberInfo

    @property
    def changed(self) -> bool:
        return self.old_id != self.new_id


@dataclass(frozen=True, slots=True)
class MemberOpsApplied:
    """What ``apply_member_ops`` did: per op whether it was new (``store.plan`` decides what
    the new ops change for messages: what is admitted, shown, erased)."""

    new: list[bool]
    op_ids: list[bytes]
    # (chat, user, active now) for each user who became, or stopped being, an active member
    toggled: list[tuple[bytes, bytes, bool]] = field(default_factory=list)


class Members:
    """The member ops, the rows folded from them, and the (chat, user) histories' cache."""

    def __init__(self, rocks: Rocks, metas: Metas, log: EventLog) -> None:
        self._rocks, self._metas, self._log = rocks, metas, log
        self._handle = rocks.handle
        self._histories: dict[bytes, MemberHistory] = {}  # chat | user -> its ops' stamps

    # --- the replicated ops ---

    def apply_member_ops(self, ops: list[MembershipOp]) -> MemberOpsApplied:
        """Store the ops not held yet, and fold them into the rows — one WriteBatch.

        The ops must be verified and authorized (``MembershipOp.verify``/``authorize``) by
        the ingress; the store trusts them.
        """
        encoded = [op.encode() for op in ops]
        ids = [op.op_id for op in ops]
        held = self._rocks.multi_get("seen_member", ids)
        new: list[bool] = []
        fresh: dict[bytes, tuple[MembershipOp, bytes]] = {}
        for op, data, op_id, seen in zip(ops, encoded, ids, held, strict=True):
            is_new = seen is None and op_id not in fresh
            new.append(is_new)
            if is_new:
                fresh[op_id] = (op, data)
        toggled: list[tuple[bytes, bytes, bool]] = []
        if fresh:
            batch = self._rocks.new_batch()
            ops_cf, seen_cf = self._handle["member_ops"], self._handle["seen_member"]
            events: list[Event] = []
            for op_id, (op, data) in fresh.items():
                key = key_member_ops(op.chat_id, op.user_id, op.hlc.pack(), op_id)
                flag = _ADD if op.action is MembershipAction.ADD else _REMOVE
                batch.put(key, flag + data, ops_cf)
                batch.put(op_id, key, seen_cf)
                events.append((EventKind.MEMBER, key))
            pairs = {(op.chat_id, op.user_id) for op, _ in fresh.values()}
            histories = {pair: self.member_history(*pair) for pair in pairs}
            metas = self._dm_parties([op for op, _ in fresh.values()])
            states = [(op.chat_id, op.user_id, op.state()) for op, _ in fresh.values()]
            self._fold_rows(states, batch, metas, toggled, events)
            # written: the cached histories grow by the new ops (the next message reads them)
            for op, _ in fresh.values():
                pair = (op.chat_id, op.user_id)
                histories[pair] = histories[pair].with_op(op.hlc, op.action is MembershipAction.ADD)
            for (chat, user), history in histories.items():
                self._cache_history(chat + user, history)
        return MemberOpsApplied(new, ids, toggled)

    def _dm_parties(self, ops: list[MembershipOp]) -> dict[bytes, ChatMeta]:
        """ChatMeta.identity := the two parties, for DM chats not known to be DMs yet."""
        metas: dict[bytes, ChatMeta] = {}
        for op in ops:
            proof = op.proof
            if isinstance(proof, DmProof) and op.chat_id not in metas:
                meta = self._metas.load(op.chat_id)
                if meta.identity is None:
                    metas[op.chat_id] = _with_identity(meta, proof.parties())
        return metas

    def member_history(self, chat_id: bytes, user_id: bytes) -> MemberHistory:
        """The stamps of the (chat, user)'s ops (cached; the writer keeps the cache true)."""
        pair = key_members(chat_id, user_id)
        history = self._histories.get(pair)
        if history is None:
            history = MemberHistory.of(
                (Hlc.unpack(int.from_bytes(key[MEMBERS_KEY_LEN : MEMBERS_KEY_LEN + 8], "big")),
                 value[:1] == _ADD)
                for key, value in self._rocks.iter_prefix("member_ops", pair)
            )  # fmt: skip
            self._cache_history(pair, history)
        return history

    def forget_histories(self) -> None:
        """Drop the cache (a write that carried its changes failed)."""
        self._histories.clear()

    def _cache_history(self, pair: bytes, history: MemberHistory) -> None:
        if len(self._histories) >= HISTORY_CACHE:
            self._histories.clear()
        self._histories[pair] = history

    def chat_proof(self, chat_id: bytes) -> ChatProof | None:
        """Who controls the chat, from any of its ops (None: this replica holds none)."""
        for _, value in self._rocks.iter_prefix(
            "member_ops", check_len(chat_id, CHAT_ID_LEN, "chat_id")
        ):
            return decode_membership_op(value[1:]).proof
        return None

    def member_ops_of(self, chat_id: bytes, user_id: bytes) -> list[MembershipOp]:
        return [
            decode_membership_op(value[1:])
            for _, value in self._rocks.iter_prefix("member_ops", key_members(chat_id, user_id))
        ]

    # --- rows (local folds) ---

    def add_member_synced(
        self, chat_id: bytes, user_id: bytes, role: Role, hlc: Hlc
    ) -> MemberChange:
        """Add under the CRDT: advances added_at, keeps any removed_at (an unsigned row)."""
        return self.apply_member_states([(chat_id, user_id, add_op_state(role, hlc))])[0]

    def remove_member_synced(self, chat_id: bytes, user_id: bytes, hlc: Hlc) -> MemberChange:
        """Remove under the CRDT: advances removed_at, never deletes the row (unsigned)."""
        return self.apply_member_states([(chat_id, user_id, remove_op_state(hlc))])[0]

    def apply_member_record_synced(
        self, chat_id: bytes, user_id: bytes, info: MemberInfo
    ) -> MemberChange:
        """Merge a full MemberInfo into the row."""
        return self.apply_member_states([(chat_id, user_id, info)])[0]

    def apply_member_states(
        self, updates: Iterable[tuple[bytes, bytes, MemberInfo]]
    ) -> list[MemberChange]:
        """Join many incoming states into the rows in one WriteBatch; one change per update."""
        batch = self._rocks.new_batch()
        changes = self._fold_rows(list(updates), batch, {})
        return changes

    def _fold_rows(
        self,
        updates: list[tuple[bytes, bytes, MemberInfo]],
        batch: WriteBatch,
        metas: dict[bytes, ChatMeta],
        toggled: list[tuple[bytes, bytes, bool]] | None = None,
        events: list[Event] | None = None,
    ) -> list[MemberChange]:
        """Join ``updates`` into the rows, add the writes to ``batch`` (with ``metas``, which
        it updates), and write it; ``toggled`` gets (chat, user, active) for each user who
        became or stopped being active; ``events``: to log with it (store.events)."""
        keys = [key_members(chat, user) for chat, user, _ in updates]
        current: dict[bytes, MemberInfo | None] = {}
        for key, raw in zip(keys, self._rocks.multi_get("members", keys), strict=True):
            current.setdefault(key, None if raw is None else decode_member_info(raw))
        stored = dict(current)  # as on disk
        changes: list[MemberChange] = []
        for key, (chat, user, incoming) in zip(keys, updates, strict=True):
            before = current[key]
            after = merge_member_states(before, incoming)
            assert after is not None
            current[key] = after
            old_id = None if before is None else _state_id(chat, user, before)
            changes.append(MemberChange(chat, user, old_id, _state_id(chat, user, after), after))
        members_cf = self._handle["members"]
        for key, after in current.items():
            before = stored[key]
            if after is None or after == before:
                continue
            chat, user = parse_key_members(key)
            batch.put(key, after.encode(), members_cf)
            was_active = before is not None and before.active
            if was_active != after.active:
                meta = metas.get(chat) or self._metas.load(chat)
                metas[chat] = meta_after_membership(meta, user, after.active)
                if toggled is not None:
                    toggled.append((chat, user, after.active))
        if batch.len() == 0:
            return changes
        self._metas.put(batch, metas)
        self._log.write(batch, events or ())
        self._metas.remember(metas)
        return changes

    # --- reads (active-only unless named *_record) ---
    def get_member_record(self, chat_id: bytes, user_id: bytes) -> MemberInfo | None:
        """The raw CRDT row, tombstoned or not."""
        raw = self._rocks.get("members", key_members(chat_id, user_id))
        return None if raw is None else decode_member_info(raw)

    def get_member_info(self, chat_id: bytes, user_id: bytes) -> MemberInfo | None:
        info = self.get_member_record(chat_id, user_id)
        return info if info is not None and info.active else None

    def is_member(self, chat_id: bytes, user_id: bytes) -> bool:
        return self.get_member_info(chat_id, user_id) is not None

    def list_members_with_info(self, chat_id: bytes) -> list[tuple[bytes, MemberInfo]]:
        check_len(chat_id, CHAT_ID_LEN, "chat_id")
        out = []
        for key, raw in self._rocks.iter_prefix("members", chat_id):
            info = decode_member_info(raw)
            if info.active:
                out.append((key[CHAT_ID_LEN:], info))
        return out

    def list_members(self, chat_id: bytes) -> list[bytes]:
        return [user for user, _ in self.list_members_with_info(chat_id)]

    def iter_member_rows(self) -> Iterator[tuple[bytes, bytes, bool]]:
        """(chat, user, active) of every member row: what a ``--scope auto`` node reads to
        know its served users' chats (``sync.serving``)."""
        for key, raw in self._rocks.iter_all("members"):
            yield key[:CHAT_ID_LEN], key[CHAT_ID_LEN:], decode_member_info(raw).active

    # --- sync helpers: the MEMBERS domain is the set of op ids ---

    def iter_member_record_ids(self) -> Iterator[bytes]:
        for record_id, _ in self._rocks.iter_all("seen_member"):
            yield record_id

    def for_each_member_record_id(self, callback: Callable[[bytes], None]) -> None:
        for record_id in self.iter_member_record_ids():
            callback(record_id)

    def chats_of_ops(self, ids: list[bytes]) -> list[bytes | None]:
        """The chat of each op id (None: not held): its key starts with it."""
        return [
            None if k is None else k[:CHAT_ID_LEN]
            for k in self._rocks.multi_get("seen_member", ids)
        ]

    def iter_op_chats(self) -> Iterator[tuple[bytes, bytes]]:
        """(op id, chat) of every op held (what a scope's check and per-shard trees read)."""
        for op_id, key in self._rocks.iter_all("seen_member"):
            yield op_id, key[:CHAT_ID_LEN]

    def get_range_member_ids(self, start: int, end: int) -> list[bytes]:
        return self._rocks.range_keys("seen_member", *bucket_range_keys(start, end))

    def get_bucket_member_ids(self, bucket: int) -> list[bytes]:
        return [rid for rid, _ in self._rocks.iter_prefix("seen_member", bucket_prefix(bucket))]

    def get_member_records_batch(
        self, ids: list[bytes], max_bytes: int
    ) -> tuple[list[bytes], bool]:
        """Encoded ops for the ``ids`` held here, up to ``max_bytes``."""
        return take_until(self.get_member_records_by_ids(ids), max_bytes)

    def get_member_records_by_ids(self, ids: list[bytes]) -> list[bytes | None]:
        """The encoded op per op id (None: not held)."""
        keys = self._rocks.multi_get("seen_member", ids)
        present = [key for key in keys if key]
        values = iter(self._rocks.multi_get("member_ops", present))
        out: list[bytes | None] = []
        for key in keys:
            value = next(values) if key else None
            out.append(None if value is None else value[1:])
        return out


def _state_id(chat_id: bytes, user_id: bytes, info: MemberInfo) -> bytes:
    """An id of a row's state (tells whether a fold changed it; rows are not synced)."""
    return member_record_id(chat_id, user_id, info)


def _with_identity(meta: ChatMeta, identity: bytes) -> ChatMeta:
    return replace(meta, identity=identity)
