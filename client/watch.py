"""``chatsync watch``: what is new for you, printed as it happens (client/stream.py).

One line per event: the time, the chat, who, and what — a message's text (a DM decrypted
with your key), an edit, a reaction, a delete, a read receipt, a member change. The
connection's state goes to stderr, each retry naming the node and why. Once connected it
keeps going across node restarts and network cuts (reconnecting with backoff, resuming where
it was) until interrupted; a node it never reached (a wrong URL, a dead node) it gives up on
after 5 tries (~8 s): one line, exit status 1.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import trio
import typer

from client.commands import Reader, format_ms, who
from client.display import SHORT_ID, dumps, msg_json, preview, short
from client.e2e import UserKey
from client.http import ChatsyncClient, Event, Message
from client.shell import (
    DEFAULT_KEY_FILE,
    DEFAULT_NODE,
    JSON_OPTION,
    clear_errors,
    load_key,
)
from client.stream import watch_events
from store.records import MessageKind


def watch(
    key_file: str = typer.Option(DEFAULT_KEY_FILE, "--key", help="Your key file."),
    node: str = typer.Option(DEFAULT_NODE, "--node", help="Node HTTP URL."),
    since: str = typer.Option(None, "--since", help="Go on after this token (a line's last)."),
    device: str = typer.Option("watch", "--device", help="This client's name (delivery)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Print your new messages, edits, reactions, deletes and member changes live: one line
    each (--json: one JSON object each), the message's id (12 hex digits) after the chat's."""
    key = load_key(key_file)
    with (
        clear_errors(),
        ChatsyncClient(node, key=key.signing_key, device=device) as client,
        contextlib.suppress(KeyboardInterrupt),  # Ctrl-C ends it
    ):
        trio.run(_watch, client, key, since, as_json)


async def _watch(client: ChatsyncClient, key: UserKey, since: str | None, as_json: bool) -> None:
    render = Reader(client, key)
    state = lambda text: print(f"[{text}]", file=sys.stderr, flush=True)  # noqa: E731
    async for event in watch_events(client, key.user_id, since, on_state=state):
        if event.msg is not None and event.msg.kind is MessageKind.KEYS:
            continue  # a group's key grants: nothing for a person to read
        if as_json:
            item = await trio.to_thread.run_sync(event_json, event, render)
            print(dumps(item), flush=True)
            continue
        line = await trio.to_thread.run_sync(describe, event, key, render)
        if line is not None:
            print(f"{line}  {event.position}", flush=True)


def event_json(event: Event, render: Reader) -> dict[str, Any]:
    """An event whole: its position (the token), its chat, and its message or member op."""
    item: dict[str, Any] = {
        "position": event.position, "type": event.type, "chat_id": event.chat_id.hex(),
    }  # fmt: skip
    if event.member_op is not None:
        op = event.member_op
        item["member"] = {
            "action": op.action.name.lower(), "actor": op.actor.hex(), "user_id": op.user_id.hex(),
            "role": op.role.name.lower(), "time_ms": op.hlc.physical_ms,
        }  # fmt: skip
    elif event.msg is not None:
        msg = event.msg
        text = render(Message(msg, 0)) if msg.kind in CONTENT_KINDS else None
        if msg.kind is MessageKind.REACTION:
            reacts, reaction = render.reaction_of(msg)
            item["reaction"] = {"key": reaction, "retract": not reacts}
        item["message"] = msg_json(msg, text)
    else:
        item["id"] = (event.msg_id or b"").hex()  # hidden
    return item


CONTENT_KINDS = (MessageKind.NEW, MessageKind.EDIT, MessageKind.REPLY)


def describe(event: Event, key: UserKey, render: Reader) -> str | None:
    """One line for an event (None: nothing to show)."""
    chat = short(event.chat_id)
    if event.member_op is not None:
        op = event.member_op
        action = op.action.name.lower()
        when, no_id = format_ms(op.hlc.physical_ms), "-".ljust(SHORT_ID)
        return f"{when}  {chat}  {no_id}  {who(op.actor, key)}: {action} {who(op.user_id, key)}"
    if event.msg is None:
        return f"{'-':23}  {chat}  {short(event.msg_id or b'')}  hidden"
    msg = event.msg
    when, sender = format_ms(msg.hlc.physical_ms), who(msg.sender, key)
    chat += "  " + short(msg.msg_id)
    ref = short(msg.ref or b"")
    if msg.kind is MessageKind.DELETE:
        return f"{when}  {chat}  {sender} deleted {ref}"
    if msg.kind is MessageKind.REACTION:
        reacts, reaction = render.reaction_of(msg)
        verb = "reacted" if reacts else "took back"
        return f"{when}  {chat}  {sender} {verb} {reaction} on {ref}"
    if msg.kind is MessageKind.READ_RECEIPT:
        return f"{when}  {chat}  {sender} read up to {ref}"
    text = preview(render(Message(msg, 0)))
    if msg.kind is MessageKind.EDIT:
        return f"{when}  {chat}  {sender} edited {ref}: {text}"
    if msg.kind is MessageKind.REPLY:
        return f"{when}  {chat}  {sender} replied to {ref}: {text}"
    return f"{when}  {chat}  {sender}: {text}"


def register(app: typer.Typer) -> None:
    app.command("watch")(watch)
