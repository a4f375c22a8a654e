"""Admission: the row stores planned (``store.plan``) and carrying its plans out.

``apply_ops`` plans a batch of validated ops against ``DbView`` — the planner's
read view of the store and of the waiting room beside it — and carries the plan
out: member ops (rows and chat lists follow), identities, deletes and their
erasures (``store.deletes``), the admitted messages — the hidden ones marked —
with the chat lists pointed at what is new, the waiting room (its ``waiting``
column family keeps it across a restart), and ``reconsider`` for the senders
whose histories grew: their messages stamped at or after the earliest new op
are shown or hidden again, and when a chat's hidden set changed, its preview
(ChatMeta's newest message, the members' chat-list entries) points at its newest
shown message again.

``Admission`` is the one row store that takes the others (messages, members, deletes,
chat lists, identities): carrying a plan out is calling each in turn. What it writes itself
has no other owner — the re-decided hidden rows, the refreshed previews, the waiting room —
and ``DbView`` reads the stores it is given, never a ChatDb.
"""

from __future__ import annotations

from collections.abc import Sequence

from store.access import Access, MemberHistory, visible
from store.deletes import Deletes
from store.events import Event, EventKind, EventLog
from store.hidden import Hidden
from store.hlc import LOGICAL_BITS, Hlc
from store.identity import Identities
from store.inbox import ZERO_MSG_ID, Inbox
from store.keys import (
    CHAT_ID_LEN,
    MESSAGES_KEY_LEN,
    MSG_ID_LEN,
    key_hidden,
    key_messages,
    prefix_end,
    seq_of,
)
from store.kinds import CHANGES_TARGET, CONTENT
from store.members import MemberOpsApplied, Members
from store.messages import Direction, Messages
from store.metas import Metas
from store.ops import MembershipOp, Op
from store.plan import CHAT_RULES, AdminState, MessageRule, Plan, RuleSet, plan_ops
from store.records import MessageKind, MsgV1, decode_msg, make_chat_meta
from store.rocks import Rocks
from store.unread import UnreadCounters
from store.view_rows import ViewRows
from store.waiting import WaitingRoom


class DbView:
    """The ``store.plan.HeldView`` of the row stores (and of the waiting room beside them):
    reads only, made by ``Admission`` for each batch it plans."""

    def __init__(
        self,
        rocks: Rocks,
        metas: Metas,
        messages: Messages,
        members: Members,
        deletes: Deletes,
        identities: Identities,
        room: WaitingRoom | None,
    ) -> None:
        self._rocks, self._metas, self._messages = rocks, metas, messages
        self._members, self._deletes, self._identities = members, deletes, identities
        self.room = room
        self.expire_before_ms = self._messages.expire_before_ms

    def held(self, msgs: Sequence[MsgV1]) -> set[bytes]:
        multi_get = self._rocks.multi_get
        deletes = [m.msg_id for m in msgs if m.kind is MessageKind.DELETE]
        others = [m.msg_id for m in msgs if m.kind is not MessageKind.DELETE]
        out = {i for i, v in zip(others, multi_get("seen_msg", others), strict=True) if v}
        if deletes:
            marks = multi_get("seen_delete", deletes)
            out.update(i for i, v in zip(deletes, marks, strict=True) if v)
        return out

    def held_member_ops(self, op_ids: Sequence[bytes]) -> set[bytes]:
        marks = self._rocks.multi_get("seen_member", list(op_ids))
        return {i for i, v in zip(op_ids, marks, strict=True) if v is not None}

    def identity(self, user: bytes) -> tuple[Hlc, bytes] | None:
        return self._identities.get_identity(user)

    def history(self, chat: bytes, user: bytes) -> MemberHistory:
        return self._members.member_history(chat, user)

    def dm_parties(self, chat: bytes) -> bytes | None:
        return self._metas.load(chat).identity

    def admin_state(self, chat: bytes) -> AdminState:
        return self._deletes.admin_state(chat)

    def has_deletes(self, chat: bytes) -> bool:
        return chat in self._deletes.delete_chats()

    def deletes_of(self, chat: bytes) -> list[MsgV1]:
        return self._deletes.deletes_of(chat)

    def deletes_referring(self, chat: bytes, ref: bytes) -> list[MsgV1]:
        return self._deletes.deletes_of(chat, ref)

    def referrers(self, chat: bytes, ref: bytes) -> list[bytes]:
        rows = self._rocks.iter_prefix("refs", chat + ref)
        return [row[CHAT_ID_LEN + MSG_ID_LEN :] for row, _ in rows]

    def held_message(self, msg_id: bytes) -> MsgV1 | None:
        return self._messages.get_message(msg_id)

    def is_erased(self, msg_id: bytes) -> bool:
        return self._deletes.is_erased(msg_id)

    def waiting_in(self, chats: set[bytes]) -> list[MsgV1]:
        return self.room.of_chats(chats) if self.room is not None else []


class Admission:
    """Plans and carries them out, over the row stores it is given (their writes are theirs:
    this one writes only the hidden index's re-decisions, the previews and the waiting room)."""

    def __init__(
        self,
        rocks: Rocks,
        metas: Metas,
        log: EventLog,
        hidden: Hidden,
        messages: Messages,
        members: Members,
        deletes: Deletes,
        inbox: Inbox,
        identities: Identities,
        unread: UnreadCounters,
        views: ViewRows,
    ) -> None:
        self._rocks, self._metas, self._log, self._hidden = rocks, metas, log, hidden
        self._messages, self._members, self._deletes = messages, members, deletes
        self._inbox, self._identities, self._unread = inbox, identities, unread
        self._views = views

    def apply_member_ops(self, ops: list[MembershipOp]) -> MemberOpsApplied:
        """``Members.apply_member_ops``, and the chat lists follow (``_follow_toggles``)."""
        applied = self._members.apply_member_ops(ops)
        self._follow_toggles(applied.toggled)
        return applied

    def _follow_toggles(self, toggled: list[tuple[bytes, bytes, bool]]) -> None:
        """A user who stops being an active member loses the chat's entry, one who becomes
        one gets it (MESSAGES.md)."""
        for chat, user, active in toggled:
            if not active:
                self._inbox.delete_user_inbox_entry(user, chat)
                continue
            meta = self._metas.load(chat)
            if meta.last_seq > 0:  # a message stored here: the chat is listed
                self._inbox.mark_stale(chat, meta.last_ts)

    def access_of(self, chat_id: bytes, user_id: bytes) -> Access:
        history = self._members.member_history(chat_id, user_id)
        return Access(history, self._metas.load(chat_id).identity)

    def apply_ops(
        self,
        ops: Sequence[Op],
        room: WaitingRoom | None = None,
        rules: RuleSet = CHAT_RULES,
        *,
        now_ms: int | None = None,
    ) -> Plan:
        """Plan validated ops against what is held (``store.plan``) and carry the plan out:
        the member ops, the identities, the deletes and what they erase, the messages (the
        chat lists kept in step), the waiting room (``room``: kept in the store too, for a
        restart; without one, what must wait is only reported in ``Plan.park``), and the
        held messages whose senders' histories grew, shown or hidden again."""
        view = DbView(
            self._rocks, self._metas, self._messages, self._members, self._deletes,
            self._identities, room,
        )  # fmt: skip
        plan = plan_ops(ops, view, rules)
        self._carry_out(plan, room, rules, now_ms)
        return plan

    def put_authorized(self, msgs: list[MsgV1], *, now_ms: int | None = None) -> Plan:
        """Messages alone under the message rule (tools and tests): ``apply_ops``."""
        return self.apply_ops(msgs, now_ms=now_ms)

    def _carry_out(
        self, plan: Plan, room: WaitingRoom | None, rules: RuleSet, now_ms: int | None
    ) -> None:
        """The replicated state the plan changes — member ops and their rows, identities,
        deletes and erasures, messages (hidden ones marked), the waiting room — in one
        WriteBatch; then the local views folded from it, each read from what is written:
        chat lists, previews, the held messages re-decided."""
        msgs = list(plan.store.values())
        previous = {m.chat_id: self._metas.load(m.chat_id).last_ts for m in msgs}
        toggled: list[tuple[bytes, bytes, bool]] = []
        try:
            with self._log.one_write():
                if plan.member_ops:
                    toggled = self._members.apply_member_ops(list(plan.member_ops.values())).toggled
                if plan.identities:
                    identities = {u: (b, (r.hlc, r.blob)) for u, (b, r) in plan.identities.items()}
                    self._identities.set_identities(identities)
                erased: set[bytes] = set()  # messages keys: the writes below still read them
                if plan.deletes or plan.erase or plan.refused_erased:
                    deletes = list(plan.deletes.values())
                    erased = self._deletes.write_deletes(deletes, plan.erase, plan.refused_erased)
                if msgs:
                    self._messages.put_messages(
                        msgs, now_ms=now_ms, hidden=plan.hidden, erased=erased
                    )
                if room is not None:
                    self._keep_waiting(plan, room)
        except BaseException:
            self._forget_caches()  # they carried the batch's changes: read from disk again
            raise
        self._deletes.remember_admins(plan.admins)
        self._follow_toggles(toggled)
        if msgs:  # hidden ones too: the entries carry the chat's last seq
            self._inbox.refresh_inboxes(msgs, previous)
        if plan.erase:
            self.refresh_previews({m.chat_id for m in plan.erase.values()})
        if plan.redecide:
            self.reconsider(plan.redecide, rules.visible)

    def _forget_caches(self) -> None:
        self._metas.forget()
        self._members.forget_histories()
        self._deletes.forget()
        self._hidden.forget()
        self._unread.forget()

    def _keep_waiting(self, plan: Plan, room: WaitingRoom) -> None:
        """The room follows the plan, and the store keeps what it holds (for a restart)."""
        released = room.release_chats(plan.released_chats)
        evicted = [msg_id for msg in plan.park for msg_id in room.park(msg)]
        discarded = room.discard(plan.discard)
        if released or plan.park or discarded:
            self.save_waiting(
                [m for m in plan.park if m.msg_id in room],
                [i for i in {*(m.msg_id for m in released), *evicted, *discarded}
                 if i not in room],
            )  # fmt: skip

    def chat_messages(self, chat_id: bytes) -> list[tuple[MsgV1, bool]]:
        """Every held message of the chat, oldest first, and whether it is shown."""
        hidden = self._hidden.seqs(chat_id)
        return [
            (decode_msg(value, trusted=True), seq_of(key) not in hidden)
            for key, value in self._rocks.iter_prefix("messages", chat_id)
        ]

    # --- what waits (store.waiting), kept so that a restart loses none of it ---

    def save_waiting(self, held: list[MsgV1], dropped: list[bytes]) -> None:
        """The waiting room's change: ``held`` now waits, the ids ``dropped`` no longer do."""
        batch = self._rocks.new_batch()
        waiting_cf = self._rocks.handle["waiting"]
        for msg_id in dropped:
            batch.delete(msg_id, waiting_cf)
        for msg in held:
            batch.put(msg.msg_id, msg.encoded, waiting_cf)
        if batch.len():
            self._rocks.write(batch)

    def load_waiting(self) -> list[MsgV1]:
        """The messages waiting when the store was last written (verified when they came)."""
        return [decode_msg(value, trusted=True) for _, value in self._rocks.iter_all("waiting")]

    def reconsider(
        self, touched: dict[tuple[bytes, bytes], Hlc], shown: MessageRule = visible
    ) -> set[bytes]:
        """Re-decide the messages of each (chat, sender) from the stamp given (``shown``:
        the rule); returns the chats whose hidden set changed (previews refreshed)."""
        by_chat: dict[bytes, dict[bytes, Hlc]] = {}
        for (chat, user), since in touched.items():
            by_chat.setdefault(chat, {})[user] = since
        changed = {
            chat for chat, senders in by_chat.items() if self._reconsider_chat(chat, senders, shown)
        }
        for chat in changed:
            self._refresh_preview(chat)
        return changed

    def _reconsider_chat(
        self, chat_id: bytes, senders: dict[bytes, Hlc], visible: MessageRule
    ) -> bool:
        start = key_messages(chat_id, min(senders.values()).pack(), 0)
        meta = self._metas.load(chat_id)
        history = self._members.member_history
        access = {user: Access(history(chat_id, user), meta.identity) for user in senders}
        hidden = self._hidden.seqs(chat_id)
        batch = self._rocks.new_batch()
        added: list[bytes] = []
        events: list[Event] = []  # shown after all, or hidden now: for this node's event log
        hidden_cf = self._rocks.handle["hidden"]
        now_hidden = set(hidden)  # once the batch is written
        toggled_refs: list[bytes] = []  # what the edits and reactions shown or hidden refer to
        for key, value in self._rocks.iter_range("messages", start, prefix_end(chat_id)):
            msg = decode_msg(value, trusted=True)
            since = senders.get(msg.sender)
            if since is None or msg.hlc < since:
                continue
            seq = seq_of(key)
            shown = visible(msg, access[msg.sender])
            if shown and seq in hidden:
                batch.delete(key_hidden(chat_id, seq), hidden_cf)
                events.append((EventKind.MESSAGE, key, msg.msg_id))  # seen_msg: its position
                now_hidden.discard(seq)
            elif not shown and seq not in hidden:
                added.append(key_hidden(chat_id, seq))
                batch.put(added[-1], key, hidden_cf)
                events.append((EventKind.HIDDEN, key))
                now_hidden.add(seq)
            else:
                continue
            if msg.kind in CHANGES_TARGET and msg.ref is not None:
                toggled_refs.append(msg.ref)
        if batch.len() == 0:
            return False
        self._unread.void(batch, [chat_id])  # messages hidden or shown: recounted when next listed
        if toggled_refs:  # their targets' view rows: folded again with the new hidden set
            seen = self._rocks.multi_get("seen_msg", toggled_refs)
            targets: dict[bytes, MsgV1 | None] = {
                value[:MESSAGES_KEY_LEN]: None
                for value in seen
                if value is not None and value[:CHAT_ID_LEN] == chat_id
            }
            self._views.refresh(batch, targets, hidden={chat_id: now_hidden})
        try:
            self._log.write(batch, events)
        except BaseException:
            self._unread.forget()
            raise
        self._hidden.note(added)
        return True

    def refresh_previews(self, chat_ids: set[bytes]) -> None:
        """After erasures: each chat's preview at its newest shown message again."""
        for chat in chat_ids:
            self._refresh_preview(chat)

    def _refresh_preview(self, chat_id: bytes) -> None:
        """ChatMeta's newest message := the chat's newest shown content message; the members'
        entries too."""
        meta = self._metas.load(chat_id)
        page = self._messages.range(chat_id, limit=1, direction=Direction.BACKWARD, kinds=CONTENT)
        newest = page.items[0].msg if page.items else None
        packed, msg_id = (newest.hlc.pack(), newest.msg_id) if newest else (0, ZERO_MSG_ID)
        # meta_after_messages only moves forward; a preview may move back to an older message
        fresh = make_chat_meta(
            packed >> LOGICAL_BITS, meta.last_seq, msg_id, meta.members, packed,
            meta.last_announced_ms, meta.identity, meta.membership_hash,
        )  # fmt: skip
        batch = self._rocks.new_batch()
        self._metas.put(batch, {chat_id: fresh})
        self._rocks.write(batch)
        self._metas.remember({chat_id: fresh})
        self._inbox.mark_stale(chat_id, meta.last_ts)
