"""Signed ops — what clients submit and gossip carries — and their batch envelope. Pure.

Three op kinds (seed 002's DbOp vocabulary):

* ``MsgV1`` (PutMessage): already signed by its author (``store.records``).
* ``MembershipOp``: add / remove / leave one user in one chat, signed by the actor.
  Applied as a CRDT state (``merge.add_op_state`` / ``remove_op_state``), so
  order and duplication do not matter. Leave is a remove by the user itself.
* ``IdentityRecord`` (PutIdentity) whose blob is an ``IdentityDoc``: the user's
  ed25519 signing key, x25519 box key (for end-to-end encrypted DMs) and a
  signature over (user, hlc, keys) — self-certifying: anyone can check that the
  blob belongs to the user id, so it may travel through any peer.

A gossip message carries many ops: ``[1, [[kind, bytes], ...]]`` (batching is
what makes py-libp2p's ~2 ms per message per hop affordable).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from itertools import pairwise
from typing import Any

import cbor2
from nacl.signing import SigningKey

from store import signing
from store.authz import AdminGrant, ChatProof, Unauthorized, authorize, decode_grant, decode_proof
from store.errors import BadSignature, DecodeError, shown
from store.hlc import HLC_ZERO, Hlc
from store.keys import CHAT_ID_LEN, USER_ID_LEN, check_len
from store.merge import add_op_state, remove_op_state
from store.records import (
    DEFAULT_MAX_PAYLOAD,
    MAX_IDENTITY_BLOB,
    MAX_PROOF,
    IdentityRecord,
    MemberInfo,
    MemberRecord,
    MsgV1,
    OversizeRecord,
    Role,
    blake3_id,
    canonical_cbor,
    decode_identity_record,
    decode_msg,
    ensure_canonical,
    field_bytes,
    field_enum,
    field_hlc,
    load_array,
)

MEMBERSHIP_DOMAIN = b"chatsync/membership/v1\x00"
IDENTITY_DOMAIN = b"chatsync/identity/v1\x00"
BOX_KEY_LEN = 32


class OpKind(IntEnum):
    PUT_MESSAGE = 1
    MEMBERSHIP = 2
    PUT_IDENTITY = 3


class MembershipAction(IntEnum):
    ADD = 0
    REMOVE = 1
    LEAVE = 2


@dataclass(frozen=True, slots=True)
class MembershipOp:
    """Add / remove / leave, signed by the actor; ``proof`` binds the chat id to who controls it."""

    chat_id: bytes
    user_id: bytes
    action: MembershipAction
    role: Role
    hlc: Hlc
    actor_key: bytes
    sig: bytes
    proof: ChatProof | None = None  # required by a node (store.authz)
    grant: AdminGrant | None = None  # when the actor is an admin, not the creator
    # its bytes and its id, once computed: the id is taken wherever the op goes (the planner,
    # the member index, every replica of a simulation), and a frozen op's bytes never change
    _encoded: bytes | None = field(default=None, init=False, repr=False, compare=False)
    _op_id: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_len(self.chat_id, CHAT_ID_LEN, "chat_id")
        check_len(self.user_id, USER_ID_LEN, "user_id")
        check_len(self.actor_key, signing.PUBLIC_KEY_LEN, "actor_key")
        check_len(self.sig, signing.SIGNATURE_LEN, "sig")

    def _body(self) -> list[Any]:
        return [
            1, self.chat_id, self.user_id, int(self.action), int(self.role),
            self.hlc.pack(), self.actor_key,
            None if self.proof is None else self.proof.to_cbor(),
            None if self.grant is None else self.grant.to_cbor(),
        ]  # fmt: skip

    def encode(self) -> bytes:
        encoded = self._encoded
        if encoded is None:
            encoded = canonical_cbor([*self._body(), self.sig])
            object.__setattr__(self, "_encoded", encoded)
        return encoded

    @property
    def op_id(self) -> bytes:
        """Its record id in the MEMBERS domain: ``member_op_id`` of its bytes."""
        op_id = self._op_id
        if op_id is None:
            op_id = member_op_id(self.encode())
            object.__setattr__(self, "_op_id", op_id)
        return op_id

    @property
    def actor(self) -> bytes:
        return signing.user_id_from_key(self.actor_key)

    @classmethod
    def create(
        cls,
        key: SigningKey,
        chat_id: bytes,
        user_id: bytes,
        action: MembershipAction,
        hlc: Hlc,
        role: Role = Role.PARTICIPANT,
        *,
        proof: ChatProof | None = None,
        grant: AdminGrant | None = None,
    ) -> MembershipOp:
        actor_key = signing.public_key(key)
        unsigned = cls(
            chat_id,
            user_id,
            action,
            role,
            hlc,
            actor_key,
            bytes(signing.SIGNATURE_LEN),
            proof,
            grant,
        )
        sig = signing.sign(key, MEMBERSHIP_DOMAIN, canonical_cbor(unsigned._body()))
        return cls(chat_id, user_id, action, role, hlc, actor_key, sig, proof, grant)

    def verify(self) -> None:
        """The signature (and that a leave is the leaver's own)."""
        if self.action is MembershipAction.LEAVE and self.actor != self.user_id:
            raise BadSignature("a leave must be signed by the user who leaves")
        signing.verify(self.actor_key, MEMBERSHIP_DOMAIN, canonical_cbor(self._body()), self.sig)

    def authorize(self) -> None:
        """The membership rule of store.authz: raises Unauthorized (or without a proof)."""
        if self.proof is None:
            raise Unauthorized("a membership op must carry its chat proof")
        authorize(
            chat_id=self.chat_id,
            user=self.user_id,
            removes=self.action is not MembershipAction.ADD,
            admin_role=self.role is Role.ADMIN,
            actor=self.actor,
            proof=self.proof,
            grant=self.grant,
        )

    def state(self) -> MemberInfo:
        """The CRDT state this op contributes (merged into the stored row)."""
        if self.action is MembershipAction.ADD:
            return add_op_state(self.role, self.hlc, self.encode())
        return remove_op_state(self.hlc, self.encode())


def member_op_id(encoded: bytes) -> bytes:
    """A member op's record id in the MEMBERS sync domain: BLAKE3 of its canonical bytes."""
    return blake3_id(encoded)


def decode_membership_op(data: bytes) -> MembershipOp:
    v = load_array(data, what="MembershipOp", version=1, fields=10, max_bytes=MAX_PROOF)
    op = MembershipOp(
        field_bytes(v[1], "chat_id", length=CHAT_ID_LEN),
        field_bytes(v[2], "user_id", length=USER_ID_LEN),
        MembershipAction(field_enum(v[3], MembershipAction, "action")),
        Role(field_enum(v[4], Role, "role")),
        field_hlc(v[5], "hlc"),
        field_bytes(v[6], "actor_key", length=signing.PUBLIC_KEY_LEN),
        field_bytes(v[9], "sig", length=signing.SIGNATURE_LEN),
        None if v[7] is None else decode_proof(v[7]),
        decode_grant(v[8]),
    )
    ensure_canonical(v, data, "MembershipOp")
    return op


def verify_member_record(record: MemberRecord) -> None:
    """A member row from a peer: each stamp must come from a signed, authorized op for this row."""
    info = record.info
    if info.added_at != HLC_ZERO:
        op = _proof_op(info.add_proof, record, "add")
        if op.action is not MembershipAction.ADD or op.hlc != info.added_at or op.role != info.role:
            raise BadSignature("add proof does not match the row's added_at and role")
    elif info.add_proof is not None:
        raise BadSignature("a tombstone-only row carries no add proof")
    if info.removed_at is not None:
        op = _proof_op(info.remove_proof, record, "remove")
        if op.action is MembershipAction.ADD or op.hlc != info.removed_at:
            raise BadSignature("remove proof does not match the row's removed_at")
    elif info.remove_proof is not None:
        raise BadSignature("a row never removed carries no remove proof")


def _proof_op(proof: bytes | None, record: MemberRecord, what: str) -> MembershipOp:
    if proof is None:
        raise Unauthorized(f"member row without its signed {what} op")
    op = decode_membership_op(proof)
    if (op.chat_id, op.user_id) != (record.chat_id, record.user_id):
        raise BadSignature(f"{what} proof is for another row")
    op.verify()
    op.authorize()
    return op


# --- identity documents -------------------------------------------------------------------

MAX_HOME_NODES = 8  # a user's home nodes: a handful, like a dm3 profile's delivery services
MAX_NODE_ID = 64  # a libp2p peer id's bytes (an ed25519 identity multihash is 38)
IDENTITY_DOMAIN_V2 = b"chatsync/identity/v2\x00"  # signs the home nodes too


@dataclass(frozen=True, slots=True)
class IdentityDoc:
    """The identity blob: signing key, box key, the user's **home nodes** (the peer ids of
    the nodes that serve it: SYNC.md, "Scopes") and the signature binding them to
    (user, hlc). Without home nodes it is version 1, byte for byte as before; with them,
    version 2 ``[2, sign_key, box_key, [node, ...], sig]``, the nodes strictly ascending
    (one encoding per set), signed under its own domain so neither version reads as the
    other."""

    sign_key: bytes
    box_key: bytes
    sig: bytes
    home_nodes: tuple[bytes, ...] = ()

    def encode(self) -> bytes:
        if not self.home_nodes:
            return canonical_cbor([1, self.sign_key, self.box_key, self.sig])
        return canonical_cbor([2, self.sign_key, self.box_key, list(self.home_nodes), self.sig])


def _identity_body(
    user_id: bytes, hlc: Hlc, sign_key: bytes, box_key: bytes, home_nodes: tuple[bytes, ...]
) -> tuple[bytes, bytes]:
    """(domain, signed bytes) of a document's version."""
    body = user_id + hlc.to_bytes() + sign_key + box_key
    if not home_nodes:
        return IDENTITY_DOMAIN, body
    return IDENTITY_DOMAIN_V2, body + canonical_cbor(list(home_nodes))


def check_home_nodes(home_nodes: Sequence[bytes]) -> tuple[bytes, ...]:
    """The home nodes as a document holds them; DecodeError (or OversizeRecord) for a list
    too long, an id empty or too long, or one out of order or repeated."""
    if len(home_nodes) > MAX_HOME_NODES:
        raise OversizeRecord(f"{len(home_nodes)} home nodes, over the limit of {MAX_HOME_NODES}")
    nodes = tuple(field_bytes(n, "home node", max_len=MAX_NODE_ID) for n in home_nodes)
    if any(not n for n in nodes):
        raise DecodeError("a home node's id is empty", reason="wrong_length")
    if any(a >= b for a, b in pairwise(nodes)):
        raise DecodeError("home nodes must be strictly ascending", reason="non_canonical")
    return nodes


def make_identity(
    key: SigningKey, box_key: bytes, hlc: Hlc, home_nodes: Iterable[bytes] = ()
) -> IdentityRecord:
    """A self-certifying IdentityRecord for the owner of ``key``, naming ``home_nodes``."""
    sign_key = signing.public_key(key)
    user_id = signing.user_id_from_key(sign_key)
    check_len(box_key, BOX_KEY_LEN, "box_key")
    nodes = check_home_nodes(sorted(set(home_nodes)))
    domain, body = _identity_body(user_id, hlc, sign_key, box_key, nodes)
    sig = signing.sign(key, domain, body)
    return IdentityRecord(user_id, hlc, IdentityDoc(sign_key, box_key, sig, nodes).encode())


def decode_identity_doc(blob: bytes) -> IdentityDoc:
    # a canonical version-2 array starts 0x85 0x02; anything else is read as version 1
    if bytes(blob[:2]) == b"\x85\x02":
        v = load_array(blob, what="IdentityDoc", version=2, fields=5, max_bytes=MAX_IDENTITY_BLOB)
        if type(v[3]) is not list or not v[3]:
            raise DecodeError("home nodes must be a non-empty array", reason="wrong_type")
        nodes, sig = check_home_nodes(v[3]), v[4]
    else:
        v = load_array(blob, what="IdentityDoc", version=1, fields=4, max_bytes=256)
        nodes, sig = (), v[3]
    doc = IdentityDoc(
        field_bytes(v[1], "sign_key", length=signing.PUBLIC_KEY_LEN),
        field_bytes(v[2], "box_key", length=BOX_KEY_LEN),
        field_bytes(sig, "sig", length=signing.SIGNATURE_LEN),
        nodes,
    )
    ensure_canonical(v, blob, "IdentityDoc")
    return doc


def verify_identity(record: IdentityRecord) -> IdentityDoc:
    """Raise unless the blob is an IdentityDoc signed by the key that owns ``record.user_id``
    (its home nodes included)."""
    doc = decode_identity_doc(record.blob)
    if signing.user_id_from_key(doc.sign_key) != record.user_id:
        raise BadSignature("identity blob's key does not own this user id")
    domain, body = _identity_body(
        record.user_id, record.hlc, doc.sign_key, doc.box_key, doc.home_nodes
    )
    signing.verify(doc.sign_key, domain, body, doc.sig)
    return doc


# --- ops and their envelope ---------------------------------------------------------------

Op = MsgV1 | MembershipOp | IdentityRecord


def op_kind(op: Op) -> OpKind:
    if isinstance(op, MsgV1):
        return OpKind.PUT_MESSAGE
    if isinstance(op, MembershipOp):
        return OpKind.MEMBERSHIP
    return OpKind.PUT_IDENTITY


def op_author(op: Op) -> bytes:
    """The user id that signed ``op`` (what per-author limits count)."""
    if isinstance(op, MsgV1):
        return op.sender
    if isinstance(op, MembershipOp):
        return op.actor
    return op.user_id


def encode_op(op: Op) -> bytes:
    return op.encoded if isinstance(op, MsgV1) else op.encode()


def encode_ops(ops: list[Op]) -> bytes:
    return cbor2.dumps([1, [[int(op_kind(op)), encode_op(op)] for op in ops]])


def decode_op(kind: int, data: bytes, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> Op:
    if kind == OpKind.PUT_MESSAGE:
        return decode_msg(data, max_payload=max_payload)
    if kind == OpKind.MEMBERSHIP:
        return decode_membership_op(data)
    if kind == OpKind.PUT_IDENTITY:
        return decode_identity_record(data)
    raise DecodeError(f"unknown op kind {shown(kind)}", reason="unknown_kind")


def decode_ops(
    data: bytes, *, max_bytes: int, max_ops: int, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> list[Op]:
    """The ops of one envelope; DecodeError if the envelope or any op is malformed."""
    v = load_array(data, what="op batch", version=1, fields=2, max_bytes=max_bytes)
    items = v[1]
    if type(items) is not list or len(items) > max_ops:
        raise DecodeError(
            f"op batch must be an array of at most {max_ops} ops", reason="wrong_type"
        )
    ops = []
    for item in items:
        if type(item) is not list or len(item) != 2 or type(item[1]) is not bytes:
            raise DecodeError("op must be [kind, bytes]", reason="wrong_type")
        ops.append(decode_op(item[0], item[1], max_payload=max_payload))
    return ops
