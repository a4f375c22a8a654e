"""``chatsync edit``, ``delete``, ``react`` and ``read``: signed messages about another
message (MESSAGES.md), through ``POST /ops`` (a receipt: ``PUT .../read``). The node refuses
what it can already tell (someone else's message, a deleted one) with a JSON code, printed as
one line."""

from __future__ import annotations

import typer

from client.commands import (
    DEFAULT_KEY_FILE,
    DEFAULT_NODE,
    clear_errors,
    console,
    fail,
    load_key,
    parse_hex,
)
from client.e2e import UserKey, seal_dm
from client.http import ChatsyncClient, hlc_of
from store.authz import DmProof
from store.keys import CHAT_ID_LEN, MSG_ID_LEN
from store.kinds import Claims, reaction_payload
from store.records import MessageKind, MsgV1

CHAT = typer.Option(..., "--chat", help="Chat id (hex).")
KEY = typer.Option(DEFAULT_KEY_FILE, "--key", help="Your key file.")
NODE = typer.Option(DEFAULT_NODE, "--node", help="Node HTTP URL.")


def edit(
    msg_id: str = typer.Argument(..., help="The message to edit (hex id): one of yours."),
    text: str = typer.Argument(..., help="The new text."),
    chat: str = CHAT,
    key_file: str = KEY,
    node: str = NODE,
) -> None:
    """Replace the text of one of your messages (in a DM: encrypted again to the other party)."""
    chat_id, target = parse_hex(chat, CHAT_ID_LEN, "--chat"), parse_hex(msg_id, MSG_ID_LEN, "id")
    key = load_key(key_file)
    with clear_errors(), ChatsyncClient(node, key=key.signing_key) as client:
        payload = content_payload(client, key, chat_id, text.encode())
        about(client, key, chat_id, target, MessageKind.EDIT, payload)
    console.print(f"edited {target.hex()}", soft_wrap=True)


def delete(
    msg_id: str = typer.Argument(..., help="The message to delete for everyone (hex id)."),
    chat: str = CHAT,
    key_file: str = KEY,
    node: str = NODE,
) -> None:
    """Delete a message for everyone: yours, or anyone's if you are an admin of the group.
    Every node erases its text, its edits and its reactions; a tombstone stays."""
    chat_id, target = parse_hex(chat, CHAT_ID_LEN, "--chat"), parse_hex(msg_id, MSG_ID_LEN, "id")
    key = load_key(key_file)
    with clear_errors(), ChatsyncClient(node, key=key.signing_key) as client:
        msg = held_message(client, chat_id, target)
        about(client, key, chat_id, target, MessageKind.DELETE, Claims.of(msg).encode())
    console.print(f"deleted {target.hex()}", soft_wrap=True)


def react(
    msg_id: str = typer.Argument(..., help="The message to react to (hex id)."),
    reaction: str = typer.Argument(..., help="The reaction, e.g. an emoji."),
    retract: bool = typer.Option(False, "--retract", help="Take your reaction back."),
    chat: str = CHAT,
    key_file: str = KEY,
    node: str = NODE,
) -> None:
    """React to a message, or (--retract) take the reaction back: the latest of yours wins."""
    chat_id, target = parse_hex(chat, CHAT_ID_LEN, "--chat"), parse_hex(msg_id, MSG_ID_LEN, "id")
    key = load_key(key_file)
    try:
        payload = reaction_payload(reaction.encode(), retract=retract)
    except ValueError as exc:
        raise fail(str(exc)) from None
    with clear_errors(), ChatsyncClient(node, key=key.signing_key) as client:
        about(client, key, chat_id, target, MessageKind.REACTION, payload)
    console.print(f"{'retracted' if retract else 'reacted'} {reaction} on {target.hex()}")


def read(
    msg_id: str = typer.Argument(
        None, help="The newest message you have read (hex id); default: the chat's newest."
    ),
    chat: str = CHAT,
    key_file: str = KEY,
    node: str = NODE,
) -> None:
    """Mark the chat read up to a message: a signed receipt, so every node counts your unread
    messages the same."""
    chat_id = parse_hex(chat, CHAT_ID_LEN, "--chat")
    key = load_key(key_file)
    with clear_errors(), ChatsyncClient(node, key=key.signing_key) as client:
        if msg_id is None:
            newest = client.history(chat_id, limit=1).messages
            if not newest:
                raise fail(f"chat {chat_id.hex()} has no message to read")
            target = newest[0].msg
        else:
            target = held_message(client, chat_id, parse_hex(msg_id, MSG_ID_LEN, "id"))
        state = client.read_state(key.user_id, chat_id)
        known = state["position"]
        if known is not None and hlc_of(known) >= target.hlc:  # a receipt would change nothing
            console.print(f"already read past it; unread {state['unread']}", soft_wrap=True)
            return
        state = client.mark_read(key.signing_key, target)
    console.print(f"read up to {target.msg_id.hex()}; unread {state['unread']}", soft_wrap=True)


def held_message(client: ChatsyncClient, chat_id: bytes, msg_id: bytes) -> MsgV1:
    """The message as the node holds it, or a one-line failure."""
    msg = client.message(chat_id, msg_id)
    if msg is None:
        raise fail(f"this node holds no message {msg_id.hex()} in chat {chat_id.hex()}")
    return msg


def about(
    client: ChatsyncClient,
    key: UserKey,
    chat_id: bytes,
    target: bytes,
    kind: MessageKind,
    payload: bytes,
) -> MsgV1:
    msg = MsgV1.create(key.signing_key, chat_id, client.now(), payload, kind=kind, ref=target)
    client.post([msg])
    return msg


def content_payload(client: ChatsyncClient, key: UserKey, chat_id: bytes, text: bytes) -> bytes:
    """The text as is in a group; sealed to the other party in a DM."""
    proof = client.chat_proof(chat_id)
    if not isinstance(proof, DmProof):
        return text
    other = proof.user_b if proof.user_a == key.user_id else proof.user_a
    doc = client.identity_doc(other)
    if doc is None:
        raise fail(f"user {other.hex()} has no identity on this node: nothing to encrypt to")
    return seal_dm(key, doc.box_key, text)


def register(app: typer.Typer) -> None:
    app.command("edit")(edit)
    app.command("delete")(delete)
    app.command("react")(react)
    app.command("read")(read)
