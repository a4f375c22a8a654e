"""Who may change a chat's membership: a pure function of the op and its chat id.

Every replica must accept or reject the same membership ops whatever order
they arrive in, so the rule may look only at the op itself — never at the
replica's current member list. That is possible because a chat id commits to
who controls the chat:

* **Group chats**: ``chat_id = BLAKE3(tag ‖ creator_key ‖ nonce)``. An op carries
  the ``GroupProof`` (creator key, nonce) so anyone can check who the creator is.
* **DM chats**: ``chat_id = dm_chat_id(a, b)``. An op carries the ``DmProof`` (a, b).

The rule (``authorize``):

1. the creator of a group may add or remove anyone, with any role;
2. an **admin** — a user holding an ``AdminGrant`` for this chat signed by the
   creator, carried in the op — may add participants and remove anyone but the creator;
3. anyone may remove themself (remove or leave with ``user == actor``);
4. in a DM, either party may add or remove either party, as a participant;
5. nothing else.

Grants are not revocable (revocation would need an order between the grant and
the ops it would invalidate); a creator who must demote an admin moves the
group to a new chat id. The signature of the op itself is checked by
``MembershipOp.verify`` before this rule runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nacl.signing import SigningKey

from store import signing
from store.errors import BadSignature, DecodeError, InvalidInput
from store.keys import CHAT_ID_LEN, USER_ID_LEN, check_len
from store.records import blake3_id, dm_chat_id, field_bytes

GROUP_DOMAIN = b"chatsync/group/v1\x00"
GRANT_DOMAIN = b"chatsync/admin-grant/v1\x00"
NONCE_LEN = 16


class Unauthorized(InvalidInput):
    """A well-formed, correctly signed op that its actor may not perform."""

    reason = "unauthorized"


def group_chat_id(creator_key: bytes, nonce: bytes) -> bytes:
    check_len(creator_key, signing.PUBLIC_KEY_LEN, "creator_key")
    check_len(nonce, NONCE_LEN, "nonce")
    return blake3_id(GROUP_DOMAIN, creator_key, nonce)


@dataclass(frozen=True, slots=True)
class GroupProof:
    creator_key: bytes
    nonce: bytes

    @property
    def creator(self) -> bytes:
        return signing.user_id_from_key(self.creator_key)

    def chat_id(self) -> bytes:
        return group_chat_id(self.creator_key, self.nonce)

    def to_cbor(self) -> list[Any]:
        return [0, self.creator_key, self.nonce]


@dataclass(frozen=True, slots=True)
class DmProof:
    user_a: bytes
    user_b: bytes

    def chat_id(self) -> bytes:
        return dm_chat_id(self.user_a, self.user_b)

    def parties(self) -> bytes:
        """Both user ids, lower first: how a replica keeps them (``store.access.Access``)."""
        return b"".join(sorted((self.user_a, self.user_b)))

    def to_cbor(self) -> list[Any]:
        return [1, self.user_a, self.user_b]


ChatProof = GroupProof | DmProof


@dataclass(frozen=True, slots=True)
class AdminGrant:
    """The creator's signature making ``admin`` an admin of the proof's group."""

    admin: bytes
    sig: bytes

    def to_cbor(self) -> list[Any]:
        return [self.admin, self.sig]


def new_group(creator: SigningKey, nonce: bytes) -> GroupProof:
    return GroupProof(signing.public_key(creator), check_len(nonce, NONCE_LEN, "nonce"))


def grant_admin(creator: SigningKey, proof: GroupProof, admin: bytes) -> AdminGrant:
    check_len(admin, USER_ID_LEN, "admin")
    if signing.public_key(creator) != proof.creator_key:
        raise ValueError("only the group's creator can grant admin")
    return AdminGrant(admin, signing.sign(creator, GRANT_DOMAIN, proof.chat_id() + admin))


def decode_proof(value: Any) -> ChatProof:
    if type(value) is not list or not value or type(value[0]) is not int:
        raise DecodeError("chat proof must be [kind, ...]", reason="wrong_type")
    if value[0] == 0 and len(value) == 3:
        return GroupProof(
            field_bytes(value[1], "creator_key", length=signing.PUBLIC_KEY_LEN),
            field_bytes(value[2], "nonce", length=NONCE_LEN),
        )
    if value[0] == 1 and len(value) == 3:
        return DmProof(
            field_bytes(value[1], "user_a", length=USER_ID_LEN),
            field_bytes(value[2], "user_b", length=USER_ID_LEN),
        )
    raise DecodeError("unknown chat proof", reason="wrong_type")


def decode_grant(value: Any) -> AdminGrant | None:
    if value is None:
        return None
    if type(value) is not list or len(value) != 2:
        raise DecodeError("admin grant must be [admin, sig]", reason="wrong_type")
    return AdminGrant(
        field_bytes(value[0], "admin", length=USER_ID_LEN),
        field_bytes(value[1], "sig", length=signing.SIGNATURE_LEN),
    )


def authorize(
    *,
    chat_id: bytes,
    user: bytes,
    removes: bool,
    admin_role: bool,
    actor: bytes,
    proof: ChatProof,
    grant: AdminGrant | None,
) -> None:
    """Raise Unauthorized unless ``actor`` may add (or remove) ``user`` in ``chat_id``."""
    check_len(chat_id, CHAT_ID_LEN, "chat_id")
    if proof.chat_id() != chat_id:
        raise Unauthorized("the chat proof does not derive this chat id")
    if removes and user == actor:
        return  # anyone may leave
    if isinstance(proof, DmProof):
        parties = {proof.user_a, proof.user_b}
        if actor in parties and user in parties and not admin_role:
            return
        raise Unauthorized("in a DM only its two parties, as participants")
    if actor == proof.creator:
        return
    if grant is None or grant.admin != actor:
        raise Unauthorized("only the creator, an admin it granted, or the user itself")
    try:
        signing.verify(proof.creator_key, GRANT_DOMAIN, chat_id + grant.admin, grant.sig)
    except BadSignature:
        raise Unauthorized("the admin grant is not signed by the creator") from None
    if (not removes and admin_role) or (removes and user == proof.creator):
        raise Unauthorized("an admin may add participants and remove anyone but the creator")
