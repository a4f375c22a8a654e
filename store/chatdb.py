"""ChatDb: seed 002's store on rocksdict — one object, one concern per mixin module."""

from __future__ import annotations

from store.identity import IdentityStore
from store.inbox import InboxStore
from store.members import MemberStore
from store.messages import MessageStore


class ChatDb(MessageStore, MemberStore, IdentityStore, InboxStore):
    """The nine column families and every operation of seed 002.

    Open with ``ChatDb(ChatDbConfig(path=...))`` or ``ChatDb(path=...)``; use as
    a context manager or call ``close()``. One writer at a time.
    """

    def __enter__(self) -> ChatDb:
        return self
