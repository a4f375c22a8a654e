"""Ingress: what can never be valid, decided once for every path that brings an op. Pure.

An op reaches a node three ways — a client (``node.intake``), gossip
(``node.gossip.validation``) and anti-entropy (``sync.protocol``) — and each calls
``refuse_never_valid`` on the ops it decoded. It raises the ``InvalidInput`` of the first
check that fails, in this order, or returns:

1. far future (``far_future``, only with ``Limits.far_future_ms``: gossip's): a batch with an
   op stamped beyond any honest clock difference is as bad as a forgery; judged over the
   whole batch, before any signature, so a forged far-future op is not the cheaper offence;
2. then, for each op not skipped by ``unheld`` (an op held here has these very bytes and
   was checked when it was stored):

   a. clock drift (``clock_drift``, with ``Limits.max_offset_ms``): stamped further ahead
      of ``now_ms`` than clocks may differ;
   b. an identity: its blob is an identity document (the decoder's reasons) signed by the
      key that owns the user id (``bad_signature``);
   c. a member op: its signature (``bad_signature``; a leave signed by its leaver), then its
      authorization proof (``unauthorized``: ``store.authz``);
   d. a message: its public payload (a delete's claims, a reaction, a receipt: the
      decoder's reasons, ``store.kinds.check_public_payload``), then its signature
      (``bad_signature``) — the last check, so a caller that checks many at once may
      leave it out (``message_signatures=False``) and check them after, with
      ``verify_each`` or workers that give the same verdicts (``node.verify``).

Before this, each path's decoder has refused bytes over its size (``too_large``: a gossip
message, a sync frame, an HTTP body; ``oversize``: a record, with the node's
``max_payload``) or not shaped like an op; sync reports a ``DecodeError`` of a record as
``invalid_record``, every other reason as it is.

Not here, because it is not "never valid" — the same op may be fine elsewhere or later:
a replay (``nothing_new``, gossip), an author's rate (``rate_limited``, the API and gossip),
the retention cutoff (sync refuses old messages quietly), a client's message from a sender
removed at its stamp (``not_a_member``, the API only) and what the held state forbids
(``node.intake``), and drift in sync: a record stamped ahead is skipped, not refused, since
our clock may be the one behind (``SyncConfig.max_offset_ms``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from store.errors import ClockDriftError, InvalidInput
from store.kinds import check_public_payload
from store.ops import MembershipOp, Op, verify_identity
from store.records import IdentityRecord, MsgV1


@dataclass(frozen=True, slots=True)
class Limits:
    """How far ahead of ``now_ms`` a stamp may be; None: not refused here."""

    max_offset_ms: int | None = None  # an op's stamp (clock_drift)
    far_future_ms: int | None = None  # any op's stamp in the batch (far_future)

    @classmethod
    def relayed(cls, max_offset_ms: int) -> Limits:
        """Gossip's: beyond twice the allowed drift a stamp is an offence, not a clock's error."""
        return cls(max_offset_ms, 2 * max_offset_ms)


def refuse_never_valid(
    ops: Sequence[Op],
    *,
    now_ms: int,
    limits: Limits,
    unheld: Callable[[list[Op]], list[Op]] | None = None,
    message_signatures: bool = True,
    authenticate: bool = True,
) -> list[Op]:
    """Raise the InvalidInput of the first check that fails (the module's list); return the
    ops checked one by one: those ``unheld`` kept, or all.

    ``message_signatures=False``: messages' signatures are the caller's, checked after.
    ``authenticate=False``: member ops and identities are taken unchecked (sync sessions
    between test replicas of unsigned records; a node always checks them).
    """
    far = limits.far_future_ms
    if far is not None and ops and max(op.hlc.physical_ms for op in ops) - now_ms > far:
        raise InvalidInput("an op stamped far ahead of our clock", reason="far_future")
    checked = list(ops) if unheld is None else unheld(list(ops))
    for op in checked:
        offset = limits.max_offset_ms
        ahead = op.hlc.physical_ms - now_ms
        if offset is not None and ahead > offset:
            raise ClockDriftError(f"op HLC is {ahead} ms ahead of local time (max {offset} ms)")
        if isinstance(op, IdentityRecord):
            if authenticate:
                verify_identity(op)
        elif isinstance(op, MembershipOp):
            if authenticate:
                op.verify()
                op.authorize()
        else:
            check_public_payload(op)  # cheaper than the signature: first
            if message_signatures:
                op.verify()
    return checked


def validate_op(op: Op, *, now_ms: int, max_offset_ms: int) -> None:
    """``refuse_never_valid`` of one op, drift limited to ``max_offset_ms`` (the simulator,
    dm3 containers, benchmarks)."""
    refuse_never_valid([op], now_ms=now_ms, limits=Limits(max_offset_ms))


def verify_each(msgs: Sequence[MsgV1]) -> list[InvalidInput | None]:
    """Messages' signatures, one after the other: per message its error or None (what a
    caller of ``refuse_never_valid(..., message_signatures=False)`` checks after)."""
    return [_verify_one(m) for m in msgs]


def _verify_one(msg: MsgV1) -> InvalidInput | None:
    try:
        msg.verify()
    except InvalidInput as exc:
        return exc
    return None
