"""ChatDb: seed 002's store on rocksdict — one object, one concern per mixin module."""

from __future__ import annotations

from store.admission import AdmissionStore
from store.identity import IdentityStore


class ChatDb(AdmissionStore, IdentityStore):
    """Twelve column families: seed 002's nine, the member ops, the hidden index and the
    messages waiting for their member op.

    Open with ``ChatDb(ChatDbConfig(path=...))`` or ``ChatDb(path=...)``; use as
    a context manager or call ``close()``. One writer at a time.
    """

    def __enter__(self) -> ChatDb:
        return self
