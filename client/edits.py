"""``chatsync edit``, ``delete``, ``react`` and ``read``: signed messages about another
message (MESSAGES.md), through ``POST /ops`` (a receipt: ``PUT .../read``). The node refuses
what it can already tell (someone else's message, a deleted one) with a JSON code, printed as
one line."""

from __future__ import annotations

import typer

from client.e2e import UserKey
from client.group_e2e import is_group_sealed
from client.http import ChatsyncClient, hlc_of
from client.posting import FILE_OPTION, member_errors, message_text, post_shown
from client.sealing import Content, reaction_key, seal_text
from client.shell import (
    DEFAULT_KEY_FILE,
    DEFAULT_NODE,
    clear_errors,
    console,
    fail,
    load_key,
    parse_hex,
)
from store.authz import DmProof
from store.keys import CHAT_ID_LEN, MSG_ID_LEN
from store.kinds import Claims, reaction_payload
from store.records import MessageKind, MsgV1

CHAT = typer.Option(..., "--chat", help="Chat id (hex).")
KEY = typer.Option(DEFAULT_KEY_FILE, "--key", help="Your key file.")
NODE = typer.Option(DEFAULT_NODE, "--node", help="Node HTTP URL.")
MSG_ID = typer.Argument(..., help="The message's id: whole, or its first 6+ hex digits (history).")
MIN_PREFIX = 6  # hex digits: fewer would often match several messages
RESOLVE_SCAN = 1000  # newest messages searched for a short id


def edit(
    msg_id: str = MSG_ID,
    text: str = typer.Argument(
        None, help="The new text; - (or none, stdin not a terminal): stdin."
    ),
    chat: str = CHAT,
    key_file: str = KEY,
    node: str = NODE,
    file: str = FILE_OPTION,
) -> None:
    """Replace the text of one of your messages, sealed as the message was (to the other party
    in a DM, to the members now in a group; a plain message's edit stays plain)."""
    chat_id = parse_hex(chat, CHAT_ID_LEN, "--chat")
    content = message_text(text, file)
    key = load_key(key_file)
    with (
        clear_errors(),
        ChatsyncClient(node, key=key.signing_key) as client,
        member_errors(client, chat_id),
    ):
        target = resolve_msg_id(client, chat_id, msg_id)
        sealed = seal_text(
            client, key, chat_id, content, plain=not is_sealed(client, chat_id, target)
        )
        about(client, key, chat_id, target, MessageKind.EDIT, sealed)
    console.print(f"edited {target.hex()}", soft_wrap=True)


def delete(
    msg_id: str = MSG_ID,
    chat: str = CHAT,
    key_file: str = KEY,
    node: str = NODE,
) -> None:
    """Delete a message for everyone: yours, or anyone's if you are an admin of the group.
    Every node erases its text, its edits and its reactions; a tombstone stays."""
    chat_id = parse_hex(chat, CHAT_ID_LEN, "--chat")
    key = load_key(key_file)
    with (
        clear_errors(),
        ChatsyncClient(node, key=key.signing_key) as client,
        member_errors(client, chat_id),
    ):
        target = resolve_msg_id(client, chat_id, msg_id)
        msg = held_message(client, chat_id, target)
        about(
            client,
            key,
            chat_id,
            target,
            MessageKind.DELETE,
            Content(Claims.of(msg).encode(), client.now()),
        )
    console.print(f"deleted {target.hex()}", soft_wrap=True)


def react(
    msg_id: str = MSG_ID,
    reaction: str = typer.Argument(..., help="The reaction, e.g. an emoji."),
    retract: bool = typer.Option(False, "--retract", help="Take your reaction back."),
    chat: str = CHAT,
    key_file: str = KEY,
    node: str = NODE,
) -> None:
    """React to a message, or (--retract) take the reaction back: the latest of yours wins."""
    chat_id = parse_hex(chat, CHAT_ID_LEN, "--chat")
    key = load_key(key_file)
    with (
        clear_errors(),
        ChatsyncClient(node, key=key.signing_key) as client,
        member_errors(client, chat_id),
    ):
        target = resolve_msg_id(client, chat_id, msg_id)
        sealed = reaction_key(client, key, held_message(client, chat_id, target), reaction.encode())
        try:
            payload = reaction_payload(sealed, retract=retract)
        except ValueError as exc:
            raise fail(str(exc)) from None
        about(client, key, chat_id, target, MessageKind.REACTION, Content(payload, client.now()))
    console.print(f"{'retracted' if retract else 'reacted'} {reaction} on {target.hex()}")


def read(
    msg_id: str = typer.Argument(
        None,
        help="The newest message you have read (its id, or 6+ first hex digits of it); "
        "default: the chat's newest.",
    ),
    chat: str = CHAT,
    key_file: str = KEY,
    node: str = NODE,
) -> None:
    """Mark the chat read up to a message: a signed receipt, so every node counts your unread
    messages the same."""
    chat_id = parse_hex(chat, CHAT_ID_LEN, "--chat")
    key = load_key(key_file)
    with (
        clear_errors(),
        ChatsyncClient(node, key=key.signing_key) as client,
        member_errors(client, chat_id),
    ):
        if msg_id is None:
            newest = client.history(chat_id, limit=1).messages
            if not newest:
                raise fail(f"chat {chat_id.hex()} has no message to read")
            target = newest[0].msg
        else:
            target = held_message(client, chat_id, resolve_msg_id(client, chat_id, msg_id))
        state = client.read_state(key.user_id, chat_id)
        known = state["position"]
        if known is not None and hlc_of(known) >= target.hlc:  # a receipt would change nothing
            console.print(f"already read past it; unread {state['unread']}", soft_wrap=True)
            return
        state = client.mark_read(key.signing_key, target)
    console.print(f"read up to {target.msg_id.hex()}; unread {state['unread']}", soft_wrap=True)


def resolve_msg_id(client: ChatsyncClient, chat_id: bytes, value: str) -> bytes:
    """A message id from its hex, whole or its first digits as the tables show them (at
    least MIN_PREFIX): the one message among the chat's newest RESOLVE_SCAN that starts so."""
    if len(value) == 2 * MSG_ID_LEN:
        return parse_hex(value, MSG_ID_LEN, "id")
    if len(value) < MIN_PREFIX or len(value) > 2 * MSG_ID_LEN or not is_hex(value):
        raise fail(
            f"id must be {2 * MSG_ID_LEN} hex digits, or its first {MIN_PREFIX} or more: {value!r}"
        )
    found: set[bytes] = set()
    cursor = None
    for _ in range(RESOLVE_SCAN // 200):
        page = client.history(chat_id, cursor=cursor, limit=200)
        ids = [m.id for m in page.messages] + [t.msg_id for t in page.tombstones]
        found |= {i for i in ids if i.hex().startswith(value.lower())}
        cursor = page.next_cursor
        if cursor is None:
            break
    if len(found) == 1:
        return found.pop()
    if not found:
        raise fail(
            f"no message whose id starts with {value} among chat {chat_id.hex()}'s newest "
            f"{RESOLVE_SCAN:,} (give the whole id: history --json)"
        )
    raise fail(
        f"{len(found)} messages' ids start with {value}: give more digits "
        "(history --json shows them whole)"
    )


def is_hex(value: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in value)


def held_message(client: ChatsyncClient, chat_id: bytes, msg_id: bytes) -> MsgV1:
    """The message as the node holds it, or a one-line failure."""
    msg = client.message(chat_id, msg_id)
    if msg is None:
        raise fail(
            f"this node holds no message {msg_id.hex()} in chat {chat_id.hex()} "
            "(deleted, or not synced here)"
        )
    return msg


def about(
    client: ChatsyncClient,
    key: UserKey,
    chat_id: bytes,
    target: bytes,
    kind: MessageKind,
    content: Content,
) -> MsgV1:
    msg = MsgV1.create(
        key.signing_key, chat_id, content.hlc, content.payload, kind=kind, ref=target
    )
    post_shown(client, [*content.before, msg])
    return msg


def is_sealed(client: ChatsyncClient, chat_id: bytes, target: bytes) -> bool:
    """Whether the message an edit replaces was sealed (a DM's always is)."""
    msg = held_message(client, chat_id, target)
    return is_group_sealed(msg.payload) or isinstance(client.chat_proof(chat_id), DmProof)


def register(app: typer.Typer) -> None:
    app.command("edit")(edit)
    app.command("delete")(delete)
    app.command("react")(react)
    app.command("read")(read)
