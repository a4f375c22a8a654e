"""``chatsync watch``: what is new for you, printed as it happens (client/stream.py).

One line per event: the time, the chat, who, and what — a message's text (a DM decrypted
with your key), an edit, a reaction, a delete, a read receipt, a member change. The
connection's state goes to stderr. It keeps going across node restarts and network cuts
(reconnecting with backoff, resuming where it was) until interrupted.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable

import trio
import typer

from client.commands import (
    DEFAULT_KEY_FILE,
    DEFAULT_NODE,
    clear_errors,
    format_ms,
    load_key,
    payload_renderer,
    who,
)
from client.e2e import UserKey
from client.http import ChatsyncClient, Event, Message
from client.stream import watch_events
from store.kinds import decode_reaction
from store.records import MessageKind


def watch(
    key_file: str = typer.Option(DEFAULT_KEY_FILE, "--key", help="Your key file."),
    node: str = typer.Option(DEFAULT_NODE, "--node", help="Node HTTP URL."),
    since: str = typer.Option(None, "--since", help="Go on after this token (a line's last)."),
    device: str = typer.Option("watch", "--device", help="This client's name (delivery)."),
) -> None:
    """Print your new messages, edits, reactions, deletes and member changes live."""
    key = load_key(key_file)
    with (
        clear_errors(),
        ChatsyncClient(node, key=key.signing_key, device=device) as client,
        contextlib.suppress(KeyboardInterrupt),  # Ctrl-C ends it
    ):
        trio.run(_watch, client, key, since)


async def _watch(client: ChatsyncClient, key: UserKey, since: str | None) -> None:
    render = payload_renderer(client, key)
    state = lambda text: print(f"[{text}]", file=sys.stderr, flush=True)  # noqa: E731
    async for event in watch_events(client, key.user_id, since, on_state=state):
        line = await trio.to_thread.run_sync(describe, event, key, render)
        if line is not None:
            print(f"{line}  {event.position}", flush=True)


def describe(event: Event, key: UserKey, render: Callable[[Message], str]) -> str | None:
    """One line for an event (None: nothing to show)."""
    chat = event.chat_id.hex()[:12]
    if event.member_op is not None:
        op = event.member_op
        action = op.action.name.lower()
        when = format_ms(op.hlc.physical_ms)
        return f"{when}  {chat}  {who(op.actor, key)}: {action} {who(op.user_id, key)}"
    if event.msg is None:
        return f"{'-':23}  {chat}  message {(event.msg_id or b'').hex()[:12]} hidden"
    msg = event.msg
    when, sender = format_ms(msg.hlc.physical_ms), who(msg.sender, key)
    ref = (msg.ref or b"").hex()[:12]
    if msg.kind is MessageKind.DELETE:
        return f"{when}  {chat}  {sender} deleted {ref}"
    if msg.kind is MessageKind.REACTION:
        reacts, reaction = decode_reaction(msg.payload)
        verb = "reacted" if reacts else "took back"
        return f"{when}  {chat}  {sender} {verb} {reaction.decode(errors='replace')} on {ref}"
    if msg.kind is MessageKind.READ_RECEIPT:
        return f"{when}  {chat}  {sender} read up to {ref}"
    text = render(Message(msg, 0))
    if msg.kind is MessageKind.EDIT:
        return f"{when}  {chat}  {sender} edited {ref}: {text}"
    if msg.kind is MessageKind.REPLY:
        return f"{when}  {chat}  {sender} replied to {ref}: {text}"
    return f"{when}  {chat}  {sender}: {text}"


def register(app: typer.Typer) -> None:
    app.command("watch")(watch)
