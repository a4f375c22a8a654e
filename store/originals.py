"""A chat's signed member ops and DELETE messages as they were signed, page by page.

The history endpoint folds member ops into rows and deletes into tombstones; an export
(``client/backup.py``) needs the signed originals themselves, to re-submit them to another
node unchanged. Both column families are keyed under the chat id, so a page is a slice of
one prefix, continued after the last key by a cursor (as ``store.messages.range`` does).
"""

from __future__ import annotations

from dataclasses import dataclass

from store.keys import (
    BY_REF_KEY_LEN,
    CHAT_ID_LEN,
    MEMBER_OPS_KEY_LEN,
    check_len,
    decode_cursor,
    encode_cursor,
    prefix_end,
)
from store.messages import DEFAULT_PAGE_LIMIT, check_page_limit
from store.rocks import Rocks


@dataclass(frozen=True, slots=True)
class OriginalsPage:
    originals: list[bytes]  # each op's canonical CBOR, as its signer made it
    next_cursor: str | None  # None: nothing more


class Originals:
    """Pages of the signed originals (reads only)."""

    def __init__(self, rocks: Rocks) -> None:
        self._rocks = rocks

    def member_ops_page(
        self, chat_id: bytes, cursor: str | None = None, limit: int = DEFAULT_PAGE_LIMIT
    ) -> OriginalsPage:
        """The chat's member ops, by (user, stamp); a value is a flag byte and then the op."""
        return self._page("member_ops", MEMBER_OPS_KEY_LEN, 1, chat_id, cursor, limit)

    def deletes_page(
        self, chat_id: bytes, cursor: str | None = None, limit: int = DEFAULT_PAGE_LIMIT
    ) -> OriginalsPage:
        """The chat's DELETE messages (valid or not yet), by the id they name."""
        return self._page("deletes", BY_REF_KEY_LEN, 0, chat_id, cursor, limit)

    def _page(
        self, cf: str, key_len: int, skip: int, chat_id: bytes, cursor: str | None, limit: int
    ) -> OriginalsPage:
        check_len(chat_id, CHAT_ID_LEN, "chat_id")
        check_page_limit(limit)
        start = chat_id
        if cursor is not None:
            start = decode_cursor(cursor, key_len, chat_id) + b"\x00"  # strictly after it
        originals: list[bytes] = []
        last = b""
        for key, value in self._rocks.iter_range(cf, start, prefix_end(chat_id)):
            if len(originals) == limit:
                return OriginalsPage(originals, encode_cursor(last))
            originals.append(value[skip:])
            last = key
        return OriginalsPage(originals, None)
