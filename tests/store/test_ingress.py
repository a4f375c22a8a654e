"""What can never be valid, decided once (store/ingress.py) — and alike on every path.

The function's checks and their order, then one table of hostile ops run through the three
ingresses a node has: the API (``decode_ops_in``, then ``OpIntake.check``), gossip
(``GossipValidator.check``) and a sync session (``sync.loopback.run_session``, authenticated
as a node's). Each refuses an op with the same reason; where a path differs, the row says how
and why (sync reports a record that does not decode as ``invalid_record`` and skips a stamp
too far ahead instead of refusing it; gossip calls a stamp beyond twice the drift
``far_future``).
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial

import pytest

from node.api.decode import decode_ops_in
from node.api.models import OpIn, OpsIn
from node.gossip import GossipSettings, GossipValidator
from node.intake import OpIntake, ops_not_held
from node.limits import AuthorRates
from node.metrics import Metrics
from store import ChatDb, Hlc, IdentityRecord, MessageKind, MsgV1
from store.errors import ClockDriftError, DecodeError, InvalidInput
from store.ingress import Limits, refuse_never_valid, validate_op, verify_each
from store.ops import (
    MembershipAction,
    MembershipOp,
    Op,
    decode_op,
    encode_op,
    encode_ops,
    make_identity,
    op_kind,
)
from sync.errors import RemoteProtocolError
from sync.frames import Domain
from sync.loopback import run_session
from sync.protocol import SyncConfig
from sync.replica import MemoryReplica

from store_support import AUTHOR_IDS, GROUP, GROUP_CHAT, KEYS, fresh_db, group_op

NOW_MS = 10_000_000
OFFSET_MS = 120_000  # the node's default drift
MAX_PAYLOAD = 1_024
CHAT = GROUP_CHAT


@cache
def msg(ms: int = NOW_MS - 1_000, payload: bytes = b"hello", **kw: object) -> MsgV1:
    return MsgV1.create(KEYS[0], CHAT, Hlc(ms), payload, max_payload=1 << 20, **kw)  # type: ignore[arg-type]


def reaction(payload: bytes) -> MsgV1:
    return msg(payload=payload, kind=MessageKind.REACTION, ref=msg().msg_id)


def forged(m: MsgV1) -> MsgV1:
    """``m`` with another message's signature."""
    return dataclasses.replace(m, sig=msg(payload=b"other").sig)


@cache
def unauthorized_add() -> MembershipOp:
    """Signed by AUTHOR_IDS[1], who holds no say in GROUP: well formed, signed, unauthorized."""
    return MembershipOp.create(
        KEYS[1], CHAT, AUTHOR_IDS[2], MembershipAction.ADD, Hlc(NOW_MS - 500), proof=GROUP
    )


def stolen_identity() -> IdentityRecord:
    """KEYS[0]'s signed identity document claimed for another user."""
    own = make_identity(KEYS[0], bytes(32), Hlc(NOW_MS - 200))
    return IdentityRecord(AUTHOR_IDS[1], own.hlc, own.blob)


# --- the function ------------------------------------------------------------------------------


def reason_of(call: Callable[[], object]) -> str | None:
    try:
        call()
    except InvalidInput as exc:
        return exc.reason
    return None


def test_valid_ops_pass_and_the_checked_ones_are_returned() -> None:
    ops: list[Op] = [msg(), group_op(1, 5), make_identity(KEYS[2], bytes(32), Hlc(7))]
    assert refuse_never_valid(ops, now_ms=NOW_MS, limits=Limits(OFFSET_MS)) == ops
    assert (
        refuse_never_valid(ops, now_ms=NOW_MS, limits=Limits(), unheld=lambda o: o[1:]) == ops[1:]
    )


def test_drift_is_checked_first_and_only_with_a_limit() -> None:
    ahead = forged(msg(NOW_MS + OFFSET_MS + 1))
    assert reason_of(lambda: validate_op(ahead, now_ms=NOW_MS, max_offset_ms=OFFSET_MS)) == (
        "clock_drift"
    )
    with pytest.raises(ClockDriftError):
        refuse_never_valid([ahead], now_ms=NOW_MS, limits=Limits(OFFSET_MS))
    at_limit = msg(NOW_MS + OFFSET_MS)
    refuse_never_valid([at_limit], now_ms=NOW_MS, limits=Limits(OFFSET_MS))
    # no limit: the stamp is not judged here (sync skips it instead), the signature still is
    assert reason_of(lambda: refuse_never_valid([ahead], now_ms=NOW_MS, limits=Limits())) == (
        "bad_signature"
    )


def test_the_far_future_is_judged_over_the_whole_batch_before_any_signature() -> None:
    far = msg(NOW_MS + 2 * OFFSET_MS + 1)
    limits = Limits.relayed(OFFSET_MS)
    assert limits == Limits(OFFSET_MS, 2 * OFFSET_MS)
    batch = [forged(msg()), far]  # the forgery comes first, the far stamp wins

    def check() -> object:
        return refuse_never_valid(batch, now_ms=NOW_MS, limits=limits)

    assert reason_of(check) == "far_future"
    # even when the far op is held: the batch is judged before ``unheld`` chooses
    unheld_only_first = partial(refuse_never_valid, batch, unheld=lambda o: o[:1])
    assert reason_of(lambda: unheld_only_first(now_ms=NOW_MS, limits=limits)) == "far_future"
    # within twice the drift: the op's own drift
    near = msg(NOW_MS + OFFSET_MS + 1)
    assert reason_of(lambda: refuse_never_valid([near], now_ms=NOW_MS, limits=limits)) == (
        "clock_drift"
    )


def test_held_ops_are_not_checked_again() -> None:
    bad = forged(msg())
    assert refuse_never_valid([bad], now_ms=NOW_MS, limits=Limits(), unheld=lambda o: []) == []


def test_a_message_payload_is_checked_before_its_signature_and_the_signature_may_wait() -> None:
    bad_reaction = forged(reaction(b"\x02+"))
    with pytest.raises(DecodeError):
        refuse_never_valid([bad_reaction], now_ms=NOW_MS, limits=Limits())
    with pytest.raises(DecodeError):  # still refused: only the signature waits
        refuse_never_valid([bad_reaction], now_ms=NOW_MS, limits=Limits(), message_signatures=False)
    bad_sig = forged(msg())
    refuse_never_valid([bad_sig], now_ms=NOW_MS, limits=Limits(), message_signatures=False)
    errors = verify_each([msg(), bad_sig])  # the caller's last check
    assert errors[0] is None and errors[1] is not None and errors[1].reason == "bad_signature"


def test_member_ops_and_identities_are_authenticated_unless_told_not_to() -> None:
    no_proof = dataclasses.replace(group_op(1, 5), proof=None)
    for op, expected in [
        (unauthorized_add(), "unauthorized"),
        (no_proof, "bad_signature"),  # the proof is signed: without it the signature fails
        (dataclasses.replace(group_op(1, 5), sig=group_op(2, 5).sig), "bad_signature"),
        (stolen_identity(), "bad_signature"),
        (IdentityRecord(AUTHOR_IDS[1], Hlc(5), b"junk"), "truncated"),
    ]:
        check = partial(refuse_never_valid, [op], now_ms=NOW_MS, limits=Limits())
        assert reason_of(check) == expected, op
        assert reason_of(partial(check, authenticate=False)) is None


# --- the same hostile op on every path ----------------------------------------------------------

SKIPPED = "skipped"  # sync: not refused, not taken (our clock may be the one behind)


def through_intake(db: ChatDb, op: Op) -> str | None:
    """``POST /ops``: the body decoded as the API does, then the intake's checks."""
    data = base64.urlsafe_b64encode(encode_op(op)).decode()
    body = OpsIn(ops=[OpIn(kind=int(op_kind(op)), data=data)])
    rates = AuthorRates(1_000.0, 1_000.0)
    intake = OpIntake(db, None, None, rates, Metrics(), None, max_offset_ms=OFFSET_MS)  # type: ignore[arg-type]
    return reason_of(lambda: intake.check(decode_ops_in(body, max_payload=MAX_PAYLOAD), NOW_MS))


def through_gossip(db: ChatDb, op: Op) -> str | None:
    settings = GossipSettings(
        topic="t", own_peer_id=b"me", max_bytes=64 * 1024, max_payload=MAX_PAYLOAD,
        max_offset_ms=OFFSET_MS, batch_ops=10, batch_delay_ms=20,
    )  # fmt: skip
    validator = GossipValidator(
        settings, not_held=partial(ops_not_held, db), author_rates=AuthorRates(1_000.0, 1_000.0)
    )
    return reason_of(lambda: validator.check(encode_ops([op]), NOW_MS))


def through_sync(op: Op) -> str | None:
    """A session with a peer that holds ``op``, configured as a node's (``sync_config``)."""
    peer, us = MemoryReplica(admit_all=True), MemoryReplica(admit_all=True)
    peer.apply(_domain(op), [op])
    config = SyncConfig(authenticate=True, max_offset_ms=OFFSET_MS, max_payload=MAX_PAYLOAD)
    try:
        result = run_session(us, peer, now_ms=NOW_MS, config=config)
    except RemoteProtocolError as exc:
        return exc.reason
    return SKIPPED if result.rejected_future else None


def _domain(op: Op) -> Domain:
    if isinstance(op, MsgV1):
        return Domain.DELETES if op.kind is MessageKind.DELETE else Domain.MESSAGES
    return Domain.MEMBERS if isinstance(op, MembershipOp) else Domain.IDENTITY


@dataclass(frozen=True)
class Hostile:
    name: str
    op: Callable[[], Op]
    reason: str | None  # from the API and gossip
    sync: str | None  # from a sync session


INVALID_RECORD = "invalid_record"  # sync's reason for a record that does not decode

HOSTILE = [
    Hostile("valid", msg, None, None),
    Hostile("malformed reaction", lambda: reaction(b"\x02+"), "decode", INVALID_RECORD),
    Hostile("oversized payload", lambda: msg(payload=b"x" * (MAX_PAYLOAD + 1)),
            "oversize", INVALID_RECORD),
    Hostile("forged signature", lambda: forged(msg()), "bad_signature", "bad_signature"),
    Hostile("sender not its key's", lambda: dataclasses.replace(msg(), sender=AUTHOR_IDS[1]),
            "bad_signature", "bad_signature"),
    Hostile("unauthorized member op", unauthorized_add, "unauthorized", "unauthorized"),
    Hostile("forged member op",
            lambda: dataclasses.replace(group_op(1, 5), sig=group_op(2, 5).sig),
            "bad_signature", "bad_signature"),
    Hostile("identity of another user", stolen_identity, "bad_signature", "bad_signature"),
    Hostile("identity blob not a document",
            lambda: IdentityRecord(AUTHOR_IDS[1], Hlc(5), b"junk"), "truncated", INVALID_RECORD),
    Hostile("drift", lambda: msg(NOW_MS + OFFSET_MS + 1), "clock_drift", SKIPPED),
]  # fmt: skip


@pytest.mark.parametrize("case", HOSTILE, ids=[h.name for h in HOSTILE])
def test_every_path_refuses_a_hostile_op_for_the_same_reason(case: Hostile) -> None:
    op = case.op()
    with fresh_db() as db:
        assert through_intake(db, op) == case.reason
        assert through_gossip(db, op) == case.reason
    assert through_sync(op) == case.sync
    if case.sync == INVALID_RECORD:  # sync's one renaming: the decoders' family
        error = _decode_error(op)
        assert isinstance(error, DecodeError) and error.reason == case.reason


def test_a_far_future_op_is_drift_at_the_api_an_offence_in_gossip_and_skipped_by_sync() -> None:
    far = msg(NOW_MS + 2 * OFFSET_MS + 1)
    with fresh_db() as db:
        assert through_intake(db, far) == "clock_drift"
        assert through_gossip(db, far) == "far_future"
        # forged too: the API and gossip judge the stamp first
        assert through_intake(db, forged(far)) == "clock_drift"
        assert through_gossip(db, forged(far)) == "far_future"
    assert through_sync(far) == SKIPPED
    # sync checks the signature before it skips a stamp (not the peer's fault): a forgery is one
    assert through_sync(forged(far)) == "bad_signature"


def test_the_table_covers_every_check() -> None:
    reasons = {h.reason for h in HOSTILE} | {h.sync for h in HOSTILE}
    expected = {"decode", "oversize", "bad_signature", "unauthorized", "truncated"}
    assert expected | {"clock_drift", INVALID_RECORD, SKIPPED} <= reasons


def _decode_error(op: Op) -> InvalidInput | None:
    """What the record decoders (with the node's ``max_payload``) or the function raise."""
    try:
        refuse_never_valid(
            [decode_op(op_kind(op), encode_op(op), max_payload=MAX_PAYLOAD)],
            now_ms=NOW_MS,
            limits=Limits(OFFSET_MS),
        )
    except InvalidInput as exc:
        return exc
    return None
