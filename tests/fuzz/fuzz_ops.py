"""Fuzz target ``ops``: what gossip and sync take from peers, decoded and checked as a node does.

On the same bytes:

* the gossip envelope — ``decode_ops`` with the node's limits, then ``validate_op`` of each
  op at a fixed ``now_ms`` (signature, authorization, clock drift), exactly as the gossip
  validator runs them;
* ``decode_membership_op`` then ``verify`` and ``authorize`` (a proof inside a member row);
* ``decode_member_record`` then ``verify_member_record`` (an authenticated sync session);
* ``decode_identity_record`` then ``verify_identity`` (and so ``decode_identity_doc``).

Property: only ``store.errors.InvalidInput`` subclasses are raised; every op decoded
re-encodes to its input bytes.
"""

from __future__ import annotations

import contextlib

import cbor2
from nacl.signing import SigningKey

from fuzz_support import NOW_MS, instrumented, main

with instrumented(__name__ == "__main__"):
    from store.authz import AdminGrant, DmProof, grant_admin, new_group
    from store.errors import InvalidInput
    from store.hlc import DEFAULT_MAX_OFFSET_MS, Hlc
    from store.ingress import validate_op
    from store.merge import merge_member_states, remove_op_state
    from store.ops import (
        MembershipAction,
        MembershipOp,
        decode_membership_op,
        decode_ops,
        encode_op,
        encode_ops,
        make_identity,
        verify_identity,
        verify_member_record,
    )
    from store.records import (
        DEFAULT_MAX_PAYLOAD,
        MemberRecord,
        MsgV1,
        Role,
        decode_identity_record,
        decode_member_record,
        dm_chat_id,
    )
    from store.signing import key_from_seed, public_key, user_id_from_key

TARGET = "ops"
GOSSIP_MAX_BYTES = 900 * 1024  # NodeConfig.gossip_max_bytes
MAX_OPS_PER_MESSAGE = 4096  # node.gossip.MAX_OPS_PER_MESSAGE


def _gossip(data: bytes) -> None:
    ops = decode_ops(
        data,
        max_bytes=GOSSIP_MAX_BYTES,
        max_ops=MAX_OPS_PER_MESSAGE,
        max_payload=DEFAULT_MAX_PAYLOAD,
    )
    items = cbor2.loads(data)[1]  # decode_ops accepted it, so this is [[kind, bytes], ...]
    for op, (_, raw) in zip(ops, items, strict=True):
        if encode_op(op) != raw:
            raise AssertionError(f"op re-encodes differently: {raw!r}")
    for op in ops:
        validate_op(op, now_ms=NOW_MS, max_offset_ms=DEFAULT_MAX_OFFSET_MS)


def _membership(data: bytes) -> None:
    op = decode_membership_op(data)
    if op.encode() != data:
        raise AssertionError("MembershipOp re-encodes differently")
    op.verify()
    op.authorize()


def _member_record(data: bytes) -> None:
    verify_member_record(decode_member_record(data))


def _identity(data: bytes) -> None:
    verify_identity(decode_identity_record(data))


CHECKS = [_gossip, _membership, _member_record, _identity]


def one_input(data: bytes) -> None:
    for check in CHECKS:
        with contextlib.suppress(InvalidInput):
            check(data)


def seeds() -> dict[str, bytes]:
    creator, admin, user = (key_from_seed(bytes([i]) * 32) for i in (0x21, 0x22, 0x23))
    ids = [user_id_from_key(public_key(k)) for k in (creator, admin, user)]
    group = new_group(creator, b"fuzz-ops-group!!")
    chat = group.chat_id()
    grant = grant_admin(creator, group, ids[1])
    hlc = Hlc(NOW_MS - 1_000)

    def op(
        actor: SigningKey,
        who: int,
        action: MembershipAction,
        role: Role = Role.PARTICIPANT,
        at: Hlc = hlc,
        grant: AdminGrant | None = None,
    ) -> MembershipOp:
        return MembershipOp.create(
            actor, chat, ids[who], action, at, role, proof=group, grant=grant
        )

    add_admin = op(creator, 1, MembershipAction.ADD, Role.ADMIN)
    add_user = op(admin, 2, MembershipAction.ADD, grant=grant)
    remove = op(admin, 2, MembershipAction.REMOVE, grant=grant)
    leave = op(user, 2, MembershipAction.LEAVE, at=Hlc(NOW_MS))
    dm = dm_chat_id(ids[0], ids[2])
    dm_add = MembershipOp.create(
        creator, dm, ids[2], MembershipAction.ADD, hlc, proof=DmProof(ids[0], ids[2])
    )
    msg = MsgV1.create(user, chat, hlc, b"hi there")
    identity = make_identity(admin, b"\x05" * 32, hlc)
    removed = merge_member_states(add_user.state(), remove_op_state(leave.hlc, leave.encode()))
    assert removed is not None
    return {
        "gossip-mixed": encode_ops([msg, add_admin, identity]),
        "gossip-members": encode_ops([add_user, remove, leave, dm_add]),
        "gossip-empty": encode_ops([]),
        "membership-grant": add_user.encode(),
        "membership-dm": dm_add.encode(),
        "member-record": MemberRecord(chat, ids[1], add_admin.state()).encode(),
        "member-record-removed": MemberRecord(chat, ids[2], removed).encode(),
        "identity": identity.encode(),
        # Regression: a bignum op kind made the error message raise ValueError.
        "regression-bignum-kind": cbor2.dumps([1, [[cbor2.CBORTag(2, b"\x01" * 2000), b""]]]),
    }


if __name__ == "__main__":
    main(TARGET, one_input, seeds)
