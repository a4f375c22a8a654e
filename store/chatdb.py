"""ChatDb: seed 002's store on rocksdict — one object, one concern per mixin module."""

from __future__ import annotations

from pathlib import Path

from store.identity import IdentityStore
from store.rocks import ChatDbConfig
from store.views import ViewStore


class ChatDb(ViewStore, IdentityStore):
    """Seed 002's column families (its read progress gave way to signed receipts) and ten
    more: the member ops, the hidden index, the messages waiting for their member op, the
    deletes and their sync index, references and the messages referred to, the erased ids,
    the edits and reactions of each held message (``referred``), and the receipts.

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
