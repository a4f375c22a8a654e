"""What a posting command puts in a payload: text sealed for the chat's readers — to the other
party in a DM (``client/e2e.py``), to the members in a group (``client/group_keys.py``) — or,
asked for with ``--plain``, the text as is. Reactions in a group are sealed too."""

from __future__ import annotations

from dataclasses import dataclass, field

from client.e2e import E2eError, UserKey, seal_dm
from client.group_e2e import is_group_sealed, open_reaction, seal_reaction
from client.group_keys import GroupKeys
from client.http import ChatsyncClient
from client.shell import console, fail
from store.authz import DmProof
from store.hlc import Hlc
from store.ops import Op
from store.records import MsgV1


@dataclass(frozen=True)
class Content:
    """A payload and the stamp it was sealed for; ``before``: what to post ahead of it (a
    group's key grants)."""

    payload: bytes
    hlc: Hlc
    before: list[Op] = field(default_factory=list)


def identity_ops(client: ChatsyncClient, key: UserKey) -> list[Op]:
    """The user's identity record, if the node lacks it or has another box key."""
    doc = client.identity_doc(key.user_id)
    if doc is not None and doc.box_key == key.box_key:
        return []
    return [key.identity(client.now())]


def seal_text(
    client: ChatsyncClient, key: UserKey, chat_id: bytes, text: bytes, *, plain: bool = False
) -> Content:
    """``text`` sealed for ``chat_id``'s readers (one line and an exit when it cannot be)."""
    if plain:
        return Content(text, client.now())
    proof = client.chat_proof(chat_id)
    if proof is None:
        raise fail(
            f"this node knows no chat {chat_id.hex()} (a wrong id, or not synced here yet): "
            "no members to encrypt to"
        )
    if isinstance(proof, DmProof):
        other = proof.user_b if proof.user_a == key.user_id else proof.user_a
        doc = client.identity_doc(other)
        if doc is None:
            raise fail(f"user {other.hex()} has no identity on this node: nothing to encrypt to")
        return Content(seal_dm(key, doc.box_key, text), client.now())
    keys = GroupKeys(client, key, chat_id)
    sealed, hlc = keys.seal(text, client.now)
    before = [*identity_ops(client, key), *sealed.grants]  # readers check grants against it
    if sealed.left_out:
        console.print(
            f"warning: {len(sealed.left_out)} member(s) published no identity, so cannot read "
            f"it: {', '.join(u.hex()[:12] for u in sealed.left_out)} (`chatsync publish`)",
            soft_wrap=True,
        )
    return Content(sealed.payload, hlc, before)


def reaction_key(client: ChatsyncClient, key: UserKey, target: MsgV1, reaction: bytes) -> bytes:
    """The key of a reaction to ``target``: sealed with the target's key when the target is a
    sealed group message (equal reactions stay equal bytes), else the reaction as is."""
    if not is_group_sealed(target.payload):
        return reaction
    target_key = GroupKeys(client, key, target.chat_id).message_key(target)
    if target_key is None:
        raise fail("no key of that message reached you: you cannot read it, nor react to it")
    try:
        return seal_reaction(target_key, reaction)
    except ValueError as exc:
        raise fail(str(exc)) from None


def open_reaction_key(keys: GroupKeys, target: MsgV1, sealed: bytes) -> str:
    """A reaction key as text: opened with the target's key when it is sealed."""
    if not is_group_sealed(target.payload):
        return sealed.decode(errors="replace")
    try:
        target_key = keys.message_key(target)
        if target_key is None:
            return "[sealed]"
        return open_reaction(target_key, sealed).decode(errors="replace")
    except E2eError:
        return "[sealed]"
