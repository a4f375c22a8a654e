"""dm3 names of chatsync users, and the inbox chat a user's dm3 mail lands in. Pure.

dm3 finds a user's keys and delivery services through ENS; no chain is reachable from a
chatsync node, so the names the gateway serves are self-certifying instead: ``<user id
hex>.user.chatsync``. The user id is the hash of the user's ed25519 key — the key dm3 calls
``publicSigningKey`` — and the user's replicated identity record (``store.ops.IdentityDoc``)
holds that key and the x25519 box key dm3 calls ``publicEncryptionKey``. So any node can
resolve a name to its keys without a registry, and no one can claim another's name.

A user's **inbox** is a group chat whose id commits to the user's key and a fixed nonce
(``store.authz.group_chat_id``): every node derives it from the name alone. The user creates
it and adds the nodes they choose as delivery services as admins (``client/dm3.py``); a
gateway node then posts each envelope it accepts as a message of its own there, and deletes
what the user acknowledged — under the authorization rules every replica already applies
(SECURITY.md, "Who may post"; MESSAGES.md, "DELETE").
"""

from __future__ import annotations

from blake3 import blake3

from store.authz import NONCE_LEN, GroupProof
from store.keys import USER_ID_LEN

NAME_SUFFIX = ".user.chatsync"
INBOX_NONCE = blake3(b"chatsync/dm3-inbox/v1").digest()[:NONCE_LEN]


class UnknownName(ValueError):
    """Not the dm3 name of a chatsync user."""


def name_of(user_id: bytes) -> str:
    return user_id.hex() + NAME_SUFFIX


def user_of(name: str) -> bytes:
    """The user id a dm3 name stands for (dm3 compares names case-insensitively)."""
    hex_id = name.strip().lower().removesuffix(NAME_SUFFIX)
    if len(hex_id) != 2 * USER_ID_LEN or hex_id == name.strip().lower():
        raise UnknownName(f"{name[:80]!r} is not a chatsync dm3 name (<user id>{NAME_SUFFIX})")
    try:
        return bytes.fromhex(hex_id)
    except ValueError:
        raise UnknownName(f"{name[:80]!r} is not a chatsync dm3 name") from None


def user_or_none(name: str) -> bytes | None:
    """``user_of``, or None for a name that is not a chatsync user's (a foreign sender)."""
    try:
        return user_of(name)
    except UnknownName:
        return None


def inbox_proof(sign_key: bytes) -> GroupProof:
    """The proof (creator key, nonce) of the user's inbox: its id is ``proof.chat_id()``."""
    return GroupProof(sign_key, INBOX_NONCE)
