"""Messages: put (idempotent via seen_msg), cursor pagination, sync and retention helpers.

A message lives under ``messages[chat|hlc|seq]`` and is indexed by
``seen_msg[msg_id] = that key``. The seen_msg value therefore holds the packed
HLC at bytes 32..40, which is what retention reads (seed 002).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import Enum

from store.errors import ClockDriftError, InvalidInput
from store.hlc import Hlc
from store.keys import (
    CHAT_ID_LEN,
    MESSAGES_KEY_LEN,
    bucket_prefix,
    check_len,
    decode_cursor,
    encode_cursor,
    extract_hlc_physical_from_seen_value,
    key_messages,
    parse_key_messages,
    prefix_end,
)
from store.merge import meta_after_messages
from store.records import ChatMeta, MsgV1, check_payload_size, decode_msg
from store.rocks import RocksBase

DEFAULT_PAGE_LIMIT = 50
MAX_PAGE_LIMIT = 200


class Direction(Enum):
    BACKWARD = "backward"  # older messages first, from the newest (RFC-0005 default)
    FORWARD = "forward"  # newer messages, oldest first


@dataclass(frozen=True, slots=True)
class PutResult:
    msg_id: bytes
    seq: int  # 0 when the message was a duplicate or expired
    duplicate: bool
    expired: bool = False  # older than the retention cutoff: refused, never stored


@dataclass(frozen=True, slots=True)
class StoredMessage:
    key: bytes
    seq: int
    msg: MsgV1


@dataclass(frozen=True, slots=True)
class RangePage:
    items: list[StoredMessage]
    next_cursor: str | None  # None: no more messages in this direction


def take_until(records: Iterable[bytes | None], max_bytes: int) -> tuple[list[bytes], bool]:
    """The records (None skipped) that fit in ``max_bytes``, and whether any were left over.

    At least one record is taken even if it alone is larger, so a big record is never stuck.
    """
    out: list[bytes] = []
    used = 0
    for record in records:
        if record is None:
            continue
        if out and used + len(record) > max_bytes:
            return out, True
        out.append(record)
        used += len(record)
    return out, False


class MessageStore(RocksBase):
    # Retention cutoff (RETENTION.md): messages with hlc.physical_ms <= this are refused.
    # Set by the GC (store.retention); None keeps everything.
    expire_before_ms: int | None = None
    # --- writes ---

    def put_message(self, msg: MsgV1, *, now_ms: int | None = None) -> PutResult:
        """Store one message; a message already seen is a no-op (``duplicate=True``)."""
        return self.put_messages([msg], now_ms=now_ms)[0]

    def put_messages(self, msgs: Iterable[MsgV1], *, now_ms: int | None = None) -> list[PutResult]:
        """Store many messages in one WriteBatch (messages + seen_msg + chats_meta).

        Every message is checked before anything is written: a payload over the
        limit raises TooLarge and, if ``now_ms`` is given, an HLC more than
        ``max_offset_ms`` ahead raises ClockDriftError. Signatures are verified by
        the ingress (node, sync), not here.
        """
        msgs = list(msgs)
        self._check_messages(msgs, now_ms)
        ids = [msg.msg_id for msg in msgs]
        already = self.multi_get("seen_msg", ids)
        batch = self.new_batch()
        put = batch.put
        messages_cf, seen_cf = self._handle["messages"], self._handle["seen_msg"]
        # Per chat: its stored meta, the last seq given out here, the newest (hlc, id)
        # here. Folded into one ChatMeta per chat at the end (meta_after_messages).
        bases: dict[bytes, ChatMeta] = {}
        seqs: dict[bytes, int] = {}
        newest: dict[bytes, tuple[int, bytes]] = {}
        results: list[PutResult] = []
        new_ids: set[bytes] = set()
        expire = self.expire_before_ms
        for msg, msg_id, seen in zip(msgs, ids, already, strict=True):
            if seen is not None or msg_id in new_ids:
                results.append(PutResult(msg_id, 0, True))
                continue
            if expire is not None and msg.hlc.physical_ms <= expire:
                # GC removed (or would remove) it: storing it again would resurrect it.
                results.append(PutResult(msg_id, 0, True, expired=True))
                continue
            new_ids.add(msg_id)
            chat = msg.chat_id
            seq = seqs.get(chat)
            if seq is None:
                bases[chat] = base = self.load_meta(chat)
                seq = base.last_seq
            seqs[chat] = seq = seq + 1
            stamp = (msg.hlc.pack(), msg_id)
            if chat not in newest or stamp > newest[chat]:
                newest[chat] = stamp
            key = key_messages(chat, stamp[0], seq)
            put(key, msg.encoded, messages_cf)
            put(msg_id, key, seen_cf)
            results.append(PutResult(msg_id, seq, False))
        if seqs:
            metas = {
                chat: meta_after_messages(bases[chat], seq, *newest[chat])
                for chat, seq in seqs.items()
            }
            self.put_metas(batch, metas)
            self.write(batch)
            self.remember_meta(metas)
        return results

    def _check_messages(self, msgs: list[MsgV1], now_ms: int | None) -> None:
        max_payload, max_offset_ms = self.config.max_payload, self.config.max_offset_ms
        for msg in msgs:
            check_payload_size(msg.payload, max_payload)
            if now_ms is not None:
                ahead = msg.hlc.physical_ms - now_ms
                if ahead > max_offset_ms:
                    raise ClockDriftError(
                        f"message HLC is {ahead} ms ahead of local time "
                        f"(max offset {max_offset_ms} ms)"
                    )

    # --- reads ---

    def has_message(self, msg_id: bytes) -> bool:
        return self.get("seen_msg", msg_id) is not None

    def get_message(self, msg_id: bytes) -> MsgV1 | None:
        key = self.get("seen_msg", msg_id)
        if not key:
            return None
        raw = self.get("messages", key)
        return None if raw is None else decode_msg(raw, max_payload=self.config.max_payload)

    def range(
        self,
        chat_id: bytes,
        cursor: str | None = None,
        limit: int = DEFAULT_PAGE_LIMIT,
        direction: Direction = Direction.BACKWARD,
    ) -> RangePage:
        """One page of a chat's history, ordered by (hlc, seq) in ``direction``.

        ``cursor`` is the ``next_cursor`` of the previous page (base64 of the last
        key returned); the page starts strictly after it, so no message is returned
        twice however many messages are inserted between pages.
        """
        check_len(chat_id, CHAT_ID_LEN, "chat_id")
        if not 1 <= limit <= MAX_PAGE_LIMIT:
            raise InvalidInput(
                f"limit must be 1..{MAX_PAGE_LIMIT}, got {limit}", reason="bad_limit"
            )
        start, end = chat_id, prefix_end(chat_id)
        if cursor is not None:
            after = decode_cursor(cursor, MESSAGES_KEY_LEN, chat_id)
            if direction is Direction.FORWARD:
                start = after + b"\x00"  # the smallest key greater than the cursor
            else:
                end = after
        rows = self.iter_range("messages", start, end, reverse=direction is Direction.BACKWARD)
        items: list[StoredMessage] = []
        for key, value in rows:
            if len(items) == limit:
                return RangePage(items, encode_cursor(items[-1].key))
            msg = decode_msg(value, max_payload=self.config.max_payload)
            items.append(StoredMessage(key, parse_key_messages(key)[2], msg))
        return RangePage(items, None)

    # --- sync helpers (seed 002: Merkle rebuild, step 4, step 5) ---

    def iter_msg_ids(self) -> Iterator[tuple[bytes, int]]:
        for msg_id, key in self.iter_all("seen_msg"):
            yield msg_id, extract_hlc_physical_from_seen_value(key) or 0

    def for_each_msg_id(self, callback: Callable[[bytes, int], None]) -> None:
        """Call ``callback(msg_id, hlc.physical_ms)`` for every stored message (Merkle rebuild)."""
        for msg_id, physical_ms in self.iter_msg_ids():
            callback(msg_id, physical_ms)

    def get_bucket_msg_ids(self, bucket: int) -> list[bytes]:
        return [msg_id for msg_id, _ in self.iter_prefix("seen_msg", bucket_prefix(bucket))]

    def get_bucket_msg_ids_filtered(self, bucket: int, cutoff_ts: int) -> list[bytes]:
        """Ids in ``bucket`` newer than ``cutoff_ts`` (the retention soft-filter)."""
        return [
            msg_id
            for msg_id, key in self.iter_prefix("seen_msg", bucket_prefix(bucket))
            if (extract_hlc_physical_from_seen_value(key) or 0) > cutoff_ts
        ]

    def get_messages_cbor_batch(self, ids: list[bytes], max_bytes: int) -> tuple[list[bytes], bool]:
        return self.get_messages_cbor_batch_filtered(ids, max_bytes, None)

    def get_messages_cbor_batch_filtered(
        self, ids: list[bytes], max_bytes: int, cutoff_ts: int | None
    ) -> tuple[list[bytes], bool]:
        """Encoded messages for ``ids`` (unknown or too old skipped) up to ``max_bytes``."""
        return take_until(self.get_messages_cbor_by_ids(ids, cutoff_ts), max_bytes)

    def get_messages_cbor_by_ids(
        self, ids: list[bytes], cutoff_ts: int | None = None
    ) -> list[bytes | None]:
        """Encoded message per id (None: unknown, or not newer than ``cutoff_ts``).

        Two multi-gets: seen_msg for the keys, then messages for the values.
        """
        keys = self.multi_get("seen_msg", ids)
        wanted = [
            key
            if key
            and (cutoff_ts is None or (extract_hlc_physical_from_seen_value(key) or 0) > cutoff_ts)
            else None
            for key in keys
        ]
        present = [key for key in wanted if key is not None]
        values = iter(self.multi_get("messages", present))
        return [None if key is None else next(values) for key in wanted]

    # --- retention helpers ---

    def for_each_chat_id(self, callback: Callable[[bytes], None]) -> None:
        for chat_id, _ in self.iter_all("chats_meta"):
            callback(chat_id)

    def range_delete_old_messages(self, chat_id: bytes, cutoff_ts: int) -> None:
        """One delete_range over every message of ``chat_id`` with hlc.physical_ms <= cutoff_ts."""
        begin = key_messages(chat_id, 0, 0)
        end = key_messages(chat_id, Hlc(cutoff_ts + 1, 0).pack(), 0)
        batch = self.new_batch()
        batch.delete_range(begin, end, self._handle["messages"])
        self.write(batch)

    def scan_seen_msg_aged(self, cutoff_ts: int, limit: int) -> list[bytes]:
        """Up to ``limit`` msg ids whose HLC physical_ms <= cutoff_ts (or unreadable/legacy)."""
        aged: list[bytes] = []
        for msg_id, key in self.iter_all("seen_msg"):
            physical = extract_hlc_physical_from_seen_value(key)
            if physical is None or physical <= cutoff_ts:
                aged.append(msg_id)
                if len(aged) >= limit:
                    break
        return aged

    def delete_seen_msg_batch(self, msg_ids: list[bytes]) -> None:
        batch = self.new_batch()
        for msg_id in msg_ids:
            batch.delete(msg_id, self._handle["seen_msg"])
        self.write(batch)
