"""What a posting command sends and what becomes of it: the text (an argument, stdin or a
file; UTF-8, not blank) and the node's answer to the post (shown, held or refused), each
said in one line."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import typer

from client.http import ChatsyncClient, ChatsyncClientError
from client.shell import fail
from store.ops import Op
from store.records import MsgV1

HELD_EXIT = 3  # a post the node took but holds: not an error of the request, not shown either
READ_CAP = 16 * 1024 * 1024  # stdin or --file read at most: far over any node's payload limit

TEXT_HELP = "The text; - (or none, with stdin not a terminal): read it from stdin."
FILE_OPTION = typer.Option(None, "--file", help="Read the text from this file (UTF-8).")


def message_text(text: str | None, file: str | None) -> bytes:
    """What to post: the argument, stdin (``-``, or no argument and stdin not a terminal) or
    ``--file``; UTF-8 and not blank, else one line.

    The node cannot refuse an empty message: a payload is opaque to it (a DM's is sealed), so
    this rule is the client's, like the text's encoding."""
    if file is not None and text is not None:
        raise fail("give the text or --file PATH, not both")
    if file is not None:
        source = file
        try:
            with open(file, "rb") as f:
                data = f.read(READ_CAP + 1)
        except OSError as exc:
            raise fail(f"cannot read --file {file}: {exc.strerror or exc}") from None
    elif text == "-" or (text is None and not sys.stdin.isatty()):
        source, data = "stdin", sys.stdin.buffer.read(READ_CAP + 1)
    elif text is None:
        raise fail("no text: give it as an argument, - to read stdin, or --file PATH")
    else:
        source, data = "the text", text.encode()
    if len(data) > READ_CAP:
        raise fail(f"{source} is over {READ_CAP:,} bytes, far over a message's limit")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise fail(f"{source} is not UTF-8 text (byte {exc.start}): messages are text") from None
    if not data.strip():
        raise fail(f"{source} is empty (or only white space): nothing to send")
    return data


def post_shown(client: ChatsyncClient, ops: list[Op]) -> None:
    """Post ``ops``; one line and a non-zero exit unless every message in them is shown: the
    node refused one (403 ``not_a_member``: its sender was removed before its stamp; exit 1)
    or holds one (202 ``waiting``: it knows no add of the sender stamped before it; exit 3),
    saying whether the node knows the chat at all."""
    try:
        posted = client.post(ops)
    except ChatsyncClientError as exc:
        if exc.code == "not_a_member":
            raise fail(f"refused: {exc}") from None
        raise
    held = [op.chat_id for op, waiting in zip(ops, posted.waiting, strict=True)
            if waiting and isinstance(op, MsgV1)]  # fmt: skip
    if not held:
        return
    chat = held[0]
    if client.chat_proof(chat) is None:
        why = (
            f"this node knows no chat {chat.hex()} "
            "(no member op of it: a wrong id, or not synced here yet)"
        )
    else:
        why = (
            f"this node knows no add of you to chat {chat.hex()} stamped before it "
            "(not a member, or your add has not reached this node)"
        )
    raise fail(
        f"held, not shown: {why}; the node keeps it and shows it once such an add arrives",
        code=HELD_EXIT,
    )


@contextmanager
def member_errors(client: ChatsyncClient, chat_id: bytes) -> Iterator[None]:
    """A read of the chat refused as ``not_a_member`` said as what it means here: the node
    knows no such chat, or you are not a member of it (so its messages are not yours to
    edit, delete, react to or mark read)."""
    try:
        yield
    except ChatsyncClientError as exc:
        if exc.code != "not_a_member":
            raise
        if client.chat_proof(chat_id) is None:
            raise fail(
                f"this node knows no chat {chat_id.hex()} (a wrong id, or not synced here yet)"
            ) from None
        raise fail(
            f"refused: you are not a member of chat {chat_id.hex()} on this node ({exc})"
        ) from None
