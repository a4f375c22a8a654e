"""The user commands' edges (issue 37) against a real node, as test_groups.py runs them:
message ids on screen and whole with ``--json``, another user's message named by its short
id, text from stdin or ``--file``, long texts cut on screen, a held or refused post, empty
content, re-adding a member, key files others can read, ``--version``."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio
import trio_websocket
from typer.testing import CliRunner, Result

from cli.main import build_app
from client.display import PREVIEW_CHARS
from client.e2e import write_key_file
from client.http import ChatsyncClient
from client.stream import failure_reason
from store.records import MsgV1
from tests.client.test_groups import ALICE, BOB, CAROL, ok, refused, run_cli
from tests.node.node_support import free_port, running_node

KEYS = {"alice": ALICE, "bob": BOB, "carol": CAROL}  # Carol is never added


def write_keys(tmp_path: Path) -> dict[str, str]:
    files = {name: str(tmp_path / f"{name}.key") for name in KEYS}
    for name, key in KEYS.items():
        write_key_file(Path(files[name]), key)
    return files


def with_input(data: bytes, *args: str) -> Result:
    result = CliRunner().invoke(build_app(), list(args), input=data)
    assert "Traceback" not in result.output, result.output
    return result


def one_line(result: Result, code: int) -> str:
    """One red line and exit status ``code``."""
    assert result.exit_code == code, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    return result.output


def as_json(*args: str) -> Any:
    return json.loads(ok(*args, "--json"))


async def test_ids_on_screen_and_whole_in_json_name_another_users_message(tmp_path: Path) -> None:
    keys = write_keys(tmp_path)
    async with running_node(tmp_path) as (_, http):
        url = str(http.base_url).rstrip("/")

        def as_(who: str, *args: str) -> tuple[str, ...]:
            return (*args, "--key", keys[who], "--node", url)

        def session() -> None:
            ok(*as_("bob", "publish"))  # his box key: the group's keys are sealed to it
            out = ok(*as_("alice", "group", "create", "--name", "ids"))
            [chat] = re.findall(r"created group ([0-9a-f]{64})", out)
            ok(*as_("alice", "group", "add", chat, BOB.user_id.hex()))
            out = ok(*as_("alice", "send", "from alice", "--chat", chat))
            [msg] = re.findall(r"sent message ([0-9a-f]{64})", out)
            # Bob sees the id (12 hex digits) on screen, whole in --json
            assert f"│ {msg[:12]} │" in ok(*as_("bob", "history", "--chat", chat))
            page = as_json(*as_("bob", "history", "--chat", chat, "--direction", "forward"))
            assert [m["text"] for m in page["messages"]] == ["ids", "from alice"]
            [mine] = [m for m in page["messages"] if m["id"] == msg]
            assert (mine["sender"], mine["kind"], mine["chat_id"]) == (
                ALICE.user_id.hex(), "new", chat,
            )  # fmt: skip
            # ... and acts on Alice's message by the short id, or the whole one
            ok(*as_("bob", "react", msg[:12], "+1", "--chat", chat))
            assert f"read up to {msg}" in ok(*as_("bob", "read", msg, "--chat", chat))
            out = refused(*as_("bob", "react", "abcdef0123", "+1", "--chat", chat))
            assert "no message whose id starts with abcdef0123" in out
            assert "first 6 or more" in refused(*as_("bob", "react", "ab", "+1", "--chat", chat))
            assert "first 6 or more" in refused(*as_("bob", "delete", "zz" * 8, "--chat", chat))
            [mine] = [m for m in as_json(*as_("alice", "history", "--chat", chat))["messages"]
                      if m["id"] == msg]  # fmt: skip
            assert mine["reactions"] == {"+1": [BOB.user_id.hex()]}
            # chats: the newest message's id, short and whole
            [entry] = as_json(*as_("bob", "chats"))["chats"]
            assert (entry["chat_id"], entry["last_msg_id"], entry["unread"]) == (chat, msg, 0)
            assert msg[:12] in ok(*as_("bob", "chats"))
            members = as_json(*as_("bob", "group", "members", chat))["members"]
            assert {(m["user_id"], m["role"], m["creator"], m["me"]) for m in members} == {
                (ALICE.user_id.hex(), "admin", True, False),
                (BOB.user_id.hex(), "participant", False, True),
            }
            status = as_json("status", "--node", url)
            assert status["domains"]["messages"]["count"] >= 3
            # watch --json: one object per line, ids whole (a process, as a person runs it)
            watch = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "watch", "--json", *as_("bob")[0:]],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )  # fmt: skip
            try:
                assert watch.stdout is not None
                events = [json.loads(watch.stdout.readline()) for _ in range(5)]
            finally:
                watch.terminate()
                watch.wait(timeout=10)
            members_seen = [e["member"]["user_id"] for e in events if "member" in e]
            assert members_seen == [ALICE.user_id.hex(), BOB.user_id.hex()]
            texts = {e["message"]["id"]: e["message"]["text"] for e in events if "message" in e}
            assert texts[msg] == "from alice" and all(e["chat_id"] == chat for e in events)

        await trio.to_thread.run_sync(session)


async def test_send_takes_stdin_or_a_file_cuts_long_texts_on_screen_and_refuses_bad_input(
    tmp_path: Path,
) -> None:
    keys = write_keys(tmp_path)
    async with running_node(tmp_path) as (_, http):
        url = str(http.base_url).rstrip("/")

        def as_(who: str, *args: str) -> tuple[str, ...]:
            return (*args, "--key", keys[who], "--node", url)

        def session() -> None:
            out = ok(*as_("alice", "group", "create"))
            [chat] = re.findall(r"created group ([0-9a-f]{64})", out)
            big = ("a long line of text\n" * 10_000).encode()  # 200,000 bytes: over 128 KiB
            result = with_input(big, *as_("alice", "send", "-", "--chat", chat))
            assert result.exit_code == 0, result.output
            big_file = tmp_path / "big.txt"
            big_file.write_bytes(big.replace(b"long", b"file"))
            ok(*as_("alice", "send", "--file", str(big_file), "--chat", chat))
            result = with_input(
                "ünïcode from a pipe\n".encode(), *as_("alice", "send", "--chat", chat)
            )
            assert result.exit_code == 0, result.output  # no text, stdin not a terminal
            page = as_json(*as_("alice", "history", "--chat", chat, "--direction", "forward"))
            texts = [m["text"] for m in page["messages"]]
            assert texts == [big.decode(), big_file.read_text(), "ünïcode from a pipe\n"]
            wide = CliRunner(env={"COLUMNS": "400"})  # a row on one line, to read it
            screen = wide.invoke(build_app(), as_("alice", "history", "--chat", chat)).output
            assert "200,000 bytes in all" in screen and "…" in screen
            assert screen.count("a long line of text") < PREVIEW_CHARS // 10
            # bad input: one line each, nothing posted
            for args, stdin, says in (
                (("--file", str(tmp_path / "missing.txt")), b"", "cannot read --file"),
                (("--file", str(tmp_path)), b"", "Is a directory"),
                (("-",), b"\xff\xfe\x00binary", "stdin is not UTF-8 text"),
                (("",), b"", "the text is empty"),
                (("  \n\t",), b"", "the text is empty"),
                (("-",), b"", "stdin is empty"),
                (("x", "--file", str(big_file)), b"", "not both"),
            ):
                out = one_line(with_input(stdin, *as_("alice", "send", *args, "--chat", chat)), 1)
                assert says in out, out
            (tmp_path / "huge.txt").write_bytes(b"x" * (256 * 1024 + 1))
            out = refused(
                *as_("alice", "send", "--file", str(tmp_path / "huge.txt"), "--chat", chat)
            )
            assert "over the limit of 262144" in out
            msg = page["messages"][-1]["id"]
            assert "is empty" in refused(*as_("alice", "edit", msg, "", "--chat", chat))
            assert len(as_json(*as_("alice", "history", "--chat", chat))["messages"]) == 3
            # the node takes an empty payload: it cannot read content (a DM's is sealed), so
            # the rule is the client's
            with ChatsyncClient(url) as client:
                empty = MsgV1.create(ALICE.signing_key, bytes.fromhex(chat), client.now(), b"")
                assert client.post([empty]).new == [True]

        await trio.to_thread.run_sync(session)


async def test_a_held_or_refused_post_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    keys = write_keys(tmp_path)
    async with running_node(tmp_path) as (_, http):
        url = str(http.base_url).rstrip("/")

        def as_(who: str, *args: str) -> tuple[str, ...]:
            return (*args, "--key", keys[who], "--node", url)

        def session() -> None:
            out = ok(*as_("alice", "group", "create"))
            [chat] = re.findall(r"created group ([0-9a-f]{64})", out)
            bob = BOB.user_id.hex()
            ok(*as_("alice", "group", "add", chat, bob))
            out = ok(*as_("alice", "send", "hello", "--chat", chat))
            [msg] = re.findall(r"sent message ([0-9a-f]{64})", out)
            unknown = "77" * 32
            # sealed by default: no members known, nothing to encrypt to, nothing sent
            out = one_line(run_cli(*as_("alice", "send", "hi", "--chat", unknown)), 1)
            assert f"this node knows no chat {unknown}" in out and "encrypt" in out
            out = one_line(run_cli(*as_("carol", "send", "let me in", "--chat", chat)), 1)
            assert f"refused: you are not a member of chat {chat} on this node" in out
            out = one_line(run_cli(*as_("carol", "react", msg, "+1", "--chat", chat)), 1)
            assert f"refused: you are not a member of chat {chat} on this node" in out
            # --plain: posted as is, and held where the node knows no chat or no add of you
            plain = ("--plain", "--chat")
            out = one_line(run_cli(*as_("alice", "send", "hi", *plain, unknown)), 3)
            assert f"held, not shown: this node knows no chat {unknown}" in out
            out = one_line(run_cli(*as_("carol", "send", "let me in", *plain, chat)), 3)
            assert f"held, not shown: this node knows no add of you to chat {chat}" in out
            assert "not allowed" in refused(*as_("carol", "group", "add", chat, bob))
            for command in (("delete", msg), ("read", msg), ("react", msg[:8], "+1")):
                out = refused(*as_("carol", *command, "--chat", chat))
                assert f"refused: you are not a member of chat {chat} on this node" in out
                out = refused(*as_("alice", *command, "--chat", unknown))
                assert f"this node knows no chat {unknown}" in out
            assert "not_author" in refused(*as_("bob", "edit", msg, "mine", "--chat", chat))
            out = refused(*as_("carol", "edit", msg, "mine", "--chat", chat))
            assert f"refused: you are not a member of chat {chat} on this node" in out
            # re-adding: said, exit 0, nothing posted
            before = as_json(*as_("alice", "group", "members", chat))
            out = ok(*as_("alice", "group", "add", chat, bob))
            assert out == f"{bob} is already a participant of group {chat}: nothing to do\n"
            assert as_json(*as_("alice", "group", "members", chat)) == before
            # a removed member's post: refused
            ok(*as_("alice", "group", "remove", chat, bob))
            out = one_line(run_cli(*as_("bob", "send", "still here?", "--chat", chat)), 1)
            assert f"refused: you are not a member of chat {chat} on this node" in out
            texts = [
                m["text"] for m in as_json(*as_("alice", "history", "--chat", chat))["messages"]
            ]
            assert texts == ["hello"]

        await trio.to_thread.run_sync(session)


def test_key_files_others_can_read_directories_and_missing_ones_are_one_line(
    tmp_path: Path,
) -> None:
    key = tmp_path / "alice.key"
    ok("keygen", "--out", str(key))
    assert os.stat(key).st_mode & 0o777 == 0o600
    args = ("publish", "--node", "http://127.0.0.1:1")
    os.chmod(key, 0o644)
    out = refused(*args, "--key", str(key))
    assert f"permissions 0644 for '{key}' are too open" in out and "chmod 600" in out
    os.chmod(key, 0o640)
    assert "permissions 0640" in refused(*args, "--key", str(key))
    os.chmod(key, 0o600)
    assert "unreachable" in refused(*args, "--key", str(key))  # the key was fine
    out = refused(*args, "--key", str(tmp_path))
    assert out == f"error: {tmp_path} is not a key file but a directory\n"
    assert "chatsync keygen --out" in refused(*args, "--key", str(tmp_path / "none.key"))


def test_version_comes_from_the_package_metadata() -> None:
    version = importlib.metadata.version("chatsync")
    assert ok("--version") == f"chatsync {version}\n"


def test_watch_against_a_dead_node_says_why_and_gives_up(tmp_path: Path) -> None:
    key = tmp_path / "alice.key"
    write_key_file(key, ALICE)
    url = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "watch", "--key", str(key), "--node", url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done
    assert done.stdout.startswith("error: ") and done.stdout.count("\n") == 1, done.stdout
    assert f"cannot reach the node at {url}" in done.stdout and "gave up after 5" in done.stdout
    retries = done.stderr.splitlines()
    assert len(retries) == 4 and all("Connection refused" in line for line in retries), retries


def test_a_lost_stream_names_the_node_and_the_cause() -> None:
    # trio_websocket raises HandshakeError (no text) from the OSError that says why
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as exc:
            raise trio_websocket.HandshakeError from exc
    except trio_websocket.HandshakeError as handshake:
        why = failure_reason("http://127.0.0.1:9", handshake)
    assert why == "cannot reach the node at http://127.0.0.1:9: [Errno 111] Connection refused"
    try:  # trio: "all attempts ... failed", from a group of the errnos
        try:
            refused = ConnectionRefusedError(111, "Connect call failed")
            raise OSError("all attempts to connect to h:1 failed") from ExceptionGroup(
                "", [refused]
            )
        except OSError as exc:
            raise trio_websocket.HandshakeError from exc
    except trio_websocket.HandshakeError as handshake:
        why = failure_reason("http://h:1", handshake)
    assert why.endswith("all attempts to connect to h:1 failed ([Errno 111] Connect call failed)")
    timeout = failure_reason("http://h:1", trio_websocket.ConnectionTimeout())
    assert timeout == "cannot reach the node at http://h:1: connection timed out"
