"""Messages: put (idempotent via seen_msg), cursor pagination, sync and retention helpers.

A message lives under ``messages[chat|hlc|seq]`` and is indexed by
``seen_msg[msg_id] = that key`` (a shown message's then its event position: written with
its event, ``store.events``). The seen_msg value therefore holds the packed HLC at bytes
32..40, which is what retention reads (seed 002).

``put_messages`` builds a batch of ``COLUMNS_FROM`` or more new messages that refer to none
(most batches) a column at a time (``_put_new_standalone``: comprehensions and ``map``, no
Python statement per message); anything else goes through the general loop. Both write the
same rows (tests/store/test_put_columns.py).

``Messages`` is given the RocksDB plumbing, the chats' metas, the event log (a shown message
is logged in the batch that stores it) and the hidden index. It binds their methods once
(``_load_meta``, ``_write``, ...): the put loops call them per chat and per batch as the
mixin class called its own methods, with no extra attribute hop.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cache
from itertools import compress, count, islice, repeat
from operator import itemgetter
from typing import Any, NamedTuple

from rocksdict import WriteBatch

from store.errors import ClockDriftError, InvalidInput
from store.events import Event, EventKind, EventLog, ShownRun
from store.hidden import Hidden
from store.hlc import LOGICAL_BITS, MAX_PHYSICAL, Hlc
from store.keys import (
    CHAT_ID_LEN,
    MESSAGES_KEY_LEN,
    U32_MAX,
    U64_MAX,
    bucket_prefix,
    bucket_range_keys,
    check_len,
    decode_cursor,
    encode_cursor,
    extract_hlc_physical_from_seen_value,
    key_hidden,
    key_messages,
    key_receipt,
    parse_key_messages,
    prefix_end,
    seq_of,
)
from store.kinds import CHANGES_TARGET, CONTENT, position_of
from store.merge import meta_after_messages
from store.metas import Metas
from store.records import (
    KIND_AT,
    STAMP_AT,
    ChatMeta,
    MessageKind,
    MsgV1,
    StoredMsg,
    check_payload_size,
    decode_msg,
    set_stored,
    stored_msg,
)
from store.rocks import Rocks
from store.unread import UnreadCounters
from store.unread_counter import Shown
from store.view_rows import Added, ViewRows

MESSAGE = EventKind.MESSAGE
NEW, KEYS = MessageKind.NEW, MessageKind.KEYS
REPLY = MessageKind.REPLY.value
READ_RECEIPT = MessageKind.READ_RECEIPT
DEFAULT_PAGE_LIMIT = 50
# put_messages builds a batch a column at a time from this many messages (_put_new_standalone):
# below, its lists, sort and maps cost about what the general loop saves, or more (batches of
# 1, 2, 4 on a loaded machine: 77-92, 43-60, 34-42 us a message against the loop's 43-71,
# 42-43, 28-33; from 64 on the columns were ahead)
COLUMNS_FROM = 32
MAX_PAGE_LIMIT = 200


class Direction(Enum):
    BACKWARD = "backward"  # older messages first, from the newest (RFC-0005 default)
    FORWARD = "forward"  # newer messages, oldest first


class PutResult(NamedTuple):
    """What ``put_message(s)`` did with a message. A tuple (immutable, as the frozen dataclass
    it was): a batch makes one per message, and ``tuple.__new__`` through ``map`` builds them
    in C, where setting a dataclass's four slots took five calls a message."""

    msg_id: bytes
    seq: int  # 0 when the message was a duplicate or expired
    duplicate: bool
    expired: bool = False  # older than the retention cutoff: refused, never stored


_new = object.__new__
_new_tuple = tuple.__new__
_PACK_KEY = struct.Struct(f">{CHAT_ID_LEN}sQI").pack  # chat | packed HLC | seq: key_messages
_SINK: deque[object] = deque(maxlen=0)
_consume = _SINK.extend  # runs an iterator (of puts) to its end, keeping nothing


def _put_result(msg_id: bytes, seq: int, duplicate: bool, expired: bool = False) -> PutResult:
    """``PutResult(msg_id, seq, duplicate, expired)`` without the NamedTuple's Python-level
    ``__new__`` (tests/store/test_fast_codecs.py: equal)."""
    return _new_tuple(PutResult, (msg_id, seq, duplicate, expired))


def _shown(msg: MsgV1, packed: int) -> Shown:
    """What the unread counters need of a message shown now (``store.unread_counter``)."""
    position = position_of(msg) if msg.kind is READ_RECEIPT else None
    return packed, msg.sender, msg.kind in CONTENT, None if position is None else position.pack()


def _referred_value(target: bytes, referrer: bytes, encoded: bytes) -> bytes:
    """A ``referred`` row's value: the referrer's bytes when its key sorts after its target's
    (as every applying edit's does). Such a referrer expires no earlier than its target, and
    the retention trim deletes the rows of expired targets, so the copy never outlives its
    message; erasure deletes the row with the message. Else empty: a page reads the
    referrer from ``messages``, where it may have expired first."""
    return encoded if referrer > target else b""


class StoredMessage(NamedTuple):
    """A message of a history page. A tuple: ``range`` makes one per row with
    ``tuple.__new__``, the cheapest object Python makes."""

    key: bytes
    seq: int
    msg: MsgV1


# a messages key's seq (its last 4 bytes): one C call, a third less than int.from_bytes of a
# slice, per row of a page
_SEQ_OF_KEY = struct.Struct(">I").unpack_from
_SEQ_AT = MESSAGES_KEY_LEN - 4
_KEY, _VALUE = itemgetter(0), itemgetter(1)  # of a (key, value) row
_KIND_INTS: dict[frozenset[int], frozenset[int]] = {
    CONTENT: frozenset(int(kind) for kind in CONTENT)
}  # kinds -> their kind bytes


@dataclass(frozen=True, slots=True)
class RangePage:
    items: list[StoredMessage]
    next_cursor: str | None  # None: no more messages in this direction


def check_page_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_PAGE_LIMIT:
        raise InvalidInput(f"limit must be 1..{MAX_PAGE_LIMIT}, got {limit}", reason="bad_limit")


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


def _page_if_full(
    items: list[StoredMessage], limit: int, replies: list[int] | None
) -> RangePage | None:
    """The page, once ``items`` holds ``limit`` and the one more that says there are more."""
    if len(items) <= limit:
        return None
    items.pop()
    if replies and replies[-1] == limit:
        replies.pop()
    return RangePage(items, encode_cursor(items[-1].key))


def _take(
    rows: Iterator[tuple[bytes, bytes]], n: int, start: bytes, backward: bool
) -> tuple[list[tuple[bytes, bytes]], bool]:
    """Up to ``n`` of a page's ``rows``, pulled by ``islice`` in C (a loop checking each row
    was a fifth of a page), none below ``start`` (a reverse scan has no lower bound: it runs
    into the chat before); and whether the scan is done (fewer than ``n`` were left)."""
    chunk = list(islice(rows, n))
    done = len(chunk) < n
    while backward and chunk and chunk[-1][0] < start:
        chunk.pop()
        done = True
    return chunk, done


def _items(rows: list[tuple[bytes, bytes]]) -> list[StoredMessage]:
    """A page's items from its rows, a column at a time by ``map`` in C, not a Python loop
    (py-spy: the loop was ~28 % of a history page; walks alternating with it, loaded
    machine: 0.97-0.98 of its time): each value a ``StoredMsg`` (our own rows: decoded when
    a field is read), the page's seqs read by one ``struct`` call. A key of another length
    than a messages key raises, as ``parse_key_messages``."""
    if not rows:
        return []
    keys = list(map(_KEY, rows))
    joined = b"".join(keys)
    n = len(keys)
    if len(joined) != n * MESSAGES_KEY_LEN or len(set(map(len, keys))) != 1:
        for key in keys:
            parse_key_messages(key)  # raises: not a messages key
    msgs = list(map(_new, repeat(StoredMsg, n)))
    _consume(map(set_stored, msgs, map(_VALUE, rows)))
    return list(
        map(_new_tuple, repeat(StoredMessage), zip(keys, _seqs_of(n)(joined), msgs, strict=True))
    )


@cache
def _seqs_of(n: int) -> Callable[[bytes], tuple[int, ...]]:
    """Unpacks the seqs of ``n`` messages keys joined (each key's last 4 bytes)."""
    return struct.Struct(">" + f"{_SEQ_AT}xI" * n).unpack


class Messages:
    """The messages, their sync index and the indexes of what refers to what. Its setting:
    the retention cutoff (``expire_before_ms``), which the GC moves (``store.retention``)."""

    def __init__(
        self,
        rocks: Rocks,
        metas: Metas,
        log: EventLog,
        hidden: Hidden,
        unread: UnreadCounters,
        views: ViewRows,
    ) -> None:
        self.config = rocks.config
        self._rocks, self._hidden, self._unread, self._views = rocks, hidden, unread, views
        self._cf, self._handle = rocks.cf, rocks.handle  # the dicts themselves: emptied by close
        self._get, self._multi_get = rocks.get, rocks.multi_get
        self._iter_prefix, self._iter_all = rocks.iter_prefix, rocks.iter_all
        self._load_meta, self._put_metas = metas.load, metas.put
        self._remember_meta, self._remember_one_meta = metas.remember, metas.remember_one
        self._write, self._write_shown = log.write, log.write_shown
        self._write_one_shown = log.write_one_shown
        # Retention cutoff (RETENTION.md): messages with hlc.physical_ms <= this are refused.
        # Set by the GC (store.retention); None keeps everything.
        self.expire_before_ms: int | None = None

    # --- writes ---

    def put_message(self, msg: MsgV1, *, now_ms: int | None = None) -> PutResult:
        """Store one message; a message already seen is a no-op (``duplicate=True``).

        Exactly ``put_messages([msg], now_ms=now_ms)[0]`` — the same checks, the same puts
        in one WriteBatch — without the per-batch lists, dicts and sets.
        """
        if now_ms is not None or len(msg.payload) > self.config.max_payload:
            self._check_message(msg, now_ms)
        msg_id = msg.msg_id
        if self._cf["seen_msg"].get(msg_id) is not None:
            return _put_result(msg_id, 0, True)
        hlc = msg.hlc
        expire = self.expire_before_ms
        if expire is not None and hlc.physical_ms <= expire:
            return _put_result(msg_id, 0, True, True)
        chat = msg.chat_id
        base = self._load_meta(chat)
        seq = base.last_seq + 1
        packed = hlc.physical_ms << LOGICAL_BITS | hlc.logical  # = hlc.pack(), inlined
        if (
            type(chat) is bytes
            and len(chat) == CHAT_ID_LEN
            and 0 <= packed <= U64_MAX
            and seq <= U32_MAX
        ):
            key = chat + (packed << 32 | seq).to_bytes(12, "big")  # = key_messages(...)
        else:
            key = key_messages(chat, packed, seq)  # converts, or raises the ValueError
        kind, ref = msg.kind, msg.ref
        content = kind in CONTENT
        newest = packed if content else -1  # the preview: content only (MESSAGES.md)
        meta = meta_after_messages(base, seq, newest, msg_id)
        handle = self._handle
        batch = self._rocks.new_batch()
        batch.put(key, msg.encoded, handle["messages"])
        batch.put(chat, meta.encode(), handle["chats_meta"])
        if ref is not None:
            self._index_ref(msg, msg_id, key, seq, batch)
        if content:  # (a reply too: it refers, and may be referred to)
            if self._get("ref_targets", msg_id) is not None:  # referred to before it arrived
                self._mark_referred_split(batch, {msg_id: key}, [msg], [])
        elif ref is not None and kind in CHANGES_TARGET:
            self._mark_referred_split(batch, {msg_id: key}, [], [(msg, ref)])
        counted = None
        if self._unread.of_chat(chat) is not None:
            counted = self._unread.follow(batch, {chat: [_shown(msg, packed)]})
        self._write_one_shown(batch, key, msg_id)  # and seen_msg (store.events)
        self._remember_one_meta(chat, meta)
        if counted:
            self._unread.remember(counted)
        return _new_tuple(PutResult, (msg_id, seq, False, False))  # = _put_result(...)

    def put_messages(
        self,
        msgs: Iterable[MsgV1],
        *,
        now_ms: int | None = None,
        hidden: frozenset[bytes] | set[bytes] = frozenset(),
        erased: frozenset[bytes] | set[bytes] = frozenset(),
    ) -> list[PutResult]:
        """Store many messages in one WriteBatch: messages + seen_msg per message, chats_meta
        per chat, one events row (``store.events``). ``erased``: messages keys the same
        shared batch erases (``Deletes.write_deletes``, in ``one_write``) — still in the
        store for this write's reads, so the view rows leave them out by name.

        Every message is checked before anything is written: a payload over the
        limit raises TooLarge and, if ``now_ms`` is given, an HLC more than
        ``max_offset_ms`` ahead raises ClockDriftError. Signatures are verified by
        the ingress (node, sync), not here; so is who may post (``store.admission``
        decides, and names in ``hidden`` the ids of messages to store but not show).
        """
        msgs = list(msgs)
        max_payload = self.config.max_payload
        for msg in msgs:
            if len(msg.payload) > max_payload or now_ms is not None:
                self._check_message(msg, now_ms)
        ids = [msg.msg_id for msg in msgs]
        already = self._multi_get("seen_msg", ids)
        if (
            len(msgs) >= COLUMNS_FROM
            and not hidden
            and not erased
            and already.count(None) == len(msgs)
        ):
            plain = self._put_new_standalone(msgs, ids)
            if plain is not None:
                return plain
        batch = self._rocks.new_batch()
        put = batch.put
        messages_cf, seen_cf = self._handle["messages"], self._handle["seen_msg"]
        # Per chat: its stored meta, and [last seq given out here, newest (hlc, id) here,
        # key prefix]. Folded into one ChatMeta per chat at the end (meta_after_messages).
        bases: dict[bytes, ChatMeta] = {}
        chats: dict[bytes, list[Any]] = {}
        results: list[PutResult] = []
        append = results.append
        new_keys: dict[bytes, bytes] = {}  # id -> messages key, of the messages stored here
        contents: list[MsgV1] = []  # the content stored here
        referrers: list[tuple[MsgV1, bytes]] = []  # the edits and reactions, with their refs
        hidden_keys: list[bytes] = []
        events: list[Event] = []  # the shown ones, for this node's event log
        expire = self.expire_before_ms
        unread_of = self._unread.of_chat
        for msg, msg_id, seen in zip(msgs, ids, already, strict=True):
            if seen is not None or msg_id in new_keys:
                append(_put_result(msg_id, 0, True))
                continue
            hlc = msg.hlc
            if expire is not None and hlc.physical_ms <= expire:
                # GC removed (or would remove) it: storing it again would resurrect it.
                append(_put_result(msg_id, 0, True, True))
                continue
            chat = msg.chat_id
            state = chats.get(chat)
            if state is None:
                bases[chat] = base = self._load_meta(chat)
                prefix = chat if type(chat) is bytes and len(chat) == CHAT_ID_LEN else None
                counted: list[Shown] | None = [] if unread_of(chat) is not None else None
                chats[chat] = state = [base.last_seq, -1, b"", prefix, counted]
            state[0] = seq = state[0] + 1
            packed = hlc.physical_ms << LOGICAL_BITS | hlc.logical  # = hlc.pack(), inlined
            prefix = state[3]
            if prefix is not None and 0 <= packed <= U64_MAX and seq <= U32_MAX:
                key = prefix + (packed << 32 | seq).to_bytes(12, "big")  # = key_messages(...)
            else:
                key = key_messages(chat, packed, seq)  # converts, or raises the ValueError
            kind, ref = msg.kind, msg.ref
            content = kind in CONTENT
            if content:
                contents.append(msg)
            elif ref is not None and kind in CHANGES_TARGET:
                referrers.append((msg, ref))
            if hidden and msg_id in hidden:
                hidden_keys.append(key_hidden(chat, seq))
                put(hidden_keys[-1], key, self._handle["hidden"])
                put(msg_id, key, seen_cf)  # (a shown one's, with its event: store.events)
            else:
                events.append((MESSAGE, key, msg_id))
                if content and (packed > state[1] or (packed == state[1] and msg_id > state[2])):
                    state[1], state[2] = packed, msg_id  # the newest shown content so far
                if state[4] is not None:  # the chat has unread counters: they follow it
                    state[4].append(_shown(msg, packed))
            new_keys[msg_id] = key
            put(key, msg.encoded, messages_cf)
            if ref is not None:
                self._index_ref(msg, msg_id, key, seq, batch)
            append(_new_tuple(PutResult, (msg_id, seq, False, False)))  # = _put_result(...)
        if chats:
            metas = {
                chat: meta_after_messages(bases[chat], seq, packed, msg_id)
                for chat, (seq, packed, msg_id, _, _) in chats.items()
            }
            self._put_metas(batch, metas)
            self._mark_referred_split(batch, new_keys, contents, referrers, hidden, erased)
            shown = {chat: state[4] for chat, state in chats.items() if state[4]}
            followed = self._unread.follow(batch, shown) if shown else None
            self._write(batch, events)
            self._remember_meta(metas)
            if followed:
                self._unread.remember(followed)
            if hidden_keys:
                self._hidden.note(hidden_keys)
        return results

    def _put_new_standalone(self, msgs: list[MsgV1], ids: list[bytes]) -> list[PutResult] | None:
        """``put_messages`` of messages none of which is held, none hidden, when none refers to
        another (NEW and KEYS: most batches), none repeats and none has expired — else None,
        having written nothing. The same rows, built a column at a time: each list made by
        one comprehension or ``map`` (the per-message statements of the general loop were
        most of a batch's time outside RocksDB)."""
        n = len(msgs)
        kinds = [m.kind for m in msgs]
        if kinds.count(NEW) + kinds.count(KEYS) != n or len(set(ids)) != n:
            return None  # (a message that refers to another; or one twice in the batch)
        packed = [h.physical_ms << LOGICAL_BITS | h.logical for h in [m.hlc for m in msgs]]
        expire = self.expire_before_ms
        if min(packed) < 0 or max(packed) > U64_MAX:
            return None  # (key_messages raises)
        if expire is not None and min(packed) >> LOGICAL_BITS <= expire:
            return None  # (refused as expired, one by one)
        chat_ids = [m.chat_id for m in msgs]
        bases: dict[bytes, ChatMeta] = {}
        seqs: dict[bytes, Iterator[int]] = {}  # chat -> the seqs it gives out
        for chat in dict.fromkeys(chat_ids):
            if type(chat) is not bytes or len(chat) != CHAT_ID_LEN:
                return None  # (key_messages raises)
            bases[chat] = base = self._load_meta(chat)
            seqs[chat] = count(base.last_seq + 1)
        seq_list = list(map(next, map(seqs.__getitem__, chat_ids)))
        last_seqs = {chat: next(counter) - 1 for chat, counter in seqs.items()}
        if max(last_seqs.values()) > U32_MAX:
            return None  # (key_messages raises)
        keys = list(map(_PACK_KEY, chat_ids, packed, seq_list))  # = key_messages(...)
        batch = self._rocks.new_batch()
        _consume(map(batch.put, keys, [m.encoded for m in msgs], repeat(self._handle["messages"])))
        if kinds.count(NEW) == n:
            content, content_ids = msgs, ids
            newest = sorted(zip(packed, ids, chat_ids, strict=True))
        else:
            is_new = [kind == NEW for kind in kinds]
            content = list(compress(msgs, is_new))
            content_ids = list(compress(ids, is_new))
            newest = sorted(compress(zip(packed, ids, chat_ids, strict=True), is_new))
        # each chat's newest shown content: the last of its (hlc, id) in sorted order
        tops = {chat: (hlc, msg_id) for hlc, msg_id, chat in newest}
        metas = {
            chat: meta_after_messages(base, last_seqs[chat], *tops.get(chat, (-1, b"")))
            for chat, base in bases.items()
        }
        self._put_metas(batch, metas)
        marks = self._multi_get("ref_targets", content_ids)
        if marks.count(None) != len(marks):  # referred to before they arrived
            marked = [m for m, mark in zip(content, marks, strict=True) if mark is not None]
            self._mark_referred_split(batch, dict(zip(ids, keys, strict=True)), marked, [])
        counted: dict[bytes, list[Shown]] = {
            chat: [] for chat in bases if self._unread.of_chat(chat) is not None
        }
        if counted:  # the chats with unread counters: they follow their messages
            for m, hlc, chat, kind in zip(msgs, packed, chat_ids, kinds, strict=True):
                if (rows := counted.get(chat)) is not None:
                    rows.append((hlc, m.sender, kind == NEW, None))  # = _shown(m, hlc)
        followed = self._unread.follow(batch, counted) if counted else None
        self._write_shown(batch, ShownRun(keys, ids))  # and seen_msg (store.events)
        self._remember_meta(metas)
        if followed:
            self._unread.remember(followed)
        fields = zip(ids, seq_list, repeat(False, n), repeat(False, n), strict=True)
        return list(map(_new_tuple, repeat(PutResult), fields))  # = _put_result(id, seq, False)

    def _mark_referred(
        self, batch: WriteBatch, msgs: list[MsgV1], new_keys: dict[bytes, bytes]
    ) -> None:
        """``_mark_referred_split`` of the messages among ``msgs`` stored now (``new_keys``:
        id -> key)."""
        referrers: list[tuple[MsgV1, bytes]] = []
        contents: list[MsgV1] = []
        for m in msgs:
            if m.msg_id not in new_keys:
                continue
            if m.kind in CONTENT:
                contents.append(m)
            elif m.kind in CHANGES_TARGET and m.ref is not None:
                referrers.append((m, m.ref))
        self._mark_referred_split(batch, new_keys, contents, referrers)

    def _mark_referred_split(
        self,
        batch: WriteBatch,
        new_keys: dict[bytes, bytes],
        contents: list[MsgV1],
        referrers: list[tuple[MsgV1, bytes]],
        hidden: frozenset[bytes] | set[bytes] = frozenset(),
        erased: frozenset[bytes] | set[bytes] = frozenset(),
    ) -> None:
        """``referred[target key | referrer key]`` for the edits and reactions stored now
        (``referrers``: with their refs) whose target in their chat is held, and for the
        held ones that refer to a content message stored now (``contents``; ``ref_targets``
        says which have any, ``refs`` gives their keys). Keyed like the messages, it is read
        in step with a page of the folded history (``store.views``); its value is the
        referrer's bytes (``_referred_value``), so that page needs no second read. The
        targets' view rows follow (``store.view_rows``; ``hidden``: the ids of the messages
        stored here hidden, ``erased``: the messages keys the batch erases, both left out)."""
        referred = self._handle["referred"]
        targets: dict[bytes, MsgV1 | None] = {}  # whose view rows the batch changes
        added: Added = {}
        fresh: set[bytes] = set()  # of those, the ones without rows yet: stored now, or
        if referrers:  # never referred to before (no ``ref_targets`` mark)
            missing = [ref for _, ref in referrers if ref not in new_keys]
            held = dict(zip(missing, self._multi_get("seen_msg", missing), strict=True))
            marked = dict(zip(missing, self._multi_get("ref_targets", missing), strict=True))
            for m, ref in referrers:
                target = new_keys.get(ref) or (held.get(ref) or b"")[:MESSAGES_KEY_LEN]
                if target is not None and target[:CHAT_ID_LEN] == m.chat_id:
                    key = new_keys[m.msg_id]
                    batch.put(target + key, _referred_value(target, key, m.encoded), referred)
                    if m.msg_id not in hidden:
                        added.setdefault(target, []).append((key, m))
                        targets[target] = None
                        if ref in new_keys or marked.get(ref) is None:
                            fresh.add(target)
        marks = self._multi_get("ref_targets", [m.msg_id for m in contents])
        for m, mark in zip(contents, marks, strict=True):
            target = new_keys[m.msg_id]
            if target in fresh:
                targets[target] = m  # (given: it is not in the messages yet)
            if mark is not None:  # referred to before it arrived
                keys = [key for _, key in self._iter_prefix("refs", m.chat_id + m.msg_id)]
                rows = added.setdefault(target, [])
                for key, held_bytes in zip(keys, self._multi_get("messages", keys), strict=True):
                    value = _referred_value(target, key, held_bytes or b"")
                    batch.put(target + key, value, referred)
                    if held_bytes is not None:
                        rows.append((key, stored_msg(held_bytes)))
                targets[target] = m
                fresh.add(target)
        if targets:
            self._views.refresh(batch, targets, added=added, gone=erased, fresh=fresh)

    def rebuild_reference_indexes(self, rows_per_batch: int = 10_000) -> None:
        """Index every held message that refers to another (``refs``, ``ref_targets``,
        ``receipts``) and every held edit or reaction of a held message (``referred``): for a
        database written before these indexes existed. One scan of the messages."""
        referrers: dict[bytes, bytes] = {}  # id -> key, of a batch's edits and reactions
        msgs: list[MsgV1] = []
        batch = self._rocks.new_batch()
        for n, (key, value) in enumerate(self._iter_all("messages"), 1):
            msg = decode_msg(value, trusted=True)
            if msg.ref is not None:
                self._index_ref(msg, msg.msg_id, key, seq_of(key), batch)
                if msg.kind in CHANGES_TARGET:
                    referrers[msg.msg_id] = key
                    msgs.append(msg)
                else:  # earlier versions indexed replies and receipts by target too
                    batch.delete(msg.chat_id + msg.ref + msg.msg_id, self._handle["refs"])
            if n % rows_per_batch == 0:
                self._mark_referred(batch, msgs, referrers)  # their targets, as a put does
                self._write(batch)
                batch, msgs, referrers = self._rocks.new_batch(), [], {}
        self._mark_referred(batch, msgs, referrers)
        self._write(batch)

    def _index_ref(
        self, msg: MsgV1, msg_id: bytes, key: bytes, seq: int, batch: WriteBatch
    ) -> None:
        """Index a message that refers to another: an edit or reaction by its target (part
        of the target's view, ``store.views``), a receipt by its reader (``store.reads``)."""
        assert msg.ref is not None
        chat, handle = msg.chat_id, self._handle
        if msg.kind in CHANGES_TARGET:
            batch.put(chat + msg.ref + msg_id, key, handle["refs"])
            batch.put(msg.ref, b"", handle["ref_targets"])
        elif msg.kind is MessageKind.READ_RECEIPT and (position := position_of(msg)) is not None:
            row = key_receipt(chat, msg.sender, position.to_bytes(), seq)
            batch.put(row, key, handle["receipts"])  # -> the receipt: the GC trims by its stamp

    def _check_message(self, msg: MsgV1, now_ms: int | None) -> None:
        config = self.config
        if len(msg.payload) > config.max_payload:
            check_payload_size(msg.payload, config.max_payload)  # raises TooLarge
        if now_ms is not None:
            ahead = msg.hlc.physical_ms - now_ms
            if ahead > config.max_offset_ms:
                raise ClockDriftError(
                    f"message HLC is {ahead} ms ahead of local time "
                    f"(max offset {config.max_offset_ms} ms)"
                )

    # --- reads ---

    def has_message(self, msg_id: bytes) -> bool:
        return self._get("seen_msg", msg_id) is not None

    def held_messages(self, msg_ids: list[bytes]) -> list[bool]:
        """For each id, whether this replica holds that message (one multi-get)."""
        return [v is not None for v in self._multi_get("seen_msg", msg_ids)]

    def get_message(self, msg_id: bytes) -> MsgV1 | None:
        seen = self._get("seen_msg", msg_id)
        if not seen:
            return None
        raw = self._get("messages", seen[:MESSAGES_KEY_LEN])
        if raw is None:
            return None
        return decode_msg(raw, max_payload=self.config.max_payload, trusted=True)

    def range(
        self,
        chat_id: bytes,
        cursor: str | None = None,
        limit: int = DEFAULT_PAGE_LIMIT,
        direction: Direction = Direction.BACKWARD,
        *,
        kinds: frozenset[int] | None = None,
        replies: list[int] | None = None,
    ) -> RangePage:
        """One page of a chat's history, ordered by (hlc, seq) in ``direction``.

        ``cursor`` is the ``next_cursor`` of the previous page (base64 of the last
        key returned); the page starts strictly after it, so no message is returned
        twice however many messages are inserted between pages. ``kinds``: only messages
        of these kinds (the others are skipped before they are decoded). ``replies`` (with
        ``kinds``): given the indexes of the page's REPLY messages (``store.views``: their
        kind byte is read here anyway).
        """
        check_len(chat_id, CHAT_ID_LEN, "chat_id")
        check_page_limit(limit)
        start, end = chat_id, prefix_end(chat_id)
        if cursor is not None:
            after = decode_cursor(cursor, MESSAGES_KEY_LEN, chat_id)
            if direction is Direction.FORWARD:
                start = after + b"\x00"  # the smallest key greater than the cursor
            else:
                end = after
        backward = direction is Direction.BACKWARD
        hidden = self._hidden.seqs(chat_id)  # empty, without a read, for most chats
        if kinds is None and not hidden:  # (most pages) every row of the range is on it
            return self._whole_page(start, end, limit, backward)
        if not hidden:  # (a folded page, most chats) every row of these kinds is on it
            return self._kinds_page(start, end, limit, backward, kinds, replies)
        rows = self._rocks.items_in("messages", start, end, reverse=backward)  # ``end``: held
        items: list[StoredMessage] = []
        append, seq_of_key = items.append, _SEQ_OF_KEY
        while True:  # the rows the page still lacks, and one more
            chunk, done = _take(rows, limit + 1 - len(items), start, backward)
            for key, value in chunk:
                if kinds is not None:
                    kind = value[KIND_AT[value[STAMP_AT]]]  # kind_of, inlined
                    if kind not in kinds:
                        continue
                    if kind == REPLY and replies is not None:
                        replies.append(len(items))  # (hidden: taken out again below)
                if len(key) == MESSAGES_KEY_LEN:
                    seq = seq_of_key(key, _SEQ_AT)[0]  # seq_of, inlined
                else:
                    seq = parse_key_messages(key)[2]  # raises: not a messages key
                if hidden and seq in hidden:
                    if replies and replies[-1] == len(items):
                        replies.pop()
                    continue
                # Our own rows, written by put_messages: decoded when a field is read
                msg = _new(StoredMsg)
                set_stored(msg, value)  # = stored_msg(value), inlined
                append(_new_tuple(StoredMessage, (key, seq, msg)))
            page = _page_if_full(items, limit, replies)
            if page is not None:
                return page
            if done:
                return RangePage(items, None)

    def _kinds_page(
        self,
        start: bytes,
        end: bytes | None,
        limit: int,
        backward: bool,
        kinds: frozenset[int] | None,
        replies: list[int] | None,
    ) -> RangePage:
        """``range`` of the rows of ``kinds`` from ``start`` to ``end`` (nothing hidden): a
        folded page's scan, the kind byte of each row read in place and compared as a small
        int (the same object, not an enum member to compare by value)."""
        assert kinds is not None
        wanted = _KIND_INTS.get(kinds) or frozenset(int(kind) for kind in kinds)
        rows = self._rocks.items_in("messages", start, end, reverse=backward)  # ``end``: held
        items: list[StoredMessage] = []
        append, new, new_tuple, seq_of_key = items.append, _new, _new_tuple, _SEQ_OF_KEY
        kind_at, stamp_at = KIND_AT, STAMP_AT
        while True:  # the rows the page still lacks, and one more
            chunk, done = _take(rows, limit + 1 - len(items), start, backward)
            for key, value in chunk:
                kind = value[kind_at[value[stamp_at]]]  # kind_of, inlined
                if kind not in wanted:
                    continue
                if kind == REPLY and replies is not None:
                    replies.append(len(items))
                if len(key) != MESSAGES_KEY_LEN:
                    parse_key_messages(key)  # raises: not a messages key
                msg = new(StoredMsg)  # our own rows: decoded when a field is read
                set_stored(msg, value)
                append(new_tuple(StoredMessage, (key, seq_of_key(key, _SEQ_AT)[0], msg)))
            page = _page_if_full(items, limit, replies)
            if page is not None:
                return page
            if done:
                del end  # (held to here: the iterator's upper bound, see Rocks.items)
                return RangePage(items, None)

    def _whole_page(self, start: bytes, end: bytes | None, limit: int, backward: bool) -> RangePage:
        """``range`` of every row from ``start`` to ``end`` (no kinds asked for, nothing
        hidden): the page's rows and one more (are there more?), then the page (``_items``)."""
        scan = self._rocks.items_in("messages", start, end, reverse=backward)
        rows, _ = _take(scan, limit + 1, start, backward)
        del end  # (held to here: the iterator's upper bound, see Rocks.items)
        more = len(rows) > limit
        if more:
            rows.pop()
        return RangePage(_items(rows), encode_cursor(rows[-1][0]) if more else None)

    def hidden_grants(self, chat_id: bytes) -> list[StoredMessage]:
        """The chat's hidden key grants (KEYS messages stamped while their sender was no
        member), every sender's, in (hlc, seq) order, the newest ``MAX_PAGE_LIMIT``: each boxes
        keys to its recipients only, for its sender's or a holder's valid messages
        (SECURITY.md, "Hand-overs"). None in most chats, without a read."""
        if chat_id not in self._hidden.chats():  # in memory: no read for most chats
            return []
        max_payload = self.config.max_payload
        out = []
        for _, key in self._rocks.iter_prefix("hidden", chat_id):
            value = self._rocks.get("messages", key)
            if value is None or value[KIND_AT[value[STAMP_AT]]] != MessageKind.KEYS:
                continue
            msg = decode_msg(value, max_payload=max_payload, trusted=True)
            out.append(StoredMessage(key, parse_key_messages(key)[2], msg))
        return sorted(out, key=lambda item: item.key)[-MAX_PAGE_LIMIT:]

    # --- sync helpers (seed 002: Merkle rebuild, step 4, step 5) ---

    def iter_msg_ids(self) -> Iterator[tuple[bytes, int]]:
        for msg_id, key in self._iter_all("seen_msg"):
            yield msg_id, extract_hlc_physical_from_seen_value(key) or 0

    def for_each_msg_id(self, callback: Callable[[bytes, int], None]) -> None:
        """Call ``callback(msg_id, hlc.physical_ms)`` for every stored message (Merkle rebuild)."""
        for msg_id, physical_ms in self.iter_msg_ids():
            callback(msg_id, physical_ms)

    def msg_chats(self, ids: list[bytes]) -> list[bytes | None]:
        """The chat of each held message (None: not held): its messages key starts with it."""
        return [None if k is None else k[:CHAT_ID_LEN] for k in self._multi_get("seen_msg", ids)]

    def iter_msg_chats(self) -> Iterator[tuple[bytes, bytes]]:
        """(message id, chat id) of every held message (per-shard trees, ``sync.shards``)."""
        for msg_id, key in self._iter_all("seen_msg"):
            yield msg_id, key[:CHAT_ID_LEN]

    def get_bucket_msg_ids(self, bucket: int) -> list[bytes]:
        return [msg_id for msg_id, _ in self._iter_prefix("seen_msg", bucket_prefix(bucket))]

    def get_range_msg_ids(self, start: int, end: int, cutoff_ts: int | None) -> list[bytes]:
        """Ids in buckets ``start <= b < end`` (newer than ``cutoff_ts``): one range scan."""
        low, high = bucket_range_keys(start, end)
        if cutoff_ts is None:
            return self._rocks.range_keys("seen_msg", low, high)
        rows = self._rocks.iter_range("seen_msg", low, high)
        return [
            msg_id
            for msg_id, key in rows
            if (extract_hlc_physical_from_seen_value(key) or 0) > cutoff_ts
        ]

    def get_ranges_msg_ids(
        self, runs: Sequence[tuple[int, int]], cutoff_ts: int | None
    ) -> list[bytes]:
        """Per run ``(start, end)`` of buckets (ascending, disjoint) its ids concatenated
        (newer than ``cutoff_ts``): one iterator for all runs (``Rocks.ranges_keys``)."""
        if cutoff_ts is None:
            return self._rocks.ranges_keys("seen_msg", [bucket_range_keys(*run) for run in runs])
        return [b"".join(self.get_range_msg_ids(lo, hi, cutoff_ts)) for lo, hi in runs]

    def get_ranges_msg_ids_stamped(
        self, runs: Sequence[tuple[int, int]], cutoff_ts: int
    ) -> list[tuple[bytes, bytes]]:
        """Per run ``(start, end)`` of buckets, its ids newer than ``cutoff_ts`` concatenated
        and their HLC physical ms (8 bytes each, big-endian) in the same order: what a kept
        listing filters a later cutoff by (``sync.listing_cache``)."""
        out: list[tuple[bytes, bytes]] = []
        for lo, hi in runs:
            low, high = bucket_range_keys(lo, hi)
            ids: list[bytes] = []
            stamps: list[bytes] = []
            for msg_id, key in self._rocks.iter_range("seen_msg", low, high):
                stamp = extract_hlc_physical_from_seen_value(key) or 0
                if stamp > cutoff_ts:
                    ids.append(msg_id)
                    stamps.append(stamp.to_bytes(8, "big"))
            out.append((b"".join(ids), b"".join(stamps)))
        return out

    def get_bucket_msg_ids_filtered(self, bucket: int, cutoff_ts: int) -> list[bytes]:
        """Ids in ``bucket`` newer than ``cutoff_ts`` (the retention soft-filter)."""
        return [
            msg_id
            for msg_id, key in self._iter_prefix("seen_msg", bucket_prefix(bucket))
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
        self, ids: list[bytes], cutoff_ts: int | None = None, settled_ts: int | None = None
    ) -> list[bytes | None]:
        """Encoded message per id (None: unknown, not newer than ``cutoff_ts``, or stamped
        after ``settled_ts``).

        Two multi-gets: seen_msg for the keys, then messages for the values.
        """
        low = -1 if cutoff_ts is None else cutoff_ts
        high = MAX_PHYSICAL if settled_ts is None else settled_ts
        keys = self._multi_get("seen_msg", ids)
        wanted = [
            key[:MESSAGES_KEY_LEN]
            if key and low < (extract_hlc_physical_from_seen_value(key) or 0) <= high
            else None
            for key in keys
        ]
        present = [key for key in wanted if key is not None]
        values = iter(self._multi_get("messages", present))
        return [None if key is None else next(values) for key in wanted]

    # --- retention helpers ---

    def for_each_chat_id(self, callback: Callable[[bytes], None]) -> None:
        for chat_id, _ in self._iter_all("chats_meta"):
            callback(chat_id)

    def range_delete_old_messages(self, chat_id: bytes, cutoff_ts: int) -> None:
        """One delete_range over every message of ``chat_id`` with hlc.physical_ms <= cutoff_ts."""
        begin = key_messages(chat_id, 0, 0)
        end = key_messages(chat_id, Hlc(cutoff_ts + 1, 0).pack(), 0)
        batch = self._rocks.new_batch()
        batch.delete_range(begin, end, self._handle["messages"])
        batch.delete_range(begin, end, self._handle["referred"])  # keyed like the messages
        batch.delete_range(begin, end, self._handle["event_at"])  # so is this
        batch.delete_range(begin, end, self._handle["views"])  # and this
        self._refold_expired(batch, chat_id, end)
        receipts = self._handle["receipts"]
        for row, receipt_key in self._iter_prefix("receipts", chat_id):
            if begin <= receipt_key < end:  # the receipt expired with the messages
                batch.delete(row, receipts)
        self._unread.void(batch, [chat_id])  # what they count, and positions, may go
        try:
            self._write(batch)
        except BaseException:
            self._unread.forget()
            raise

    def _refold_expired(self, batch: WriteBatch, chat_id: bytes, end: bytes) -> None:
        """The view rows of the chat's targets kept (from ``end``) that a referrer stamped
        before ``end`` changed: folded again without it (it expires with the batch). Its
        ``referred`` row holds no bytes (``_referred_value``), one scan finds them."""
        targets: dict[bytes, MsgV1 | None] = {}
        gone: set[bytes] = set()
        chat_end = prefix_end(chat_id)  # (held while the rows are read: see Rocks.items)
        for row, value in self._rocks.items_in("referred", end, chat_end):
            if not value and (referrer := row[MESSAGES_KEY_LEN:]) < end:
                targets[row[:MESSAGES_KEY_LEN]] = None
                gone.add(referrer)
        del chat_end
        if targets:
            self._views.refresh(batch, targets, gone=gone)

    def scan_seen_msg_aged(self, cutoff_ts: int, limit: int) -> list[bytes]:
        """Up to ``limit`` msg ids whose HLC physical_ms <= cutoff_ts (or unreadable/legacy)."""
        aged: list[bytes] = []
        for msg_id, key in self._iter_all("seen_msg"):
            physical = extract_hlc_physical_from_seen_value(key)
            if physical is None or physical <= cutoff_ts:
                aged.append(msg_id)
                if len(aged) >= limit:
                    break
        return aged

    def delete_seen_msg_batch(self, msg_ids: list[bytes]) -> None:
        batch = self._rocks.new_batch()
        for msg_id in msg_ids:
            batch.delete(msg_id, self._handle["seen_msg"])
        self._write(batch)
