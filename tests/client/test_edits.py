"""``chatsync edit``, ``react``, ``read`` and ``delete`` against a real node (as
test_groups.py): the folded history shows the edit, the reactions and, after the delete, a
tombstone; ``chats`` counts what the reader's receipts leave unread — and the node's refusals
are one line each."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import trio

from client.e2e import write_key_file
from client.http import ChatsyncClient
from tests.client.test_groups import ALICE, BOB, ok, refused
from tests.node.node_support import running_node


def shown_messages(args: tuple[str, ...]) -> list[dict[str, Any]]:
    """The messages of ``history ... --json``."""
    messages: list[dict[str, Any]] = json.loads(ok(*args, "--json"))["messages"]
    return messages


async def test_edit_react_retract_and_delete_from_the_command_line(tmp_path: Path) -> None:
    keys = {}
    for name, key in (("alice", ALICE), ("bob", BOB)):
        keys[name] = str(tmp_path / f"{name}.key")
        write_key_file(Path(keys[name]), key)
    async with running_node(tmp_path) as (_, http):
        url = str(http.base_url).rstrip("/")

        def as_(who: str, *args: str) -> tuple[str, ...]:
            return (*args, "--key", keys[who], "--node", url)

        def session() -> None:
            ok(*as_("bob", "publish"))  # his box key: the group's keys are sealed to it
            out = ok(*as_("alice", "group", "create", "--name", "edits"))
            [chat] = re.findall(r"created group ([0-9a-f]{64})", out)
            ok(*as_("alice", "group", "add", chat, BOB.user_id.hex()))
            out = ok(*as_("alice", "send", "first words", "--chat", chat))
            [msg] = re.findall(r"sent message ([0-9a-f]{64})", out)

            ok(*as_("alice", "edit", msg, "better words", "--chat", chat))
            ok(*as_("bob", "react", msg, "+1", "--chat", chat))
            ok(*as_("alice", "react", msg, "+1", "--chat", chat))
            ok(*as_("alice", "react", msg, "+1", "--retract", "--chat", chat))
            [shown] = [m for m in shown_messages(as_("alice", "history", "--chat", chat))
                       if m["id"] == msg]  # fmt: skip
            assert (shown["text"], shown["edited"]) == ("better words", True)
            assert shown["reactions"] == {"+1": [BOB.user_id.hex()]}
            with ChatsyncClient(
                url, key=ALICE.signing_key
            ) as client:  # it checks the edit's signature
                [item] = [m for m in client.history(bytes.fromhex(chat)).messages
                          if m.id.hex() == msg]  # fmt: skip
                # the node holds them sealed: the edit's text and the reaction are not there
                assert b"better words" not in item.payload and item.edit is not None
                [(reaction, users)] = item.reactions.items()
                assert users == (BOB.user_id,) and b"+1" not in reaction

            def unread(who: str) -> str:
                [row] = [line for line in ok(*as_(who, "chats")).splitlines() if chat[:8] in line]
                return row.split("│")[3].strip()

            assert unread("bob") == "2" and unread("alice") == "0"  # the name, the post: hers
            assert "unread 0" in ok(*as_("bob", "read", "--chat", chat))
            out = ok(*as_("alice", "send", "second", "--chat", chat))
            [second] = re.findall(r"sent message ([0-9a-f]{64})", out)
            assert unread("bob") == "1"
            assert "unread 0" in ok(*as_("bob", "read", second, "--chat", chat))
            assert "already read past it" in ok(*as_("bob", "read", msg, "--chat", chat))
            assert "no message" in refused(*as_("bob", "read", "00" * 32, "--chat", chat))

            assert "not_author" in refused(*as_("bob", "edit", msg, "mine now", "--chat", chat))
            assert "not_allowed" in refused(*as_("bob", "delete", msg, "--chat", chat))
            ok(*as_("alice", "delete", msg, "--chat", chat))
            history = ok(*as_("bob", "history", "--chat", chat))
            assert "better words" not in history and "deleted by me" not in history
            assert "[deleted by" in history
            [gone] = [m for m in shown_messages(as_("bob", "history", "--chat", chat))
                      if m["id"] == msg]  # fmt: skip
            assert (gone["kind"], gone["deleted_by"]) == ("deleted", ALICE.user_id.hex())
            assert "deleted" in refused(*as_("bob", "react", msg, "+1", "--chat", chat))
            assert "holds no message" in refused(*as_("alice", "delete", msg, "--chat", chat))

        await trio.to_thread.run_sync(session)
