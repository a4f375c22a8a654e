"""The intake: ops from the node's clients (``POST /ops``, ``PUT /identity``) on their way in.

``OpIntake.submit`` checks the ops this replica does not hold yet — what can never be
valid, as every ingress does (``store.ingress``: HLC drift, signature, author id,
authorization), a message's sender removed at its stamp (``refuse_removed_senders``),
what the held state forbids (``refuse_what_kinds_forbid``), then the authors' rate
(``AuthorRates``, the budget gossip shares) — hands all of them to the writer, and once
they are written gossips the ones that were new (and records them with ``--trace-out``).
All or nothing: if one op is refused, none is written.

A message we hold has these very bytes (its id hashes them, signature included) and was
checked when it was stored: a client resending a batch costs no signature checks, and
replaying an author's old ops spends none of the author's budget.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from node.clock import Clock
from node.gossip import GossipService
from node.limits import AuthorRates
from node.metrics import Metrics
from node.writer import DbWriter
from store.access import admissible, visible
from store.chatdb import ChatDb
from store.errors import InvalidInput
from store.ingress import Limits, refuse_never_valid
from store.kinds import Claims, claims_of, decode_receipt, delete_is_valid
from store.ops import MembershipAction, MembershipOp, Op
from store.records import IdentityRecord, MessageKind, MsgV1
from sync.scope import EVERYTHING, Scope, shard_of, user_shard_of


def ops_not_held(db: ChatDb, ops: list[Op]) -> list[Op]:
    """The ops that can change this replica: every message it does not hold yet, and every
    member op and identity (rare; their merge decides). One multi-get for the messages."""
    msgs = [op for op in ops if isinstance(op, MsgV1)]
    held_flags = db.held_messages([m.msg_id for m in msgs])
    held = {m.msg_id for m, is_held in zip(msgs, held_flags, strict=True) if is_held}
    return [op for op in ops if not (isinstance(op, MsgV1) and op.msg_id in held)]


class OutsideScope(InvalidInput):
    """A client's op or read of a chat this node does not hold, or a read of a user's
    identity it does not index (SYNC.md, "Scopes"): ``chat_id`` and its shard, or
    ``user_id`` and its user shard. The HTTP API answers 421 naming nodes that hold it."""

    reason = "out_of_scope"

    def __init__(
        self,
        message: str,
        *,
        shard: int,
        chat_id: bytes | None = None,
        user_id: bytes | None = None,
    ) -> None:
        super().__init__(message)
        self.chat_id, self.user_id, self.shard = chat_id, user_id, shard


def refuse_outside_scope(scope: Scope, ops: list[Op]) -> None:
    """Refuse, rather than drop unsaid, a client's op of a chat outside the node's scope:
    its messages, deletes and member ops are decided by the nodes holding it. (A user's
    identity is taken: the node indexes its user first, ``named_user_shards``.)"""
    for op in ops:
        if isinstance(op, MsgV1 | MembershipOp) and not scope.holds_chat(op.chat_id):
            raise outside_scope(op.chat_id, scope.num_shards)


def named_user_shards(scope: Scope, ops: list[Op]) -> frozenset[int]:
    """The user shards of the users ``ops``' member ops name, and of the identities' users:
    what a scoped node indexes for a client's write (none for a full one: it indexes all)."""
    if scope.is_full:
        return frozenset()
    return frozenset(
        user_shard_of(op.user_id, scope.num_shards)
        for op in ops
        if isinstance(op, MembershipOp | IdentityRecord)
    )


def outside_scope(chat: bytes, num_shards: int) -> OutsideScope:
    shard = shard_of(chat, num_shards)
    return OutsideScope(
        f"chat {chat.hex()} is in shard {shard}, outside this node's scope: ask a node that "
        f"holds that shard",
        chat_id=chat,
        shard=shard,
    )


def user_outside_scope(user: bytes, num_shards: int) -> OutsideScope:
    shard = user_shard_of(user, num_shards)
    return OutsideScope(
        f"user {user.hex()} is in user shard {shard}, which this node does not index: ask a "
        f"node that does (the user's home nodes)",
        user_id=user,
        shard=shard,
    )


class NotAMember(InvalidInput):
    """A client's message from a sender this node knows was not a member at its stamp."""

    reason = "not_a_member"


@dataclass(frozen=True, slots=True)
class Submitted:
    new: list[bool]  # per op: did it change the store
    waiting: list[bool]  # per op: a message held until a member op admits it


def refuse_removed_senders(db: ChatDb, ops: list[Op]) -> None:
    """NotAMember for a message whose sender, by the ops known here and in the request, was
    admitted to the chat once but removed at the message's stamp.

    Only at the API: a client learns at once that its post would be hidden. Replicas still
    store such messages when a peer sends them (whether they show is decided when reading,
    and a later re-add may show them), so this changes nothing that converges.
    """
    batch_ops: dict[tuple[bytes, bytes], list[MembershipOp]] = {}
    for op in ops:
        if isinstance(op, MembershipOp):
            batch_ops.setdefault((op.chat_id, op.user_id), []).append(op)
    for op in ops:
        if not isinstance(op, MsgV1):
            continue
        access = db.access_of(op.chat_id, op.sender)
        for member_op in batch_ops.get((op.chat_id, op.sender), ()):
            is_add = member_op.action is MembershipAction.ADD
            access = replace(access, history=access.history.with_op(member_op.hlc, is_add))
        if admissible(op, access) and not visible(op, access):
            raise NotAMember(
                f"user {op.sender.hex()} was not a member of chat {op.chat_id.hex()} "
                f"at the message's stamp ({op.hlc.physical_ms} ms, logical {op.hlc.logical}): "
                "removed or left before it"
            )


class KindRefused(InvalidInput):
    """An edit, delete or reaction the node can already tell it must refuse (MESSAGES.md)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def refuse_what_kinds_forbid(db: ChatDb, ops: list[Op]) -> None:
    """KindRefused for what the held state already decides against: a re-post of an erased
    message, an edit or reaction of one, an edit of someone else's message, a reference to
    another chat, a delete that is not (yet) valid or whose claims contradict its held
    target, a receipt that does not move forward or misstates its message's stamp. What
    depends on a target not held here is left to the fold, as on every replica.
    """
    with_deletes = db.delete_chats()  # elsewhere nothing was erased
    for op in ops:
        if not isinstance(op, MsgV1):
            continue
        if op.chat_id in with_deletes and db.is_erased(op.msg_id):
            raise KindRefused("deleted", f"message {op.msg_id.hex()} was deleted")
        if op.ref is None:
            continue
        kind, ref = op.kind, op.ref
        if kind in (MessageKind.EDIT, MessageKind.REACTION) and db.is_erased(ref):
            raise KindRefused("deleted", f"message {ref.hex()} was deleted")
        target = db.get_message(ref)
        if target is not None and target.chat_id != op.chat_id:
            raise KindRefused("ref_other_chat", f"message {ref.hex()} is in another chat")
        if kind is MessageKind.EDIT and target is not None and target.sender != op.sender:
            raise KindRefused("not_author", "only a message's author may edit it")
        if kind is MessageKind.READ_RECEIPT:
            refuse_receipt(db, op, target)
        if kind is MessageKind.DELETE:
            if target is not None and Claims.of(target) != claims_of(op):
                raise KindRefused("bad_claims", "the delete's claims contradict its target")
            if not delete_is_valid(op, db.admins(op.chat_id)):
                raise KindRefused(
                    "not_allowed", "only the author or an admin may delete, after the message"
                )


def refuse_receipt(db: ChatDb, receipt: MsgV1, target: MsgV1 | None) -> None:
    """KindRefused for a receipt whose position is not its held message's stamp, or is not
    ahead of the reader's known position (it would change nothing: positions only grow)."""
    position = decode_receipt(receipt)  # well formed: refuse_never_valid checked it
    if target is not None and target.hlc != position:
        raise KindRefused("bad_position", "a receipt's position is the stamp of its message")
    known = db.read_position(receipt.chat_id, receipt.sender)
    if known is not None and position <= known:
        raise KindRefused(
            "receipt_backwards",
            f"the receipt reads up to {position}, not past the known position {known}",
        )


class OpIntake:
    def __init__(
        self,
        db: ChatDb,
        writer: DbWriter,
        gossip: GossipService,
        author_rates: AuthorRates,
        metrics: Metrics,
        clock: Clock,
        *,
        max_offset_ms: int,
        record: Callable[[int, list[Op]], None] | None = None,
        scope: Scope = EVERYTHING,
    ) -> None:
        self.scope = scope  # what the store holds: ops of other chats are refused here
        # told the user shards of a client's member ops and identities before they are
        # written: the node indexes what it writes, for a while (node/scopes.py)
        self.index_users: Callable[[frozenset[int]], Awaitable[None]] | None = None
        # ...and again once written: a session that started before then may lack the ops,
        # so it hands none of those user shards over (ServedScope.handed_over)
        self.wrote_for: Callable[[frozenset[int]], None] | None = None
        self.db = db
        self.writer = writer
        self.gossip = gossip
        self.author_rates = author_rates
        self.metrics = metrics
        self.clock = clock
        self.limits = Limits(max_offset_ms)
        self.record = record  # --trace-out: (now_ms, the ops that were new)

    async def submit(self, ops: list[Op], *, wait_for_room: bool = True) -> Submitted:
        """Validate, write (ack after the WriteBatch), then gossip the ops that were new —
        and the messages that wait for their member op: another node may hold it.

        With ``wait_for_room=False`` a full write queue raises ``trio.WouldBlock`` at
        once instead of waiting (the HTTP API answers 503 then).
        """
        now = self.clock.wall_ms()
        self.check(ops, now)
        named = named_user_shards(self.scope, ops)
        if named and self.index_users is not None:
            await self.index_users(named)
        request = (
            await self.writer.enqueue(ops) if wait_for_room else self.writer.submit_nowait(ops)
        )
        new = await self.writer.wait(request)
        if named and self.wrote_for is not None:
            self.wrote_for(named)
        waiting = request.waiting
        fresh = [op for op, n, w in zip(ops, new, waiting, strict=True) if n or w]
        self.metrics.inc("ops_submitted", len(ops), help="ops submitted through the API")
        if fresh:
            if self.record is not None:
                self.record(now, fresh)
            await self.gossip.publish(fresh)
        return Submitted(new, waiting)

    def check(self, ops: list[Op], now_ms: int) -> None:
        """InvalidInput (counted by reason) unless every op not held here is acceptable."""
        unheld = ops_not_held(self.db, ops)
        try:
            refuse_never_valid(unheld, now_ms=now_ms, limits=self.limits)
            refuse_outside_scope(self.scope, unheld)
            refuse_removed_senders(self.db, unheld)
            refuse_what_kinds_forbid(self.db, unheld)
            self.author_rates.check(unheld, now_ms)
        except InvalidInput as exc:
            self.metrics.inc("ops_rejected", reason=exc.reason, help="ops refused at the API")
            raise
