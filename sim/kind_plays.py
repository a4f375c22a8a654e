"""The generator's message-kind scenarios: edits, deletes, reactions and read receipts
(MESSAGES.md), each aimed at a rule's edge:

* ``edit``: mostly by the target's author, now and then by someone else (it must not
  apply); often a second edit by the author from another device moments later, so two
  edits race and reach nodes in different orders (the latest by (hlc, id) wins);
* ``delete``: by the author, by an admin (the creator or an admin add), by a member who
  is neither (invalid); a share with lying claims (wrong sender, stamp or kind, or a stamp
  after the delete's own); often with an edit by the author racing it from another node;
* ``delete_across`` (one per partition episode): a delete on one side, the author's edit
  of the same message on the other;
* ``old_delete``: a delete of a message near the retention cutoff (the GC and the erasure
  meet), with a reaction after it;
* ``delete_stranger``: the creator deletes a stranger's post (never admitted: it waits);
* ``promote``: the creator makes a member an admin, and the new admin deletes someone
  else's message moments later from another node — the delete may arrive before the
  admin add and must erase once it does;
* ``react``: a reaction with a key from a small set (one opaque), or the retraction of an
  earlier one, sometimes toggled again from another device at once;
* ``receipt``: a read position at a post of the chat, now and then behind an earlier one.

Every choice is a draw from the planner's seeded generator, in time order.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

from sim import scenarios
from sim.opspec import OpSpec as Target  # a planned message: index, t_ms, node, author, hlc
from store import trace as tr
from store.hlc import Hlc
from store.kinds import Claims, reaction_payload
from store.records import MessageKind, Role

WEIGHTS = {
    "edit": 0.05,
    "delete": 0.03,
    "old_delete": 0.006,
    "promote": 0.004,
    "react": 0.05,
    "receipt": 0.03,
    "delete_stranger": 0.003,
}
REACTION_KEYS = (b"+1", "\u2764".encode(), b"\x00opaque-hmac-of-key\xff")
RACE_MS = 400  # a racing edit or toggle follows within this: less than gossip's delay + jitter
RECENT = 30  # targets are drawn from a chat's last posts
STEADY_MS = scenarios.STEADY_MS  # an op's origin does not crash for this long


class KindPlan(Protocol):
    rng: random.Random
    members: list[list[int]]  # each chat's first members; [0] is the creator
    roster: list[set[int]]
    admins: list[set[int]]
    posts: list[list[Target]]
    strangers: list[int]  # users no chat ever adds

    def later(self, t_ms: int, step: Callable[[int], object]) -> None: ...

    def origin(self, user: int, t: int, row_op: bool = False) -> int: ...

    def usable(self, node: int, t: int, row_op: bool = False) -> bool: ...

    def steady(self, node: int, t_ms: int, steady_ms: int) -> bool: ...

    def steady_node(self, t_ms: int, ahead_of: int, steady_ms: int) -> int | None: ...

    def across(self, node: int, t_ms: int) -> int: ...

    def message(
        self,
        t_ms: int,
        node: int,
        author: int,
        chat: int,
        kind: MessageKind,
        target: Target | None = None,
        payload: bytes | None = None,
    ) -> Target: ...

    def user_id(self, user: int) -> bytes: ...

    def retention_ms(self) -> int: ...

    def grain_ms(self) -> int: ...

    def _member(
        self, t: int, node: int, kind: str, actor: int, chat: int, target: int, role: int
    ) -> int: ...


class KindPlays:
    def __init__(self, plan: KindPlan, chats: int) -> None:
        self.plan = plan
        self.chats = chats
        self.reacted: dict[tuple[int, int, bytes], bool] = {}  # (user, post, key) -> on

    def start(self, kind: str, t_ms: int) -> None:
        {
            "edit": self.edit,
            "delete": self.delete,
            "old_delete": self.old_delete,
            "promote": self.promote,
            "react": self.react,
            "receipt": self.receipt,
            "delete_stranger": self.delete_stranger,
        }[kind](t_ms)

    # --- choices ---

    def _chat_and_target(self, t_ms: int) -> tuple[int, Target] | None:
        plan = self.plan
        chat = plan.rng.randrange(self.chats)
        posts = [p for p in plan.posts[chat][-RECENT:] if p.t_ms < t_ms]
        return (chat, plan.rng.choice(posts)) if posts else None

    def _member(self, chat: int) -> int:
        plan = self.plan
        return plan.rng.choice(sorted(plan.roster[chat]) or plan.members[chat])

    def _non_admin(self, chat: int, besides: int) -> int | None:
        plan = self.plan
        creator = plan.members[chat][0]
        pool = sorted(plan.roster[chat] - plan.admins[chat] - {creator, besides})
        return plan.rng.choice(pool) if pool else None

    def _send(
        self,
        t_ms: int,
        user: int,
        chat: int,
        kind: MessageKind,
        target: Target,
        payload: bytes | None = None,
        node: int | None = None,
    ) -> Target:
        plan = self.plan
        if node is None or not plan.usable(node, t_ms):  # chosen earlier: it may be down now
            node = plan.origin(user, t_ms)
        if not plan.steady(node, t_ms, STEADY_MS):
            # An op no add admits yet waits at its origin, and a crash there would lose it
            # (SIM.md, findings): the oracle does not model that, so keep off crashing nodes.
            node = plan.steady_node(t_ms, node, STEADY_MS) or node
        return plan.message(t_ms, node, user, chat, kind, target, payload)

    # --- edits ---

    def edit(self, t_ms: int) -> None:
        plan = self.plan
        picked = self._chat_and_target(t_ms)
        if picked is None:
            return
        chat, target = picked
        editor = target.author if plan.rng.random() < 0.8 else self._member(chat)
        first = self._send(t_ms, editor, chat, MessageKind.EDIT, target)
        if editor == target.author and plan.rng.random() < 0.5:
            self._race_edit(t_ms, chat, target, first.node)

    def _race_edit(self, t_ms: int, chat: int, target: Target, near: int) -> None:
        """The author edits again from another device, before the first edit got there."""
        plan = self.plan
        other = plan.across(near, t_ms)
        plan.later(
            t_ms + plan.rng.randrange(RACE_MS),
            lambda t: self._send(t, target.author, chat, MessageKind.EDIT, target, node=other),
        )

    # --- deletes ---

    def delete(self, t_ms: int) -> None:
        picked = self._chat_and_target(t_ms)
        if picked is not None:
            self._delete(t_ms, *picked)

    def _delete(self, t_ms: int, chat: int, target: Target, deleter: int | None = None) -> Target:
        plan = self.plan
        if deleter is None:
            roll = plan.rng.random()
            admins = [plan.members[chat][0], *sorted(plan.admins[chat])]
            if roll < 0.45:
                deleter = target.author
            elif roll < 0.75:
                deleter = plan.rng.choice(admins)
            else:  # neither the author nor an admin: invalid (unless the draw found none)
                deleter = self._non_admin(chat, target.author) or target.author
        node = plan.origin(deleter, t_ms)
        delete = self._send(
            t_ms, deleter, chat, MessageKind.DELETE, target, self._claims(target), node
        )
        if plan.rng.random() < 0.3:  # the author edits it meanwhile, elsewhere
            self._race_edit(t_ms, chat, target, node)
        return delete

    def _claims(self, target: Target) -> bytes:
        """The target's claims, and in one delete of six a lie."""
        plan = self.plan
        true = self._true_claims(target)
        if plan.rng.random() < 5 / 6:
            return true.encode()
        sender, stamp, kind = true.sender, true.hlc, true.kind
        lie = plan.rng.randrange(4)
        if lie == 0:  # another sender
            sender = plan.user_id(target.author + 1)
        elif lie == 1:  # another stamp (earlier)
            stamp = Hlc.unpack(max(0, target.hlc - (1 << 16)))
        elif lie == 2:  # not content: the delete is invalid
            kind = MessageKind.EDIT
        else:  # a stamp far after the delete: invalid
            stamp = Hlc.unpack(target.hlc + (3_600_000 << 16))
        return Claims(sender, stamp, kind).encode()

    def delete_across(self, t_ms: int) -> None:
        """During a partition: a delete on one side, the author's edit on the other."""
        plan = self.plan
        picked = self._chat_and_target(t_ms)
        if picked is None:
            return
        chat, target = picked
        delete = self._delete(t_ms, chat, target, deleter=target.author)
        other = plan.across(delete.node, t_ms)
        self._send(
            t_ms + plan.rng.randrange(1_000),
            target.author,
            chat,
            MessageKind.EDIT,
            target,
            node=other,
        )

    def old_delete(self, t_ms: int) -> None:
        """A delete of a message about as old as the retention cutoff, and a reaction."""
        plan = self.plan
        cutoff, grain = t_ms - plan.retention_ms(), plan.grain_ms()
        chat = plan.rng.randrange(self.chats)
        old = [p for p in plan.posts[chat] if cutoff - grain <= p.t_ms <= cutoff + 2 * grain]
        if not old:
            return
        target = plan.rng.choice(old)
        self._delete(t_ms, chat, target, deleter=target.author)
        reactor = self._member(chat)
        key = plan.rng.choice(REACTION_KEYS)
        plan.later(
            t_ms + plan.rng.randrange(5_000),
            lambda t: self._send(
                t, reactor, chat, MessageKind.REACTION, target, reaction_payload(key)
            ),
        )

    def delete_stranger(self, t_ms: int) -> None:
        """An admin deletes a stranger's post: valid, and its target never admitted — it
        waits in the waiting rooms of the nodes that received it."""
        plan = self.plan
        chat = plan.rng.randrange(self.chats)
        theirs = [p for p in plan.posts[chat] if p.author in plan.strangers and p.t_ms < t_ms]
        if theirs:
            self._delete(t_ms, chat, plan.rng.choice(theirs), deleter=plan.members[chat][0])

    def promote(self, t_ms: int) -> None:
        """An admin add, and the new admin's delete of another's post from elsewhere."""
        plan = self.plan
        picked = self._chat_and_target(t_ms)
        if picked is None:
            return
        chat, target = picked
        user = self._non_admin(chat, target.author)
        if user is None:
            return
        creator = plan.members[chat][0]
        node = plan.origin(creator, t_ms, row_op=True)
        plan._member(t_ms, node, tr.MEMBER_ADD, creator, chat, user, int(Role.ADMIN))
        deleter_node = plan.across(node, t_ms)
        plan.later(
            t_ms + 1 + plan.rng.randrange(2_000),
            lambda t: self._delete_as(t, chat, target, user, deleter_node),
        )

    def _delete_as(self, t_ms: int, chat: int, target: Target, user: int, node: int) -> None:
        claims = self._true_claims(target).encode()
        self._send(t_ms, user, chat, MessageKind.DELETE, target, claims, node)

    def _true_claims(self, target: Target) -> Claims:
        return Claims(
            self.plan.user_id(target.author), Hlc.unpack(target.hlc), MessageKind(target.msg_kind)
        )

    # --- reactions and receipts ---

    def react(self, t_ms: int) -> None:
        plan = self.plan
        picked = self._chat_and_target(t_ms)
        if picked is None:
            return
        chat, target = picked
        user = self._member(chat)
        key = plan.rng.choice(REACTION_KEYS)
        slot = (user, target.index, key)
        on = not self.reacted.get(slot, False) or plan.rng.random() < 0.3
        self.reacted[slot] = on
        first = self._send(
            t_ms, user, chat, MessageKind.REACTION, target, reaction_payload(key, retract=not on)
        )
        if plan.rng.random() < 0.2:  # toggled back at once from another device
            other = plan.across(first.node, t_ms)
            self.reacted[slot] = not on
            plan.later(
                t_ms + plan.rng.randrange(RACE_MS),
                lambda t: self._send(
                    t,
                    user,
                    chat,
                    MessageKind.REACTION,
                    target,
                    reaction_payload(key, retract=on),
                    other,
                ),
            )

    def receipt(self, t_ms: int) -> None:
        picked = self._chat_and_target(t_ms)
        if picked is None:
            return
        chat, target = picked
        reader = self._member(chat)
        position = Hlc.unpack(target.hlc).to_bytes()
        self._send(t_ms, reader, chat, MessageKind.READ_RECEIPT, target, position)
