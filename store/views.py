"""A chat's history as readers see it (MESSAGES.md): content messages with their current
payload, edit mark, reactions and reply state, and the tombstones of deleted ones.

``folded_range`` pages like ``range`` but over content messages (NEW, REPLY) only, and
gives the views of the page's messages that the fold changes — edited, reacted to, or a
reply — beside them: every other message is shown as stored, at no cost beyond ``range``.
What the edits and reactions of a page's messages change of them is read, not folded: one
scan of their view rows (``store.view_rows``: keyed like the messages, kept by every write
that changes what they fold) over the page's key interval; most pages have few. A reply's
state (its target held, deleted or unknown) is looked up per page. Tombstones are given with the page
whose HLC interval holds the deleted message's claimed stamp.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from operator import itemgetter

from store.deletes import Deletes
from store.hlc import Hlc
from store.keys import CHAT_ID_LEN, MESSAGES_KEY_LEN, decode_cursor
from store.kinds import (
    CONTENT,
    MessageView,
    Tombstone,
    claims_of,
    delete_is_valid,
    message_view,
)
from store.messages import (
    DEFAULT_PAGE_LIMIT,
    Direction,
    Messages,
    RangePage,
    StoredMessage,
)
from store.records import MsgV1, stored_msg
from store.rocks import Rocks
from store.view_row import decode_view

_KEY = itemgetter(0)  # a StoredMessage's key


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
    """Folded pages of a chat's history (reads only, of the messages, the view rows and the
    deletes)."""

    def __init__(self, rocks: Rocks, messages: Messages, deletes: Deletes) -> None:
        self._rocks, self._messages, self._deletes = rocks, messages, deletes

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
        # only the messages the fold changes are looked at: no work per plain message
        changed = self._changed(items, {items[i].key for i in replies}, valid) if items else {}
        for i in replies:
            key, _, msg = items[i]
            if key not in changed:
                changed[key] = message_view(msg, None, self._reply_state(msg, valid), {})
        tombstones = self._tombstones(chat_id, valid, cursor, page, direction) if valid else []
        return FoldedPage(page.items, changed, tombstones, page.next_cursor)

    def _valid_deletes(self, chat_id: bytes) -> list[MsgV1]:
        deletes = self._deletes
        if chat_id not in deletes.delete_chats():
            return []  # most chats, without a read
        is_admin = deletes.admins(chat_id)
        return [d for d in deletes.deletes_of(chat_id) if delete_is_valid(d, is_admin)]

    def _changed(
        self, items: list[StoredMessage], replies: set[bytes], valid: list[MsgV1]
    ) -> dict[bytes, MessageView]:
        """The views of the page's messages that their edits and reactions change: their
        view rows (``store.view_rows``, keyed like the messages), read by one scan over the
        page's key interval (most pages have few). A row of a key the page does not show (a
        hidden message's) is not looked at. Each row's message is found by bisecting the
        page's keys: a dict of the page would hash each of its keys, for a few rows."""
        keys = list(map(_KEY, items))
        backward = keys[0] > keys[-1]
        if backward:
            keys.reverse()  # (ascending, to bisect)
        low, high = keys[0], keys[-1]
        end = high + b"\x00"  # (held while the rows are read: see Rocks.items)
        rows = list(self._rocks.items_in("views", low, end))
        del end
        changed: dict[bytes, MessageView] = {}
        if not rows:
            return changed
        last = len(keys) - 1
        for key, row in rows:
            at = bisect_left(keys, key)
            if at > last or keys[at] != key:
                continue
            msg = items[last - at if backward else at][2]
            edit, reactions = decode_view(row)
            state = self._reply_state(msg, valid) if key in replies else None
            changed[key] = message_view(
                msg, None if edit is None else stored_msg(edit), state, reactions
            )
        return changed

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
