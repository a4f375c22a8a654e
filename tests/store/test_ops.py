"""Signed ops and their envelope: round trips, signatures, self-certifying identities, hostile bytes."""

from __future__ import annotations

import dataclasses

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from store import BadSignature, ClockDriftError, DecodeError, Hlc, MsgV1, Role
from store.authz import DmProof, Unauthorized, grant_admin, new_group
from store.ingress import validate_op
from store.ops import (
    MembershipAction,
    MembershipOp,
    OpKind,
    decode_identity_doc,
    decode_membership_op,
    decode_ops,
    encode_ops,
    make_identity,
    member_op_id,
    op_author,
    verify_identity,
    verify_member_record,
)
from store.signing import key_from_seed, public_key, user_id_from_key

KEYS = [key_from_seed(bytes([i + 90]) * 32) for i in range(3)]
USERS = [user_id_from_key(public_key(k)) for k in KEYS]
PROOF = new_group(KEYS[0], b"ops-tests-group!")  # KEYS[0] created it
CHAT = PROOF.chat_id()
LIMITS = {"max_bytes": 1 << 20, "max_ops": 100}

ops = st.one_of(
    st.builds(
        lambda k, u, a, h, r: MembershipOp.create(
            KEYS[k], CHAT, USERS[u], a, Hlc(h), r, proof=PROOF
        ),
        st.just(0),  # the creator: always authorized
        st.integers(0, 2),
        st.sampled_from([MembershipAction.ADD, MembershipAction.REMOVE]),
        st.integers(1, 10**6),
        st.sampled_from(list(Role)),
    ),
    st.builds(
        lambda k, h: make_identity(KEYS[k], bytes([k]) * 32, Hlc(h)),
        st.integers(0, 2),
        st.integers(1, 10**6),
    ),
    st.builds(
        lambda k, h, p: MsgV1.create(KEYS[k], CHAT, Hlc(h), p),
        st.integers(0, 2),
        st.integers(1, 10**6),
        st.binary(max_size=50),
    ),
)


@given(st.lists(ops, max_size=6))
def test_envelope_round_trip_and_every_op_verifies(batch: list) -> None:  # type: ignore[type-arg]
    decoded = decode_ops(encode_ops(batch), **LIMITS)
    assert decoded == batch
    for op in decoded:
        validate_op(op, now_ms=10**6, max_offset_ms=0)


@given(ops, st.integers(0, 200), st.integers(1, 255))
def test_a_flipped_byte_never_verifies(op, position: int, flip: int) -> None:  # type: ignore[no-untyped-def]
    raw = bytearray(encode_ops([op]))
    raw[position % len(raw)] ^= flip
    try:
        decoded = decode_ops(bytes(raw), **LIMITS)
    except DecodeError:
        return
    for candidate in decoded:
        if candidate != op:
            with pytest.raises((BadSignature, DecodeError, ClockDriftError)):
                validate_op(candidate, now_ms=10**6, max_offset_ms=0)


@given(st.binary(max_size=300))
def test_garbage_raises_only_decode_errors(data: bytes) -> None:
    try:
        decode_ops(data, **LIMITS)
    except DecodeError as exc:
        assert exc.reason


def test_leave_must_be_signed_by_the_leaver() -> None:
    own = MembershipOp.create(KEYS[1], CHAT, USERS[1], MembershipAction.LEAVE, Hlc(5))
    own.verify()
    other = MembershipOp.create(KEYS[0], CHAT, USERS[1], MembershipAction.LEAVE, Hlc(5))
    with pytest.raises(BadSignature):
        other.verify()


def test_identity_blob_must_belong_to_the_user() -> None:
    record = make_identity(KEYS[0], b"\x01" * 32, Hlc(7))
    assert verify_identity(record).box_key == b"\x01" * 32
    stolen = type(record)(USERS[1], record.hlc, record.blob)  # someone else's id, my blob
    with pytest.raises(BadSignature):
        verify_identity(stolen)
    replayed = type(record)(USERS[0], Hlc(8), record.blob)  # the blob signed for another stamp
    with pytest.raises(BadSignature):
        verify_identity(replayed)


def test_far_future_ops_are_refused() -> None:
    msg = MsgV1.create(KEYS[0], CHAT, Hlc(200_000), b"x")
    with pytest.raises(ClockDriftError):
        validate_op(msg, now_ms=0, max_offset_ms=120_000)
    validate_op(msg, now_ms=80_001, max_offset_ms=120_000)


def test_envelope_limits() -> None:
    many = encode_ops([MsgV1.create(KEYS[0], CHAT, Hlc(i + 1), b"") for i in range(5)])
    with pytest.raises(DecodeError):
        decode_ops(many, max_bytes=1 << 20, max_ops=4)
    with pytest.raises(DecodeError) as info:
        decode_ops(many, max_bytes=100, max_ops=10)
    assert info.value.reason == "oversize"
    with pytest.raises(DecodeError) as info:
        decode_ops(cbor2.dumps([1, [[9, b"x"]]]), **LIMITS)
    assert info.value.reason == "unknown_kind"


def _op(actor: int, user: int, action: MembershipAction, role: Role = Role.PARTICIPANT, **kw):  # type: ignore[no-untyped-def]
    return MembershipOp.create(
        KEYS[actor], CHAT, USERS[user], action, Hlc(9), role, proof=PROOF, **kw
    )


def test_the_membership_rule() -> None:
    ADD, REMOVE, LEAVE = MembershipAction.ADD, MembershipAction.REMOVE, MembershipAction.LEAVE
    allowed = [
        _op(0, 1, ADD, Role.ADMIN),  # the creator: anything
        _op(0, 0, REMOVE),
        _op(2, 2, LEAVE),  # anyone may leave
        _op(2, 2, REMOVE),
        _op(1, 2, ADD, grant=grant_admin(KEYS[0], PROOF, USERS[1])),  # an admin adds participants
        _op(1, 2, REMOVE, grant=grant_admin(KEYS[0], PROOF, USERS[1])),
    ]
    for op in allowed:
        op.verify()
        op.authorize()
    forged_grant = grant_admin(KEYS[0], PROOF, USERS[2])  # a grant for someone else
    denied = [
        _op(1, 2, ADD),  # no grant
        _op(1, 2, ADD, grant=forged_grant),
        _op(
            1, 2, ADD, Role.ADMIN, grant=grant_admin(KEYS[0], PROOF, USERS[1])
        ),  # admins make no admins
        _op(1, 0, REMOVE, grant=grant_admin(KEYS[0], PROOF, USERS[1])),  # nor remove the creator
        MembershipOp.create(KEYS[0], CHAT, USERS[1], ADD, Hlc(9)),  # no chat proof
        MembershipOp.create(
            KEYS[0], b"\x01" * 32, USERS[1], ADD, Hlc(9), proof=PROOF
        ),  # wrong chat
        MembershipOp.create(
            KEYS[2], CHAT, USERS[1], ADD, Hlc(9), proof=new_group(KEYS[2], b"x" * 16)
        ),
    ]
    for op in denied:
        with pytest.raises(Unauthorized):
            op.authorize()


def test_dm_membership() -> None:
    proof = DmProof(USERS[0], USERS[1])
    chat = proof.chat_id()
    ok = MembershipOp.create(KEYS[1], chat, USERS[0], MembershipAction.ADD, Hlc(3), proof=proof)
    ok.authorize()
    outsider = MembershipOp.create(
        KEYS[2], chat, USERS[2], MembershipAction.ADD, Hlc(3), proof=proof
    )
    with pytest.raises(Unauthorized):
        outsider.authorize()


def test_member_rows_from_peers_carry_their_signed_ops() -> None:
    from store.merge import merge_member_states
    from store.records import MemberRecord

    add_op = _op(0, 1, MembershipAction.ADD, Role.ADMIN)
    leave = MembershipOp.create(
        KEYS[1], CHAT, USERS[1], MembershipAction.LEAVE, Hlc(12), proof=PROOF
    )
    info = merge_member_states(add_op.state(), leave.state())
    assert info is not None and not info.active
    verify_member_record(MemberRecord(CHAT, USERS[1], info))
    unsigned = type(info)(info.role, info.added_at, info.removed_at)  # the stamps alone
    with pytest.raises(Unauthorized):
        verify_member_record(MemberRecord(CHAT, USERS[1], unsigned))
    promoted = type(info)(Role.ADMIN, Hlc(99), info.removed_at, info.add_proof, info.remove_proof)
    with pytest.raises(BadSignature):  # a stamp the proof does not back
        verify_member_record(MemberRecord(CHAT, USERS[1], promoted))
    with pytest.raises(BadSignature):  # a proof for another row
        verify_member_record(MemberRecord(CHAT, USERS[2], info))


GRANT_1 = grant_admin(KEYS[0], PROOF, USERS[1])
membership_ops = st.builds(
    lambda actor, user, action, ms, admin, grant: MembershipOp.create(
        KEYS[actor],
        CHAT,
        USERS[user],
        action,
        Hlc(ms),
        Role.ADMIN if admin else Role.PARTICIPANT,
        proof=PROOF,
        grant=GRANT_1 if grant else None,
    ),
    st.integers(0, 2),
    st.integers(0, 2),
    st.sampled_from(list(MembershipAction)),
    st.integers(1, 20),
    st.booleans(),
    st.booleans(),
)


@given(st.lists(membership_ops, max_size=25), st.randoms(use_true_random=False))
def test_replicas_fed_the_same_ops_in_any_order_end_equal(ops: list, rnd) -> None:  # type: ignore[no-untyped-def, type-arg]
    from store import merge_member_states

    def replay(order: list) -> dict:  # type: ignore[type-arg]
        rows: dict = {}  # type: ignore[type-arg]
        for op in order:
            try:
                validate_op(op, now_ms=10**6, max_offset_ms=0)
            except (Unauthorized, BadSignature):
                continue  # every replica refuses exactly the same ops
            key = (op.chat_id, op.user_id)
            rows[key] = merge_member_states(rows.get(key), op.state())
        return rows

    shuffled = ops[:]
    rnd.shuffle(shuffled)
    duplicated = shuffled + shuffled[: len(shuffled) // 2]
    assert replay(ops) == replay(shuffled) == replay(duplicated)


# --- what only an exact value or a single wrong field reaches --------------------------------


def test_the_wire_numbers_of_kinds_and_actions() -> None:
    # signed bytes and stored ops carry these numbers: renumbering breaks every signature
    assert [(k.name, int(k)) for k in OpKind] == [
        ("PUT_MESSAGE", 1),
        ("MEMBERSHIP", 2),
        ("PUT_IDENTITY", 3),
    ]
    assert [(a.name, int(a)) for a in MembershipAction] == [("ADD", 0), ("REMOVE", 1), ("LEAVE", 2)]
    add = MembershipOp.create(KEYS[0], CHAT, USERS[1], MembershipAction.ADD, Hlc(5), proof=PROOF)
    assert cbor2.loads(encode_ops([add]))[1][0][0] == 2
    assert cbor2.loads(add.encode())[3] == 0


@pytest.mark.parametrize("field", ["chat_id", "user_id", "actor_key", "sig"])
def test_a_membership_op_refuses_a_field_of_the_wrong_length(field: str) -> None:
    op = MembershipOp.create(KEYS[0], CHAT, USERS[1], MembershipAction.ADD, Hlc(5), proof=PROOF)
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(op, **{field: getattr(op, field)[:-1]})


def _indefinite(encoded: bytes) -> bytes:
    """The same array as an indefinite-length CBOR array: valid CBOR, not canonical."""
    items = cbor2.loads(encoded)
    return b"\x9f" + b"".join(cbor2.dumps(i, canonical=True) for i in items) + b"\xff"


def test_non_canonical_ops_and_identity_docs_are_refused() -> None:
    op = MembershipOp.create(KEYS[0], CHAT, USERS[1], MembershipAction.ADD, Hlc(5), proof=PROOF)
    assert decode_membership_op(op.encode()) == op
    with pytest.raises(DecodeError) as info:
        decode_membership_op(_indefinite(op.encode()))
    assert info.value.reason == "non_canonical"
    blob = make_identity(KEYS[1], bytes(32), Hlc(5)).blob
    assert decode_identity_doc(blob).box_key == bytes(32)
    with pytest.raises(DecodeError) as info:
        decode_identity_doc(_indefinite(blob))
    assert info.value.reason == "non_canonical"


def test_an_identity_box_key_is_32_bytes() -> None:
    with pytest.raises(ValueError, match="box_key"):
        make_identity(KEYS[1], bytes(31), Hlc(5))


def test_op_author_is_who_signed() -> None:
    msg = MsgV1.create(KEYS[2], CHAT, Hlc(3), b"hi")
    remove = MembershipOp.create(
        KEYS[0], CHAT, USERS[1], MembershipAction.REMOVE, Hlc(5), proof=PROOF
    )
    identity = make_identity(KEYS[1], bytes(32), Hlc(5))
    assert [op_author(o) for o in (msg, remove, identity)] == [USERS[2], USERS[0], USERS[1]]


def test_an_envelope_of_exactly_max_ops_is_taken() -> None:
    batch = [MsgV1.create(KEYS[0], CHAT, Hlc(n + 1), b"") for n in range(3)]
    assert decode_ops(encode_ops(batch), max_bytes=1 << 20, max_ops=3) == batch
    with pytest.raises(DecodeError):
        decode_ops(encode_ops(batch), max_bytes=1 << 20, max_ops=2)


def test_validate_op_applies_the_membership_rule() -> None:
    # correctly signed by USERS[1], who holds no say in the group
    forged = MembershipOp.create(KEYS[1], CHAT, USERS[2], MembershipAction.ADD, Hlc(5), proof=PROOF)
    forged.verify()
    with pytest.raises(Unauthorized):
        validate_op(forged, now_ms=10, max_offset_ms=0)


def test_a_member_row_is_refused_unless_each_stamp_has_its_own_valid_proof() -> None:
    from store.hlc import HLC_ZERO
    from store.records import MemberInfo, MemberRecord

    add = _op(0, 1, MembershipAction.ADD)
    remove = _op(0, 1, MembershipAction.REMOVE)
    row = MemberInfo(Role.PARTICIPANT, add.hlc, None, add.encode())
    verify_member_record(MemberRecord(CHAT, USERS[1], row))
    refused = {
        "tombstone with an add proof": MemberInfo(
            Role.PARTICIPANT, HLC_ZERO, remove.hlc, add.encode(), remove.encode()
        ),
        "an add as the remove proof": MemberInfo(
            Role.PARTICIPANT, add.hlc, Hlc(20), add.encode(), add.encode()
        ),
        "a remove proof of another stamp": MemberInfo(
            Role.PARTICIPANT, add.hlc, Hlc(20), add.encode(), remove.encode()
        ),
        "never removed, with a remove proof": MemberInfo(
            Role.PARTICIPANT, add.hlc, None, add.encode(), remove.encode()
        ),
        "a proof whose signature fails": MemberInfo(
            Role.PARTICIPANT, add.hlc, None, add.encode()[:-1] + bytes([add.encode()[-1] ^ 1])
        ),
    }
    for what, info in refused.items():
        with pytest.raises(BadSignature):
            verify_member_record(MemberRecord(CHAT, USERS[1], info))
            pytest.fail(what)
    # correctly signed by USERS[2], who may not add anyone: a proof must be authorized too
    forged = _op(2, 1, MembershipAction.ADD)
    with pytest.raises(Unauthorized):
        verify_member_record(
            MemberRecord(
                CHAT, USERS[1], MemberInfo(Role.PARTICIPANT, forged.hlc, None, forged.encode())
            )
        )


def test_a_member_op_s_kept_bytes_are_its_own_and_never_a_copy_s() -> None:
    op = MembershipOp.create(KEYS[0], CHAT, USERS[1], MembershipAction.ADD, Hlc(7), proof=PROOF)
    first = op.encode()
    assert op.encode() is first  # kept: encoded once
    other = dataclasses.replace(op, role=Role.ADMIN)  # a new op: its own bytes
    assert other.encode() != first
    assert decode_membership_op(other.encode()) == other
    assert other == dataclasses.replace(op, role=Role.ADMIN)  # kept bytes are no part of ==
    assert decode_membership_op(first) == op
    assert op.op_id == member_op_id(first) and other.op_id == member_op_id(other.encode())
    assert other.op_id != op.op_id  # the id, kept like the bytes, is the new op's own
