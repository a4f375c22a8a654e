"""A chat's history as readers see it (MESSAGES.md): content messages with their current
payload, edit mark, reactions and reply state, and the tombstones of deleted ones.

``folded_range`` pages like ``range`` but over content messages (NEW, REPLY) only.
The edits and reactions of a page's messages come from one scan of ``referred`` (keyed
target key | referrer key, so in the messages' order) over the page's key interval and one
multi-get; most pages have few, and a message with none costs nothing more. Tombstones are
given with the page whose HLC interval holds the deleted message's claimed stamp.
"""

from __future__ import annotations

from dataclasses import dataclass

from store.admission import AdmissionStore
from store.hlc import Hlc
from store.keys import CHAT_ID_LEN, MESSAGES_KEY_LEN, decode_cursor, referred_end, seq_of
from store.kinds import (
    CONTENT,
    MessageView,
    Tombstone,
    claims_of,
    delete_is_valid,
    latest_edit,
    plain_view,
    reactions_of,
)
from store.messages import (
    DEFAULT_PAGE_LIMIT,
    Direction,
    StoredMessage,
)
from store.records import MessageKind, MsgV1, decode_msg


@dataclass(frozen=True, slots=True)
class FoldedMessage:
    seq: int  # this node's local sequence number
    view: MessageView


_new = object.__new__
_set_seq, _set_view = (FoldedMessage.__dict__[name].__set__ for name in FoldedMessage.__slots__)
assert FoldedMessage.__slots__ == ("seq", "view")


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
        page = self.range(chat_id, cursor, limit, direction, kinds=CONTENT)
        items, next_cursor = page.items, page.next_cursor
        is_admin = self.admins(chat_id)
        valid = [d for d in self.deletes_of(chat_id) if delete_is_valid(d, is_admin)]
        referrers = self._referrers(chat_id, items)
        folded: list[FoldedMessage] = []
        append = folded.append
        for item in items:
            msg, refs = item.msg, referrers.get(item.key)
            if refs is None and msg.kind is MessageKind.NEW:
                view = plain_view(msg)  # most messages: nothing refers to them
            else:
                view = self._view(msg, refs or [], valid)
            entry = _new(FoldedMessage)  # FoldedMessage(item.seq, view), through its slots
            _set_seq(entry, item.seq)
            _set_view(entry, view)
            append(entry)
        start = None if cursor is None else _stamp(decode_cursor(cursor, MESSAGES_KEY_LEN, chat_id))
        end = _stamp(items[-1].key) if next_cursor is not None else None
        return FoldedPage(folded, self._tombstones(valid, start, end, direction), next_cursor)

    def _referrers(self, chat_id: bytes, items: list[StoredMessage]) -> dict[bytes, list[MsgV1]]:
        """The page's messages' key -> the shown edits and reactions that refer to them.
        ``referred`` is keyed by target key, then referrer key: one scan over the page's key
        interval and one multi-get find them all (most pages have few)."""
        if not items:
            return {}
        low, high = sorted((items[0].key, items[-1].key))
        on_page = {item.key for item in items}  # not a hidden message's, nor one the fold skips
        rows = [
            row
            for row, _ in self.iter_range("referred", low, referred_end(high))
            if row[:MESSAGES_KEY_LEN] in on_page
        ]
        if not rows:
            return {}
        hidden = self.hidden_seqs(chat_id)
        out: dict[bytes, list[MsgV1]] = {}
        found = self.multi_get("messages", [row[MESSAGES_KEY_LEN:] for row in rows])
        for row, raw in zip(rows, found, strict=True):
            if raw is None or seq_of(row) in hidden:
                continue  # erased, or its sender was not a member then
            out.setdefault(row[:MESSAGES_KEY_LEN], []).append(decode_msg(raw, trusted=True))
        return out

    def _view(self, msg: MsgV1, refs: list[MsgV1], valid: list[MsgV1]) -> MessageView:
        """``msg`` with the shown edits and reactions that refer to it, and its reply state."""
        return MessageView(
            msg,
            latest_edit(msg, refs),
            self._reply_state(msg, valid) if msg.kind is MessageKind.REPLY else None,
            reactions_of(r for r in refs if r.kind is MessageKind.REACTION),
        )

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
