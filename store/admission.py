"""Admission: the message rule of ``store.access`` applied to the store.

``put_authorized`` stores the messages their chat's ops admit — marking the
ones their sender was not active to send as hidden — and hands back the rest
to wait (``store.waiting``; the ``waiting`` column family keeps them across a
restart). ``reconsider`` runs after member ops changed some
senders' histories: it re-decides those senders' messages stamped at or after
the earliest new op, and when a chat's hidden set changed, points the chat's
preview (ChatMeta's newest message, the members' chat-list entries) at its
newest shown message again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from store.access import Access, admissible, visible
from store.deletes import DeleteStore
from store.events import Event, EventKind
from store.hlc import LOGICAL_BITS, Hlc
from store.inbox import InboxStore
from store.keys import key_hidden, key_messages, prefix_end, seq_of
from store.kinds import CONTENT
from store.members import MemberOpsApplied
from store.messages import Direction, PutResult
from store.ops import MembershipOp
from store.records import ChatKind, InboxEntry, MessageKind, MsgV1, decode_msg, make_chat_meta

ZERO_ID = bytes(32)


@dataclass(frozen=True, slots=True)
class Admitted:
    """What ``put_authorized`` did: per message its result (a delete's: seq 0; a message a
    delete erased before it came: duplicate), or None if it waits; the waiting messages;
    the ids of held messages that a delete of the batch erased."""

    results: Sequence[PutResult | None]
    waiting: list[MsgV1]
    erased: list[bytes]


class AdmissionStore(DeleteStore, InboxStore):
    def apply_member_ops(self, ops: list[MembershipOp]) -> MemberOpsApplied:
        """``MemberStore.apply_member_ops``, and the chat lists follow: a user who stops being
        an active member loses the chat's entry, one who becomes one gets it (MESSAGES.md)."""
        applied = super().apply_member_ops(ops)
        for chat, user, active in applied.toggled:
            if not active:
                self.delete_user_inbox_entry(user, chat)
                continue
            entry = self._preview_entry(chat)
            if entry is not None:
                self.upsert_inbox_for_members(chat, [user], entry)
        return applied

    def access_of(self, chat_id: bytes, user_id: bytes) -> Access:
        return Access(self.member_history(chat_id, user_id), self.load_meta(chat_id).identity)

    def put_authorized(
        self, msgs: list[MsgV1], *, now_ms: int | None = None, admit_all: bool = False
    ) -> Admitted:
        """Store the admissible messages — the deletes among them first, which may erase
        held messages (``store.deletes``) — and point the chat lists of their chats at
        what is new; per message its result, or None if it must wait. ``admit_all``: store
        and show every message (the sync engine on its own, as protocol tests and the sync
        benchmark drive it)."""
        admitted, hidden, waiting = (msgs, set(), []) if admit_all else self._admit(msgs)
        deletes = [m for m in admitted if m.kind is MessageKind.DELETE]
        new_deletes, erased = self.put_deletes(deletes) if deletes else ([], [])
        if deletes:
            admitted = [m for m in admitted if m.kind is not MessageKind.DELETE]
        # what a held delete erases is neither stored nor left to wait: it could never be stored
        later = [m for m in waiting if m.kind is not MessageKind.DELETE]
        gone = self.erased_on_arrival(admitted + later)
        if gone:
            admitted = [m for m in admitted if m.msg_id not in gone]
            waiting = [m for m in waiting if m.msg_id not in gone]
        stored = self._store_admitted(admitted, hidden, now_ms)
        if erased:
            self.refresh_previews({m.chat_id for m in deletes})
        if len(stored) == len(msgs):
            return Admitted(stored, waiting, erased)
        waits = {m.msg_id for m in waiting}
        stored_left, deletes_left = iter(stored), iter(new_deletes)
        results: list[PutResult | None] = []
        for m in msgs:  # the lists above keep the batch's order
            if m.msg_id in waits:
                results.append(None)
            elif m.kind is MessageKind.DELETE:
                results.append(PutResult(m.msg_id, 0, not next(deletes_left)))
            elif m.msg_id in gone:
                results.append(PutResult(m.msg_id, 0, True))
            else:
                results.append(next(stored_left))
        return Admitted(results, waiting, erased)

    def _admit(self, msgs: list[MsgV1]) -> tuple[list[MsgV1], set[bytes], list[MsgV1]]:
        """(admissible, the ids of those not to show, those that must wait): store.access."""
        access: dict[tuple[bytes, bytes], Access] = {}
        admitted: list[MsgV1] = []
        hidden: set[bytes] = set()
        waiting: list[MsgV1] = []
        for msg in msgs:
            pair = (msg.chat_id, msg.sender)
            known = access.get(pair)
            if known is None:
                known = access[pair] = self.access_of(*pair)
            if not admissible(msg, known):
                waiting.append(msg)
                continue
            admitted.append(msg)
            if known.history.removes and not visible(msg, known):  # no removal: it shows
                hidden.add(msg.msg_id)
        return admitted, hidden, waiting

    def _store_admitted(
        self, msgs: list[MsgV1], hidden: set[bytes], now_ms: int | None = None
    ) -> list[PutResult]:
        """One put_messages batch; the chat lists then point at the new shown messages."""
        previous = {m.chat_id: self.load_meta(m.chat_id).last_ts for m in msgs}
        stored = self.put_messages(msgs, now_ms=now_ms, hidden=hidden)
        shown = [
            m
            for m, r in zip(msgs, stored, strict=True)
            if not r.duplicate and m.msg_id not in hidden
        ]
        if shown:
            self.refresh_inboxes(shown, previous)
        return stored

    def chat_messages(self, chat_id: bytes) -> list[tuple[MsgV1, bool]]:
        """Every held message of the chat, oldest first, and whether it is shown."""
        hidden = self.hidden_seqs(chat_id)
        return [
            (decode_msg(value, trusted=True), seq_of(key) not in hidden)
            for key, value in self.iter_prefix("messages", chat_id)
        ]

    # --- what waits (store.waiting), kept so that a restart loses none of it ---

    def save_waiting(self, held: list[MsgV1], dropped: list[bytes]) -> None:
        """The waiting room's change: ``held`` now waits, the ids ``dropped`` no longer do."""
        batch = self.new_batch()
        waiting_cf = self._handle["waiting"]
        for msg_id in dropped:
            batch.delete(msg_id, waiting_cf)
        for msg in held:
            batch.put(msg.msg_id, msg.encoded, waiting_cf)
        if batch.len():
            self.write(batch)

    def load_waiting(self) -> list[MsgV1]:
        """The messages waiting when the store was last written (verified when they came)."""
        return [decode_msg(value, trusted=True) for _, value in self.iter_all("waiting")]

    def reconsider(self, touched: dict[tuple[bytes, bytes], Hlc]) -> set[bytes]:
        """Re-decide the messages of each (chat, sender) from the stamp given; returns the
        chats whose hidden set changed (their previews were refreshed)."""
        by_chat: dict[bytes, dict[bytes, Hlc]] = {}
        for (chat, user), since in touched.items():
            by_chat.setdefault(chat, {})[user] = since
        changed = {
            chat for chat, senders in by_chat.items() if self._reconsider_chat(chat, senders)
        }
        for chat in changed:
            self._refresh_preview(chat)
        return changed

    def _reconsider_chat(self, chat_id: bytes, senders: dict[bytes, Hlc]) -> bool:
        start = key_messages(chat_id, min(senders.values()).pack(), 0)
        meta = self.load_meta(chat_id)
        access = {
            user: Access(self.member_history(chat_id, user), meta.identity) for user in senders
        }
        hidden = self.hidden_seqs(chat_id)
        batch = self.new_batch()
        added: list[bytes] = []
        events: list[Event] = []  # shown after all, or hidden now: for this node's event log
        hidden_cf = self._handle["hidden"]
        for key, value in self.iter_range("messages", start, prefix_end(chat_id)):
            msg = decode_msg(value, trusted=True)
            since = senders.get(msg.sender)
            if since is None or msg.hlc < since:
                continue
            seq = seq_of(key)
            shown = visible(msg, access[msg.sender])
            if shown and seq in hidden:
                batch.delete(key_hidden(chat_id, seq), hidden_cf)
                events.append((EventKind.MESSAGE, key))
            elif not shown and seq not in hidden:
                added.append(key_hidden(chat_id, seq))
                batch.put(added[-1], key, hidden_cf)
                events.append((EventKind.HIDDEN, key))
        if batch.len() == 0:
            return False
        self.write(batch, events)
        self._note_hidden_chats(added)
        return True

    def refresh_previews(self, chat_ids: set[bytes]) -> None:
        """After erasures: each chat's preview at its newest shown message again."""
        for chat in chat_ids:
            self._refresh_preview(chat)

    def _refresh_preview(self, chat_id: bytes) -> None:
        """ChatMeta's newest message := the chat's newest shown content message; the members'
        entries too."""
        meta = self.load_meta(chat_id)
        page = self.range(chat_id, limit=1, direction=Direction.BACKWARD, kinds=CONTENT)
        newest = page.items[0].msg if page.items else None
        packed, msg_id = (newest.hlc.pack(), newest.msg_id) if newest else (0, ZERO_ID)
        # meta_after_messages only moves forward; a preview may move back to an older message
        fresh = make_chat_meta(
            packed >> LOGICAL_BITS, meta.last_seq, msg_id, meta.members, packed,
            meta.last_announced_ms, meta.identity, meta.membership_hash,
        )  # fmt: skip
        batch = self.new_batch()
        self.put_metas(batch, {chat_id: fresh})
        self.write(batch)
        self.remember_meta({chat_id: fresh})
        entry = self._preview_entry(chat_id)
        if entry is not None:
            self.upsert_inbox_for_members(
                chat_id, meta.members, entry, previous_last_ts=meta.last_ts
            )

    def _preview_entry(self, chat_id: bytes) -> InboxEntry | None:
        """The chat's chat-list entry as its meta stands (None: no message to show yet)."""
        meta = self.load_meta(chat_id)
        newest = self.get_message(meta.last_msg_id) if meta.last_msg_id != ZERO_ID else None
        if newest is None:
            return None
        kind = ChatKind.DM if meta.identity is not None else ChatKind.GROUP
        return InboxEntry(
            chat_id, kind, meta.last_ts, meta.last_msg_id, newest.sender, meta.last_seq
        )
