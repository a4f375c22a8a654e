"""The generator's group senders: sender keys that follow the membership as each sender saw it.

The client's rule (``client/group_e2e.py``; ``sim/`` may not import ``client/``, so it is
restated here and ``tests/sim/test_sender_keys.py`` keeps the two in step): a sender seals
each group message (NEW, REPLY, EDIT) under its current *epoch*. Before that it starts a new
epoch — a KEYS message granting the epoch's key to the chat's active members as it sees
them, itself included — when it has none, when the members it sees differ from the epoch's
recipients (an add or a removal), or when the epoch is used up (``EPOCH_MESSAGES``,
``EPOCH_MS``). A sender that learns of an add stamped before some of its messages gives the
added member message grants for exactly those (a KEYS message of message grants): when it
next sends, ``KNOW_MS`` after the add, and once more at the end of the workload, when every
op has reached everyone. A sender also starts an epoch when the removals it sees change (an
epoch names them, as the client's grants do). A grant the chat hides (stamped while its
sender was, unknown to it, removed) is read all the same, as the client reads it. A sender
that knows it is no member posts nothing (a removed member's client reads nothing of the
chat, and its node refuses its posts): the posts the workload still makes for it stay plain
stand-ins, never sealed, and it owes no late grants: members hand those over
(``client.group_e2e.handover_grants``) — when they post, as far as they see, and at the end
of the workload: for each message of a sender no member now, the active member with the
lowest id among its epoch's recipients gives its key to each user who was a member at its
stamp and whom the epoch left out, unless the epoch names a removal of theirs as recent as
that user's add.

What a sender sees: the member ops made on its node, and every other one ``KNOW_MS`` after it
was made — after the partition between the two nodes heals, if one was on. A sender stamps
after every op it sees (the HLC's receive rule). Its epochs are the client's memory, kept
across its devices. A node whose clock is far ahead makes messages nobody takes: they leave
the sender's state alone.

Payloads are the simulator's stand-ins (``sim.group_payloads``): no cryptography.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Protocol

from sim.group_payloads import group_message, keys_message, plain_message
from sim.opspec import OpSpec
from sim.rand import derive
from store.access import MemberHistory
from store.errors import ClockDriftError
from store.hlc import Hlc, HlcClock
from store.records import MessageKind

KNOW_MS = 2_000  # a member op reaches a sender on another node this long after it was made
EPOCH_MESSAGES = 1_000  # client/group_e2e.py's
EPOCH_MS = 7 * 24 * 3600 * 1000
SEALED = frozenset({MessageKind.NEW, MessageKind.REPLY, MessageKind.EDIT})
KEY_ID_LEN = 16
LATEST = Hlc.unpack((1 << 64) - 1)  # after every stamp: a member row's state now
NO_KEY = bytes(KEY_ID_LEN)  # a far-ahead clock's message: invalid everywhere, sealed under none


class KeyPlan(Protocol):
    clocks: list[HlcClock]

    def stamp(self, node: int, t: int) -> int: ...

    def offset(self, node: int, t: int) -> int: ...

    def poisoned_by(self, node: int, t: int, *, after_fix: bool = False) -> bool: ...

    def origin(self, user: int, t: int, row_op: bool = False) -> int: ...

    def user_id(self, user: int) -> bytes: ...

    def later(self, t_ms: int, step: Callable[[int], object]) -> None: ...

    def cut_at(self, t_ms: int) -> tuple[frozenset[int], int] | None:
        """The side of the partition on at ``t_ms`` and when it heals, if one is on."""

    def message(
        self,
        t_ms: int,
        node: int,
        author: int,
        chat: int,
        kind: MessageKind,
        target: OpSpec | None = None,
        payload: bytes | None = None,
    ) -> OpSpec: ...


@dataclass(frozen=True)
class Epoch:
    key_id: bytes
    recipients: frozenset[int]
    started_ms: int
    sent: int = 0
    removed: frozenset[tuple[int, int]] = frozenset()  # (user, packed stamp) its sender saw


def needs_new_epoch(
    epoch: Epoch | None,
    members: frozenset[int],
    now_ms: int,
    removed: frozenset[tuple[int, int]] = frozenset(),
    *,
    notice_removals: bool = True,
) -> bool:
    """``client.group_e2e.needs_new_epoch``; without ``notice_removals`` (the planted bug
    ``no-rotate-on-remove``) a removal alone leaves the epoch as it is."""
    if epoch is None:
        return True
    seen = members if notice_removals else members | epoch.recipients
    return (
        epoch.recipients != seen
        or (notice_removals and epoch.removed != removed)
        or epoch.sent >= EPOCH_MESSAGES
        or now_ms - epoch.started_ms >= EPOCH_MS
    )


@dataclass(frozen=True)
class MemberOp:
    t_ms: int
    node: int
    user: int
    hlc: int
    is_add: bool
    cut: tuple[frozenset[int], int] | None  # the partition on when it was made: side, heal

    def known_on(self, node: int) -> int:
        """When ``node`` sees it: at once on its own node, else ``KNOW_MS`` later — after
        the heal on the other side of a partition."""
        if node == self.node:
            return self.t_ms
        if self.cut is not None and (node in self.cut[0]) != (self.node in self.cut[0]):
            return max(self.t_ms, self.cut[1]) + KNOW_MS
        return self.t_ms + KNOW_MS


@dataclass
class Sender:
    """One user's keys in one chat."""

    epoch: Epoch | None = None
    epochs: int = 0
    sent: list[tuple[int, Epoch]] = field(default_factory=list)  # (hlc, epoch) per message
    granted: set[tuple[int, bytes, int]] = field(default_factory=set)  # (user, key id, hlc)
    known: set[int] = field(default_factory=set)  # the chat's member ops it has seen (indices)
    adds_checked: set[int] = field(default_factory=set)  # adds it has given what it owed


def _histories(ops: Iterable[MemberOp]) -> dict[int, MemberHistory]:
    stamps: dict[int, list[tuple[Hlc, bool]]] = {}
    for op in ops:
        stamps.setdefault(op.user, []).append((Hlc.unpack(op.hlc), op.is_add))
    return {user: MemberHistory.of(s) for user, s in stamps.items()}


class SenderKeys:
    def __init__(
        self, plan: KeyPlan, seed: int, *, notice_removals: bool = True, hand_over: bool = True
    ) -> None:
        self.plan = plan
        self.seed = seed
        self.notice_removals = notice_removals
        self.hand_over = hand_over
        self.ops: dict[int, list[MemberOp]] = {}  # chat -> its member ops, as planned
        self.senders: dict[int, dict[int, Sender]] = {}  # chat -> user -> their keys there
        # chat -> (member, (key id, user id, stamp)) handed over
        self.handed: dict[int, set[tuple[int, tuple[bytes, bytes, int]]]] = {}

    # --- what senders see ---

    def member_op(self, t_ms: int, node: int, chat: int, user: int, hlc: int, is_add: bool) -> None:
        op = MemberOp(t_ms, node, user, hlc, is_add, self.plan.cut_at(t_ms))
        self.ops.setdefault(chat, []).append(op)
        if is_add:  # senders who learn of it give it what they sent since its stamp
            heal = [] if op.cut is None else [max(op.t_ms, op.cut[1]) + KNOW_MS]
            for when in sorted({op.t_ms + KNOW_MS, *heal}):
                self.plan.later(when + 1, lambda t: self._learn(chat, t))

    def _known(self, sender: Sender, chat: int, node: int, t_ms: int) -> list[tuple[int, MemberOp]]:
        """What the sender has seen: what reached the node it uses now, and what it saw
        before (a client remembers)."""
        ops = self.ops.get(chat, [])
        sender.known.update(i for i, op in enumerate(ops) if op.known_on(node) <= t_ms)
        return [(i, ops[i]) for i in sorted(sender.known)]

    def _receive(self, node: int, t_ms: int, known: Iterable[tuple[int, MemberOp]]) -> None:
        """The node's clock moves past every stamp it has seen (the HLC receive rule)."""
        clock, phys = self.plan.clocks[node], t_ms + self.plan.offset(node, t_ms)
        top = max((op.hlc for _, op in known), default=0)
        if top > clock.last.pack():
            with suppress(ClockDriftError):  # a stamp too far ahead: the node refuses the op
                clock.update(Hlc.unpack(top), phys)

    # --- sealing ---

    def seal(
        self, t_ms: int, node: int, author: int, chat: int, filler: bytes
    ) -> tuple[int, bytes]:
        """A group message's stamp and payload; first the KEYS messages its sender owes."""
        plan = self.plan
        if plan.poisoned_by(node, t_ms):
            return plan.stamp(node, t_ms), group_message(NO_KEY, (), filler)
        sender = self.senders.setdefault(chat, {}).setdefault(author, Sender())
        known = self._known(sender, chat, node, t_ms)
        self._receive(node, t_ms, known)
        histories = _histories(op for _, op in known)
        self._grant_missing(t_ms, node, author, chat, sender, known, histories)
        if (mine := histories.get(author)) is None or not mine.active_at(LATEST):
            return plan.stamp(node, t_ms), plain_message(filler)  # no member, as it knows
        if self.hand_over:
            self._hand_over(chat, t_ms, histories, only=author, node=node)
        view = frozenset(u for u, h in histories.items() if h.active_at(LATEST)) | {author}
        removed = frozenset(
            (u, h.removes[-1].pack()) for u, h in histories.items() if h.removes and u not in view
        )
        removed_seen = [(plan.user_id(u), at) for u, at in removed]
        now_ms = t_ms + plan.offset(node, t_ms)
        epoch = sender.epoch
        if epoch is None or needs_new_epoch(
            epoch, view, now_ms, removed, notice_removals=self.notice_removals
        ):
            epoch = self._new_epoch(t_ms, node, author, chat, sender, view, now_ms, removed)
        hlc = plan.stamp(node, t_ms)
        sender.epoch = replace(epoch, sent=epoch.sent + 1)
        sender.sent.append((hlc, epoch))
        return hlc, group_message(epoch.key_id, removed_seen, filler)

    def _new_epoch(
        self,
        t_ms: int,
        node: int,
        author: int,
        chat: int,
        sender: Sender,
        recipients: frozenset[int],
        now_ms: int,
        removed: frozenset[tuple[int, int]],
    ) -> Epoch:
        sender.epochs += 1
        key_id = derive(self.seed, "epoch-key", author, chat, sender.epochs)[:KEY_ID_LEN]
        grant = (key_id, frozenset(self.plan.user_id(u) for u in recipients))
        payload = keys_message([grant], [])
        self.plan.message(t_ms, node, author, chat, MessageKind.KEYS, payload=payload)
        return Epoch(key_id, recipients, now_ms, removed=removed)

    # --- late grants ---

    def _grant_missing(
        self,
        t_ms: int,
        node: int,
        author: int,
        chat: int,
        sender: Sender,
        known: list[tuple[int, MemberOp]],
        histories: dict[int, MemberHistory],
        *,
        everyone: bool = False,
    ) -> None:
        """``histories``: those of ``known``. Message grants for members at a message's stamp that its epoch left out, and that
        have none yet (``client.group_e2e.missing_grants``): for the adds it just learnt of and
        the messages it sent since — or, with ``everyone``, for every member and message."""
        new = [(i, op) for i, op in known if op.is_add and i not in sender.adds_checked]
        if not new and not everyone:
            return
        sender.adds_checked.update(i for i, _ in new)
        since = 0 if everyone else min(op.hlc for _, op in new)
        added = set(histories) if everyone else {op.user for _, op in new}
        owed: list[tuple[int, bytes, int]] = []
        mine = histories.get(author)
        if mine is None or not mine.active_at(LATEST):
            return  # no member, as it knows: it reads nothing of the chat, posts nothing
        for hlc, epoch in sender.sent:
            if hlc < since:
                continue
            for user in sorted(added - epoch.recipients):
                if (user, epoch.key_id, hlc) in sender.granted:
                    continue
                if histories[user].active_at(Hlc.unpack(hlc)):
                    owed.append((user, epoch.key_id, hlc))
        if owed:
            grants = [(key_id, self.plan.user_id(user), hlc) for user, key_id, hlc in owed]
            payload = keys_message([], grants)
            self.plan.message(t_ms, node, author, chat, MessageKind.KEYS, payload=payload)
            sender.granted.update(owed)

    def _learn(self, chat: int, t_ms: int) -> None:
        """Senders of ``chat`` that see a new add now give what they owe it."""
        senders = self.senders.get(chat, {})
        for author in sorted(senders):
            if senders[author].sent:
                self._owe(author, chat, senders[author], t_ms, everything=False)

    def finish(self, t_ms: int) -> None:
        """The end of the workload: every op has reached every sender and member."""
        for author, chat in sorted((a, c) for c, senders in self.senders.items() for a in senders):
            sender = self.senders[chat][author]
            if sender.sent:
                self._owe(author, chat, sender, t_ms, everything=True)
        if self.hand_over:
            for chat in sorted(self.senders):
                self._hand_over(chat, t_ms, _histories(self.ops.get(chat, [])))

    def _hand_over(
        self, chat: int, t_ms: int, histories: dict[int, MemberHistory], *,
        only: int | None = None, node: int | None = None,
    ) -> None:  # fmt: skip
        """The hand-overs of ``chat`` as ``histories`` show its members: per removed sender's
        message, its epoch's lowest active recipient (by user id) gives its key to each member
        at its stamp the epoch left out — not to one whose removal it names as recent as their
        add — once. ``only``: that member's alone, posting now from ``node`` (a client hands
        over when it posts); else everyone's, at the end of the workload."""
        plan = self.plan
        active = {u for u, h in histories.items() if h.active_at(LATEST)}
        handed = self.handed.setdefault(chat, set())
        owed: dict[int, list[tuple[bytes, bytes, int]]] = {}
        for author, sender in sorted(self.senders[chat].items()):
            mine = histories.get(author)
            if author in active or mine is None:
                continue
            for hlc, epoch in sender.sent:
                stamp = Hlc.unpack(hlc)
                if not mine.active_at(stamp):
                    continue  # a message refused
                holders = [u for u in epoch.recipients if u in active]
                if not holders:
                    continue
                duty = min(holders, key=plan.user_id)
                if only is not None and duty != only:
                    continue
                removed = dict(epoch.removed)
                for user in sorted(histories.keys() - epoch.recipients):
                    history = histories[user]
                    if not history.active_at(stamp):
                        continue
                    added = max(a for a in history.adds if a <= stamp).pack()
                    if removed.get(user, -1) >= added:
                        continue  # its sender had seen them removed: left out on purpose
                    grant = (epoch.key_id, plan.user_id(user), hlc)
                    if (duty, grant) not in handed:
                        owed.setdefault(duty, []).append(grant)
        for duty, grants in sorted(owed.items()):
            at = plan.origin(duty, t_ms) if node is None else node
            if not plan.poisoned_by(at, t_ms):
                handed.update((duty, grant) for grant in grants)
                payload = keys_message([], grants)
                plan.message(t_ms, at, duty, chat, MessageKind.KEYS, payload=payload)

    def _owe(self, author: int, chat: int, sender: Sender, t_ms: int, *, everything: bool) -> None:
        node = self.plan.origin(author, t_ms)
        if self.plan.poisoned_by(node, t_ms):
            return  # its clock is far ahead: what it makes now nobody takes
        if everything:
            known = list(enumerate(self.ops.get(chat, [])))
        else:
            known = self._known(sender, chat, node, t_ms)
        self._receive(node, t_ms, known)
        histories = _histories(op for _, op in known)
        self._grant_missing(t_ms, node, author, chat, sender, known, histories, everyone=everything)
