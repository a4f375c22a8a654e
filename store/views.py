"""A chat's history as readers see it (MESSAGES.md): content messages with their current
payload, edit mark, reactions and reply state, and the tombstones of deleted ones.

``folded_range`` pages like ``range`` but over content messages (NEW, REPLY) only, and
gives the views of the page's messages that the fold changes — edited, reacted to, or a
reply — beside them: every other message is shown as stored, at no cost beyond ``range``.
The edits and reactions of a page's messages come from one scan of ``referred`` (keyed
target key | referrer key, so in the messages' order, and holding the referrers' bytes)
over the page's key interval; most pages have few. Tombstones are given with the page
whose HLC interval holds the deleted message's claimed stamp.
"""

from __future__ import annotations

from dataclasses import dataclass

from store.deletes import Deletes
from store.hidden import Hidden
from store.hlc import Hlc
from store.keys import CHAT_ID_LEN, MESSAGES_KEY_LEN, decode_cursor, referred_end, seq_of
from store.kinds import (
    CONTENT,
    MessageView,
    Tombstone,
    claims_of,
    delete_is_valid,
    latest_edit,
    message_view,
    reactions_of,
)
from store.messages import (
    DEFAULT_PAGE_LIMIT,
    Direction,
    Messages,
    RangePage,
    StoredMessage,
)
from store.records import MessageKind, MsgV1, decode_msg, placed, stored_msg
from store.rocks import Rocks

REPLY = MessageKind.REPLY


@dataclass(frozen=True, slots=True)
class FoldedPage:
    items: list[StoredMessage]  # the content messages, as ``range`` gives them
    changed: dict[bytes, MessageView]  # messages key -> the view, where the fold changes it
    tombstones: list[Tombstone]  # deleted messages stamped within this page's interval
    next_cursor: str | None

    def view(self, item: StoredMessage) -> MessageView:
        return self.changed.get(item.key) or MessageView(item.msg)

    def views(self) -> list[MessageView]:
        return [self.view(item) for item in self.items]


class Views:
    """Folded pages of a chat's history (reads only, of the messages, the hidden index and
    the deletes)."""

    def __init__(self, rocks: Rocks, messages: Messages, hidden: Hidden, deletes: Deletes) -> None:
        self._rocks, self._messages, self._hidden, self._deletes = rocks, messages, hidden, deletes

    def folded_range(
        self,
        chat_id: bytes,
        cursor: str | None = None,
        limit: int = DEFAULT_PAGE_LIMIT,
        direction: Direction = Direction.BACKWARD,
    ) -> FoldedPage:
        replies: list[int] = []  # the page's REPLY messages (range reads their kind byte)
        page = self._messages.range(
            chat_id, cursor, limit, direction, kinds=CONTENT, replies=replies
        )
        valid = self._valid_deletes(chat_id)
        items = page.items
        referrers = self._referrers(chat_id, items)
        # only the messages the fold changes are looked at: no work per plain message
        changed: dict[bytes, MessageView] = {}
        if referrers:
            on_page = {key: msg for key, _, msg in items}
            for key, refs in referrers.items():
                if (msg := on_page.get(key)) is not None:
                    changed[key] = self._view(placed(msg), refs, valid)
        for i in replies:
            key, _, msg = items[i]
            if key not in changed:
                changed[key] = self._view(msg, [], valid)
        tombstones = self._tombstones(chat_id, valid, cursor, page, direction) if valid else []
        return FoldedPage(page.items, changed, tombstones, page.next_cursor)

    def _valid_deletes(self, chat_id: bytes) -> list[MsgV1]:
        deletes = self._deletes
        if chat_id not in deletes.delete_chats():
            return []  # most chats, without a read
        is_admin = deletes.admins(chat_id)
        return [d for d in deletes.deletes_of(chat_id) if delete_is_valid(d, is_admin)]

    def _referrers(self, chat_id: bytes, items: list[StoredMessage]) -> dict[bytes, list[MsgV1]]:
        """The page's messages' key -> the shown edits and reactions that refer to them
        (and maybe other keys of the page's interval — a hidden message's, or one the fold
        skips — which the page never looks up). ``referred`` is keyed by target key, then
        referrer key, and holds the referrer's bytes: one scan over the page's key interval
        finds them all (most pages have few). A row without them (a referrer sorting before
        its target) is read from ``messages``."""
        if not items:
            return {}
        low, high = sorted((items[0].key, items[-1].key))
        hidden = self._hidden.seqs(chat_id)  # a referrer whose sender was not a member then
        out: dict[bytes, list[MsgV1]] = {}
        unread: list[bytes] = []  # rows without the bytes
        end = referred_end(high)  # (held while the rows are read: see Rocks.items)
        for row, value in self._rocks.items_in("referred", low, end):
            if hidden and seq_of(row) in hidden:
                continue
            target = row[:MESSAGES_KEY_LEN]
            if value:  # our own row: its fields read when the fold asks (StoredMsg)
                out.setdefault(target, []).append(placed(stored_msg(value)))
            else:
                unread.append(row)
        if unread:
            held = self._rocks.multi_get("messages", [row[MESSAGES_KEY_LEN:] for row in unread])
            for row, raw in zip(unread, held, strict=True):
                if raw is not None:  # (None: erased or expired)
                    out.setdefault(row[:MESSAGES_KEY_LEN], []).append(decode_msg(raw, trusted=True))
        del end
        return out

    def _view(self, msg: MsgV1, refs: list[MsgV1], valid: list[MsgV1]) -> MessageView:
        """``msg`` with the shown edits and reactions that refer to it, and its reply state."""
        return message_view(
            msg,
            latest_edit(msg, refs),
            self._reply_state(msg, valid) if msg.kind is REPLY else None,
            reactions_of(r for r in refs if r.kind is MessageKind.REACTION),
        )

    def _reply_state(self, reply: MsgV1, valid: list[MsgV1]) -> str:
        ref = reply.ref
        assert ref is not None
        target = self._messages.get_message(ref)
        if target is not None and target.chat_id == reply.chat_id:
            return "present"
        return "deleted" if any(d.ref == ref for d in valid) else "unknown"

    def _tombstones(
        self,
        chat_id: bytes,
        valid: list[MsgV1],
        cursor: str | None,
        page: RangePage,
        direction: Direction,
    ) -> list[Tombstone]:
        """The first valid delete of each target not held whose claimed stamp is in this
        page: past the cursor's stamp (``start``), up to the last item's (``end``; None: to
        the chat's end) — each tombstone on exactly one page."""
        start = None if cursor is None else _stamp(decode_cursor(cursor, MESSAGES_KEY_LEN, chat_id))
        end = _stamp(page.items[-1].key) if page.next_cursor is not None else None
        first: dict[bytes, MsgV1] = {}
        for d in sorted(valid, key=lambda d: (d.hlc, d.msg_id)):
            assert d.ref is not None
            first.setdefault(d.ref, d)
        out = []
        for (ref, d), is_held in zip(
            first.items(), self._messages.held_messages(list(first)), strict=True
        ):
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
