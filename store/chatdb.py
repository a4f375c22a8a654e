"""ChatDb: seed 002's store on rocksdict — the composition root of the row stores.

One object per concern, each owning its state, each given what it needs when it is built
(imports point down; no row store inherits from another):

- ``rocks`` (``store.rocks.Rocks``): the Rdict, its CFs, batches, gets and scans;
- ``metas`` (``store.metas``): each chat's ChatMeta and its cache;
- ``events`` (``store.events``): this node's event log — the stores whose writes make
  something readable write through it;
- ``unread`` (``store.unread``): the chat list's unread counters, kept by the writes that
  change what they count;
- ``view_rows`` (``store.view_rows``): what a page shows of each message its edits and
  reactions change, kept by the writes that change what they fold;
- ``hidden``, ``messages``, ``receipts`` (``store.reads``), ``members``, ``deletes``,
  ``inbox``, ``identities``, ``views``, ``feeds``, ``originals``: the row stores;
- ``member_index`` (``store.member_index``): member ops by the user they name (sync's INDEX);
- ``admission`` (``store.admission``): plans (``store.plan``) carried out over them;
- ``reads`` (``store.chat_reads.ChatReads``): the HTTP API's typed, read-only facade.

The rest of the code base (the node's writer, sync, the GC, the simulator, the tests) calls
a ChatDb as it always did: the calls it makes are the row stores' own methods, bound here
once (``_bind``) — no wrapper, so the hot path (``apply_ops`` -> ``put_messages``) costs
what a method of the old mixin class did. Each behaviour is written once, in its row store.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

from store.admission import Admission
from store.chat_reads import ChatReads
from store.deletes import Deletes
from store.events import EventLog
from store.feed import Feeds
from store.hidden import Hidden
from store.identity import Identities
from store.inbox import Inbox
from store.member_index import MemberIndex
from store.members import Members
from store.messages import Messages
from store.metas import Metas
from store.originals import Originals
from store.reads import Receipts
from store.rocks import ChatDbConfig, Rocks
from store.unread import UnreadCounters
from store.view_rows import ViewRows
from store.views import Views


class ChatDb:
    """Seed 002's column families (its read progress gave way to signed receipts) and more:
    the member ops, the hidden index, the messages waiting for their member op, the
    deletes and their sync index, references and the messages referred to, the erased ids,
    the edits and reactions of each held message (``referred``) and what they change of it
    (``views``), the receipts, this
    node's event log (``events``, read as users' feeds: ``store.feed``), the delivered
    positions and the chat list's unread counters (``store.unread``).

    Open with ``ChatDb(ChatDbConfig(path=...))`` or ``ChatDb(path=...)``; use as
    a context manager or call ``close()``. One writer at a time.
    """

    def __init__(self, config: ChatDbConfig | None = None, *, path: str | Path | None = None):
        self.rocks = rocks = Rocks(config, path=path)
        self.config = rocks.config
        self.created_families = rocks.created_families
        self.metas = metas = Metas(rocks)
        self.events = events = EventLog(rocks)
        self.hidden = hidden = Hidden(rocks)
        self.receipts = receipts = Receipts(rocks, metas, hidden)
        self.unread = unread = UnreadCounters(rocks, receipts)
        self.view_rows = view_rows = ViewRows(rocks, hidden)
        self.messages = messages = Messages(rocks, metas, events, hidden, unread, view_rows)
        self.members = members = Members(rocks, metas, events)
        self.member_index = MemberIndex(rocks)
        self.deletes = deletes = Deletes(rocks, events, unread, view_rows)
        self.inbox = inbox = Inbox(rocks, metas, receipts, unread)
        self.identities = identities = Identities(rocks)
        self.admission = Admission(
            rocks, metas, events, hidden, messages, members, deletes, inbox, identities, unread,
            view_rows,
        )  # fmt: skip
        self.views = views = Views(rocks, messages, deletes)
        self.feeds = feeds = Feeds(rocks, metas, events, members, hidden, receipts)
        self.originals = originals = Originals(rocks)
        self.reads = ChatReads(
            messages, views, inbox, receipts, feeds, events, identities, members,
            self.member_index, originals,
        )  # fmt: skip
        self._bind()
        if {"referred", "receipts"} & rocks.created_families:  # written by an earlier version
            messages.rebuild_reference_indexes()
            self.admission.refresh_previews(set(metas.chat_ids()))
        if "views" in rocks.created_families:  # written before the view rows
            view_rows.rebuild()

    def _bind(self) -> None:
        """The row stores' methods the rest of the code base calls on a ChatDb."""
        rocks, metas, events, messages = self.rocks, self.metas, self.events, self.messages
        # plumbing (tools and tests)
        self.memory_usage = rocks.memory_usage
        self.flush = rocks.flush
        self.compact = rocks.compact
        self.new_batch = rocks.new_batch
        self.write = events.write
        self.get = rocks.get
        self.multi_get = rocks.multi_get
        self.iter_all = rocks.iter_all
        self.iter_prefix = rocks.iter_prefix
        self.load_meta = metas.load
        self.get_chat_meta = metas.get
        # the event log
        self.add_listener = events.add_listener
        # messages
        self.put_message = messages.put_message
        self.put_messages = messages.put_messages
        self.has_message = messages.has_message
        self.held_messages = messages.held_messages
        self.get_message = messages.get_message
        self.range = messages.range
        self.iter_msg_ids = messages.iter_msg_ids
        self.for_each_msg_id = messages.for_each_msg_id
        self.get_bucket_msg_ids = messages.get_bucket_msg_ids
        self.msg_chats = messages.msg_chats
        self.iter_msg_chats = messages.iter_msg_chats
        self.get_bucket_msg_ids_filtered = messages.get_bucket_msg_ids_filtered
        self.get_range_msg_ids = messages.get_range_msg_ids
        self.get_ranges_msg_ids = messages.get_ranges_msg_ids
        self.get_ranges_msg_ids_stamped = messages.get_ranges_msg_ids_stamped
        self.get_messages_cbor_batch = messages.get_messages_cbor_batch
        self.get_messages_cbor_batch_filtered = messages.get_messages_cbor_batch_filtered
        self.get_messages_cbor_by_ids = messages.get_messages_cbor_by_ids
        self.for_each_chat_id = messages.for_each_chat_id
        self.range_delete_old_messages = messages.range_delete_old_messages
        self.scan_seen_msg_aged = messages.scan_seen_msg_aged
        self.delete_seen_msg_batch = messages.delete_seen_msg_batch
        # the hidden index, read positions
        self.hidden_chats = self.hidden.chats
        self.read_position = self.receipts.read_position
        self.unread_count = self.receipts.unread_count
        # members (``apply_member_ops``: admission's, the chat lists following)
        members = self.members
        self.add_member_synced = members.add_member_synced
        self.remove_member_synced = members.remove_member_synced
        self.apply_member_record_synced = members.apply_member_record_synced
        self.apply_member_states = members.apply_member_states
        self.chat_proof = members.chat_proof
        self.get_member_record = members.get_member_record
        self.get_member_info = members.get_member_info
        self.is_member = members.is_member
        self.list_members = members.list_members
        self.list_members_with_info = members.list_members_with_info
        self.iter_member_record_ids = members.iter_member_record_ids
        self.iter_member_rows = members.iter_member_rows
        self.for_each_member_record_id = members.for_each_member_record_id
        self.get_bucket_member_ids = members.get_bucket_member_ids
        self.get_range_member_ids = members.get_range_member_ids
        self.get_member_records_batch = members.get_member_records_batch
        self.get_member_records_by_ids = members.get_member_records_by_ids
        # deletes
        deletes = self.deletes
        self.delete_chats = deletes.delete_chats
        self.admin_state = deletes.admin_state
        self.admins = deletes.admins
        self.deletes_of = deletes.deletes_of
        self.is_erased = deletes.is_erased
        self.erasure_pending = deletes.erasure_pending
        self.compact_erased = deletes.compact_erased
        self.iter_delete_ids = deletes.iter_delete_ids
        self.get_bucket_delete_ids = deletes.get_bucket_delete_ids
        self.get_range_delete_ids = deletes.get_range_delete_ids
        self.chats_of_deletes = deletes.chats_of_deletes
        self.iter_delete_chats = deletes.iter_delete_chats
        self.get_deletes_by_ids = deletes.get_deletes_by_ids
        # chat lists
        inbox = self.inbox
        self.upsert_inbox_for_members = inbox.upsert_inbox_for_members
        self.refresh_inboxes = inbox.refresh_inboxes
        self.chat_lists_stale = inbox.chat_lists_stale
        self.flush_chat_lists = inbox.flush_chat_lists
        self.delete_user_inbox_entry = inbox.delete_user_inbox_entry
        self.list_user_chats = inbox.list_user_chats
        # identities
        identities = self.identities
        self.put_identity = identities.put_identity
        self.put_identities = identities.put_identities
        self.get_identity = identities.get_identity
        self.iter_identity_record_ids = identities.iter_identity_record_ids
        self.iter_identity_users = identities.iter_identity_users
        self.identity_users_of = identities.users_of
        self.iter_home_nodes = identities.iter_home_nodes
        self.for_each_identity_record_id = identities.for_each_identity_record_id
        self.get_bucket_identity_ids = identities.get_bucket_identity_ids
        self.get_range_identity_ids = identities.get_range_identity_ids
        self.get_identity_records_batch = identities.get_identity_records_batch
        self.get_identity_records_by_ids = identities.get_identity_records_by_ids
        # admission: plans carried out
        admission = self.admission
        self.apply_ops = admission.apply_ops
        self.put_authorized = admission.put_authorized
        self.apply_member_ops = admission.apply_member_ops
        self.access_of = admission.access_of
        self.chat_messages = admission.chat_messages
        self.save_waiting = admission.save_waiting
        self.load_waiting = admission.load_waiting
        # views, feeds, originals
        self.folded_range = self.views.folded_range
        feeds = self.feeds
        self.may_read = feeds.may_read
        self.acknowledge = feeds.acknowledge
        self.delivered = feeds.delivered
        self.delivery = feeds.delivery
        self.feed = feeds.feed
        self.shown_messages = feeds.shown_messages
        self.log_page = feeds.log_page
        self.member_ops_page = self.originals.member_ops_page
        self.deletes_page = self.originals.deletes_page

    @property
    def expire_before_ms(self) -> int | None:
        """The retention cutoff: ``Messages.expire_before_ms`` (``store.retention`` moves it)."""
        return self.messages.expire_before_ms

    @expire_before_ms.setter
    def expire_before_ms(self, cutoff_ms: int | None) -> None:
        self.messages.expire_before_ms = cutoff_ms

    @property
    def last_position(self) -> int:
        """The newest event's position (0: none yet)."""
        return self.events.last_position

    def close(self) -> None:
        """Point the chat lists at what waits for them, then close RocksDB (twice: a no-op)."""
        try:
            if not self.rocks.closed:
                self.inbox.flush_chat_lists()
        finally:
            self.rocks.close()

    def __enter__(self) -> ChatDb:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
