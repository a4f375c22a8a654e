"""Members: the (chat, user) CRDT rows, their seen_member sync index, and reads that hide tombstones.

Every change goes through one path, ``apply_member_states``: read the stored
row, join it with the incoming state (``merge_member_states``), and if the
join differs write — in one WriteBatch — the row, the seen_member index
(old record id out, new one in) and the chat's member set in chats_meta.
Add, Remove and a full record from sync are just different incoming states,
so every replica that sees the same ops ends with the same rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from store.authz import ChatProof
from store.hlc import Hlc
from store.keys import CHAT_ID_LEN, bucket_prefix, check_len, key_members, parse_key_members
from store.merge import add_op_state, merge_member_states, meta_after_membership, remove_op_state
from store.messages import take_until
from store.ops import decode_membership_op
from store.records import (
    ChatMeta,
    MemberInfo,
    MemberRecord,
    Role,
    decode_member_info,
    member_record_id,
)
from store.rocks import RocksBase


@dataclass(frozen=True, slots=True)
class MemberChange:
    """What one member write did; ``old_id``/``new_id`` drive the Merkle Replace/Insert."""

    chat_id: bytes
    user_id: bytes
    old_id: bytes | None  # record id before (None: no row existed)
    new_id: bytes  # record id after (== old_id when nothing changed)
    info: MemberInfo

    @property
    def changed(self) -> bool:
        return self.old_id != self.new_id


_record_id = member_record_id


class MemberStore(RocksBase):
    # --- writes (all CRDT, all indexed for sync) ---

    def add_member_synced(
        self, chat_id: bytes, user_id: bytes, role: Role, hlc: Hlc
    ) -> MemberChange:
        """Add under the CRDT: advances added_at, keeps any removed_at."""
        return self.apply_member_states([(chat_id, user_id, add_op_state(role, hlc))])[0]

    def remove_member_synced(self, chat_id: bytes, user_id: bytes, hlc: Hlc) -> MemberChange:
        """Remove under the CRDT: advances removed_at, never deletes the row."""
        return self.apply_member_states([(chat_id, user_id, remove_op_state(hlc))])[0]

    def apply_member_record_synced(
        self, chat_id: bytes, user_id: bytes, info: MemberInfo
    ) -> MemberChange:
        """Merge a full MemberInfo received from anti-entropy sync."""
        return self.apply_member_states([(chat_id, user_id, info)])[0]

    def apply_member_states(
        self, updates: Iterable[tuple[bytes, bytes, MemberInfo]]
    ) -> list[MemberChange]:
        """Join many incoming states into the store in one WriteBatch; one change per update."""
        updates = list(updates)
        keys = [key_members(chat, user) for chat, user, _ in updates]
        current: dict[bytes, MemberInfo | None] = {}
        for key, raw in zip(keys, self.multi_get("members", keys), strict=True):
            current.setdefault(key, None if raw is None else decode_member_info(raw))
        stored = dict(current)  # as on disk, to find the ids to retire
        changes: list[MemberChange] = []
        for key, (chat, user, incoming) in zip(keys, updates, strict=True):
            before = current[key]
            after = merge_member_states(before, incoming)
            assert after is not None
            current[key] = after
            old_id = None if before is None else _record_id(chat, user, before)
            changes.append(MemberChange(chat, user, old_id, _record_id(chat, user, after), after))
        self._write_member_rows(stored, current)
        return changes

    def _write_member_rows(
        self, stored: dict[bytes, MemberInfo | None], current: dict[bytes, MemberInfo | None]
    ) -> None:
        batch = self.new_batch()
        metas: dict[bytes, ChatMeta] = {}
        members_cf, seen_cf = self._handle["members"], self._handle["seen_member"]
        for key, after in current.items():
            before = stored[key]
            if after is None or after == before:
                continue
            chat, user = parse_key_members(key)
            if before is not None:
                batch.delete(_record_id(chat, user, before), seen_cf)
            batch.put(key, after.encode(), members_cf)
            batch.put(_record_id(chat, user, after), key, seen_cf)
            was_active = before is not None and before.active
            if was_active != after.active:
                meta = metas.get(chat) or self.load_meta(chat)
                metas[chat] = meta_after_membership(meta, user, after.active)
        if batch.len() == 0:
            return
        self.put_metas(batch, metas)
        self.write(batch)
        self.remember_meta(metas)

    # --- reads (active-only unless named *_record) ---

    def get_member_record(self, chat_id: bytes, user_id: bytes) -> MemberInfo | None:
        """The raw CRDT row, tombstoned or not."""
        raw = self.get("members", key_members(chat_id, user_id))
        return None if raw is None else decode_member_info(raw)

    def get_member_info(self, chat_id: bytes, user_id: bytes) -> MemberInfo | None:
        info = self.get_member_record(chat_id, user_id)
        return info if info is not None and info.active else None

    def is_member(self, chat_id: bytes, user_id: bytes) -> bool:
        return self.get_member_info(chat_id, user_id) is not None

    def list_members_with_info(self, chat_id: bytes) -> list[tuple[bytes, MemberInfo]]:
        check_len(chat_id, CHAT_ID_LEN, "chat_id")
        out = []
        for key, raw in self.iter_prefix("members", chat_id):
            info = decode_member_info(raw)
            if info.active:
                out.append((key[CHAT_ID_LEN:], info))
        return out

    def list_members(self, chat_id: bytes) -> list[bytes]:
        return [user for user, _ in self.list_members_with_info(chat_id)]

    def chat_proof(self, chat_id: bytes) -> ChatProof | None:
        """Who controls the chat: the proof its member ops carry (None: no signed op here).

        Every authorized op of a chat carries the same proof (it derives the chat id), so
        the first row with a signed op answers; unsigned rows (tests, admin tooling) are skipped.
        """
        check_len(chat_id, CHAT_ID_LEN, "chat_id")
        for _, raw in self.iter_prefix("members", chat_id):
            info = decode_member_info(raw)
            for signed in (info.add_proof, info.remove_proof):
                if signed is None:
                    continue
                proof = decode_membership_op(signed).proof
                if proof is not None and proof.chat_id() == chat_id:
                    return proof
        return None

    # --- sync helpers ---

    def iter_member_record_ids(self) -> Iterator[bytes]:
        for record_id, _ in self.iter_all("seen_member"):
            yield record_id

    def for_each_member_record_id(self, callback: Callable[[bytes], None]) -> None:
        for record_id in self.iter_member_record_ids():
            callback(record_id)

    def get_bucket_member_ids(self, bucket: int) -> list[bytes]:
        return [rid for rid, _ in self.iter_prefix("seen_member", bucket_prefix(bucket))]

    def get_member_records_batch(
        self, ids: list[bytes], max_bytes: int
    ) -> tuple[list[bytes], bool]:
        """Encoded MemberRecords for ``ids`` that are still current, up to ``max_bytes``."""
        return take_until(self.get_member_records_by_ids(ids), max_bytes)

    def get_member_records_by_ids(self, ids: list[bytes]) -> list[bytes | None]:
        """Encoded MemberRecord per record id (None: not a current record id)."""
        keys = self.multi_get("seen_member", ids)
        present = [key for key in keys if key]
        rows = iter(self.multi_get("members", present))
        out: list[bytes | None] = []
        for key in keys:
            raw = next(rows) if key else None
            if key and raw is not None:
                chat, user = parse_key_members(key)
                out.append(MemberRecord(chat, user, decode_member_info(raw)).encode())
            else:
                out.append(None)
        return out
