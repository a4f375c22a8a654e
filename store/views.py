"""A chat's history as readers see it (MESSAGES.md): content messages with their current
payload, edit mark, reactions and reply state, and the tombstones of deleted ones.

``folded_range`` pages like ``range`` but over content messages (NEW, REPLY) only.
The messages a page's items are referred to by are found through ``refs``; most
messages have none, and one multi-get in ``ref_targets`` tells which do (for that,
each item's id is computed); a referred message costs a prefix scan of ``refs``, a
multi-get and the decoding of what refers to it (MESSAGES.md has the figures). Tombstones are
given with the page whose HLC interval holds the deleted message's claimed stamp.
"""

from __future__ import annotations

from dataclasses import dataclass

from store.admission import AdmissionStore
from store.hlc import Hlc
from store.keys import CHAT_ID_LEN, MESSAGES_KEY_LEN, decode_cursor, encode_cursor
from store.kinds import (
    CONTENT,
    MessageView,
    Tombstone,
    claims_of,
    delete_is_valid,
    latest_edit,
    reactions_of,
)
from store.messages import (
    DEFAULT_PAGE_LIMIT,
    MAX_PAGE_LIMIT,
    Direction,
    StoredMessage,
    check_page_limit,
)
from store.records import MessageKind, MsgV1, decode_msg


@dataclass(frozen=True, slots=True)
class FoldedMessage:
    seq: int  # this node's local sequence number
    view: MessageView


@dataclass(frozen=True, slots=True)
class FoldedPage:
    items: list[FoldedMessage]
    tombstones: list[Tombstone]  # deleted messages stamped within this page's interval
    next_cursor: str | None


class ViewStore(AdmissionStore):
    def folded_range(
        self,
        chat_id: bytes,
        cursor: str | None = None,
        limit: int = DEFAULT_PAGE_LIMIT,
        direction: Direction = Direction.BACKWARD,
    ) -> FoldedPage:
        check_page_limit(limit)
        items, next_cursor = self._content_page(chat_id, cursor, limit, direction)
        hidden = self.hidden_seqs(chat_id)
        is_admin = self.admins(chat_id)
        valid = [d for d in self.deletes_of(chat_id) if delete_is_valid(d, is_admin)]
        marked = self.multi_get("ref_targets", [i.msg.msg_id for i in items])
        folded = [
            FoldedMessage(item.seq, self._view(item.msg, mark is not None, hidden, valid))
            for item, mark in zip(items, marked, strict=True)
        ]
        start = None if cursor is None else _stamp(decode_cursor(cursor, MESSAGES_KEY_LEN, chat_id))
        end = _stamp(items[-1].key) if next_cursor is not None else None
        return FoldedPage(folded, self._tombstones(valid, start, end, direction), next_cursor)

    def _content_page(
        self, chat_id: bytes, cursor: str | None, limit: int, direction: Direction
    ) -> tuple[list[StoredMessage], str | None]:
        """Up to ``limit`` shown content messages from ``cursor`` on, and the next cursor."""
        out: list[StoredMessage] = []
        while True:
            # a fifth more rows than still needed: most chats' other kinds are fewer than that
            wanted = min(MAX_PAGE_LIMIT, (limit - len(out)) * 5 // 4 + 1)
            page = self.range(chat_id, cursor, wanted, direction)
            for n, item in enumerate(page.items):
                if item.msg.kind in CONTENT:
                    out.append(item)
                    if len(out) == limit:
                        more = n + 1 < len(page.items) or page.next_cursor is not None
                        return out, encode_cursor(item.key) if more else None
            if page.next_cursor is None:
                return out, None
            cursor = page.next_cursor

    def _view(
        self, msg: MsgV1, referred: bool, hidden: set[int], valid: list[MsgV1]
    ) -> MessageView:
        """``msg`` with the shown edits and reactions that refer to it (``referred``: some
        held message does), and its reply state."""
        if not referred and msg.kind is MessageKind.NEW:
            return MessageView(msg)  # most messages: nothing refers to them
        refs = self._shown_refs(msg, hidden) if referred else []
        return MessageView(
            msg,
            latest_edit(msg, refs),
            self._reply_state(msg, valid) if msg.kind is MessageKind.REPLY else None,
            reactions_of(r for r in refs if r.kind is MessageKind.REACTION),
        )

    def _shown_refs(self, msg: MsgV1, hidden: set[int]) -> list[MsgV1]:
        keys = [value for _, value in self.iter_prefix("refs", msg.chat_id + msg.msg_id)]
        return [
            decode_msg(raw, trusted=True)
            for key, raw in zip(keys, self.multi_get("messages", keys), strict=True)
            if raw is not None and int.from_bytes(key[MESSAGES_KEY_LEN - 4 :], "big") not in hidden
        ]

    def _reply_state(self, reply: MsgV1, valid: list[MsgV1]) -> str:
        ref = reply.ref
        assert ref is not None
        target = self.get_message(ref)
        if target is not None and target.chat_id == reply.chat_id:
            return "present"
        return "deleted" if any(d.ref == ref for d in valid) else "unknown"

    def _tombstones(
        self, valid: list[MsgV1], start: Hlc | None, end: Hlc | None, direction: Direction
    ) -> list[Tombstone]:
        """The first valid delete of each target not held whose claimed stamp is in this
        page: past the cursor's stamp (``start``), up to the last item's (``end``; None: to
        the chat's end) — each tombstone on exactly one page."""
        first: dict[bytes, MsgV1] = {}
        for d in sorted(valid, key=lambda d: (d.hlc, d.msg_id)):
            assert d.ref is not None
            first.setdefault(d.ref, d)
        out = []
        for (ref, d), is_held in zip(first.items(), self.held_messages(list(first)), strict=True):
            claims = claims_of(d)
            if is_held or claims is None or not _within(claims.hlc, start, end, direction):
                continue
            out.append(Tombstone(ref, claims.hlc, claims.sender, d.sender, d.hlc))
        return sorted(out, key=lambda t: t.order, reverse=direction is Direction.BACKWARD)


def _stamp(key: bytes) -> Hlc:
    return Hlc.from_bytes(key[CHAT_ID_LEN : CHAT_ID_LEN + 8])


def _within(hlc: Hlc, start: Hlc | None, end: Hlc | None, direction: Direction) -> bool:
    """In the page's interval: past the cursor's stamp, up to the last item's (or no end)."""
    if direction is Direction.BACKWARD:  # stamps fall from start to end
        return (start is None or hlc < start) and (end is None or hlc >= end)
    return (start is None or hlc > start) and (end is None or hlc <= end)
