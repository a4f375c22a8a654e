"""ChatDb: seed 002's store on rocksdict — one object, one concern per mixin module."""

from __future__ import annotations

from pathlib import Path

from store.feed import FeedStore
from store.identity import IdentityStore
from store.originals import OriginalsStore
from store.rocks import ChatDbConfig


class ChatDb(FeedStore, IdentityStore, OriginalsStore):
    """Seed 002's column families (its read progress gave way to signed receipts) and eleven
    more: the member ops, the hidden index, the messages waiting for their member op, the
    deletes and their sync index, references and the messages referred to, the erased ids,
    the edits and reactions of each held message (``referred``), the receipts, and this
    node's event log (``events``, read as users' feeds: ``store.feed``).

    Open with ``ChatDb(ChatDbConfig(path=...))`` or ``ChatDb(path=...)``; use as
    a context manager or call ``close()``. One writer at a time.
    """

    def __init__(self, config: ChatDbConfig | None = None, *, path: str | Path | None = None):
        super().__init__(config, path=path)
        if {"referred", "receipts"} & self.created_families:  # written by an earlier version
            self.rebuild_reference_indexes()
            self.refresh_previews({chat for chat, _ in self.iter_all("chats_meta")})

    def __enter__(self) -> ChatDb:
        return self
