"""ChatReads: what the HTTP API reads from the store, and nothing else.

The API (``node/api``) is given a ``ChatReads``, never a ChatDb: every write it asks for goes
through the node's writer (``NodeApi.submit_ops``). The type is the guard: each attribute
here is a read method of a row store, bound when the ChatDb is built, and the facade keeps
no reference to a store itself — so mypy refuses ``reads.put_messages(...)`` and there is
no ``reads.messages`` to reach a write through. A call costs what the row store's method
costs (no wrapper). ``tests/store/test_chat_reads.py`` pins the list.
"""

from __future__ import annotations

from collections.abc import Callable

from store.events import EventLog
from store.feed import Feeds
from store.identity import Identities
from store.inbox import Inbox
from store.member_index import MemberIndex
from store.members import Members
from store.messages import Messages
from store.originals import Originals
from store.reads import Receipts
from store.views import Views


class ChatReads:
    """The read view of a ChatDb the HTTP API gets (reads only, enforced by the type)."""

    def __init__(
        self,
        messages: Messages,
        views: Views,
        inbox: Inbox,
        receipts: Receipts,
        feeds: Feeds,
        events: EventLog,
        identities: Identities,
        members: Members,
        member_index: MemberIndex,
        originals: Originals,
    ) -> None:
        # a chat's history
        self.range = messages.range
        self.get_message = messages.get_message
        self.folded_range = views.folded_range
        self.hidden_grants = messages.hidden_grants
        # a user's chats, read positions, unread counts
        # reads only: the node's writer first writes the moves that wait (settle_chat_lists)
        self.read_user_chats = inbox.read_user_chats
        self.read_position = receipts.read_position
        self.unread_count = receipts.unread_count
        # feeds and delivery
        self.may_read = feeds.may_read
        self.feed = feeds.feed
        self.log_page = feeds.log_page
        self.delivery = feeds.delivery
        self.delivered = feeds.delivered
        self.shown_messages = feeds.shown_messages
        # identities, members, signed originals
        self.get_identity = identities.get_identity
        self.list_members_with_info = members.list_members_with_info
        self.chat_proof = members.chat_proof
        self.indexed_members = member_index.indexed_members  # of chats not held too
        self.member_ops_page = originals.member_ops_page
        self.deletes_page = originals.deletes_page
        self._position: Callable[[], int] = lambda: events.last_position

    @property
    def last_position(self) -> int:
        """The newest event's position in this node's log (0: none yet)."""
        return self._position()
