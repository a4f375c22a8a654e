"""The client library, DM encryption and the user commands against a real node (no mocks).

Each test starts a ``Node`` (RocksDB in tmp_path, libp2p on 127.0.0.1, hypercorn on a
free port) inside the test's trio run. The synchronous client and the commands run in a
worker thread so the node keeps serving meanwhile.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import trio
from typer.testing import CliRunner

from cli.main import build_app
from client.e2e import UserKey, decode_envelope, open_dm, read_key_file, seal_dm, write_key_file
from client.http import ChatsyncClient, ChatsyncClientError
from store.authz import DmProof, new_group
from store.records import dm_chat_id
from tests.node.node_support import free_port, running_node

ALICE = UserKey.from_seed(b"\x01" * 32)
BOB = UserKey.from_seed(b"\x02" * 32)
CAROL = UserKey.from_seed(b"\x03" * 32)
GROUP = new_group(ALICE.signing_key, b"api-tests-group!").chat_id()  # Alice created it


def url_of(http: httpx.AsyncClient) -> str:
    return str(http.base_url).rstrip("/")


async def test_dm_is_encrypted_end_to_end_through_the_node(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (_, http):
        url = url_of(http)

        def converse() -> tuple[bytes, list[bytes], list[Any], dict[str, Any]]:
            with (
                ChatsyncClient(url, key=ALICE.signing_key) as client,
                ChatsyncClient(url, key=BOB.signing_key) as bob,
            ):
                assert client.get_identity(BOB.user_id) is None
                client.put_identity(BOB.identity(client.now()))
                client.put_identity(ALICE.identity(client.now()))
                bob_box = client.identity_doc(BOB.user_id)
                assert bob_box is not None and bob_box.box_key == BOB.box_key
                chat = dm_chat_id(ALICE.user_id, BOB.user_id)
                joins = [
                    client.membership_op(
                        ALICE.signing_key,
                        chat,
                        u.user_id,
                        proof=DmProof(ALICE.user_id, BOB.user_id),
                    )
                    for u in (ALICE, BOB)
                ]
                sent = client.send_message(
                    ALICE.signing_key,
                    chat,
                    seal_dm(ALICE, bob_box.box_key, b"hi bob"),
                    extra_ops=joins,
                )
                # first contact: the members came with the message, so Bob's list has the chat
                [entry] = bob.chats(BOB.user_id)["chats"]
                assert (entry["kind"], entry["unread"], entry["last_sender"]) == (
                    "dm", 1, ALICE.user_id.hex(),
                )  # fmt: skip
                alice_box = client.identity_doc(ALICE.user_id)
                assert alice_box is not None
                client.send_message(
                    BOB.signing_key, chat, seal_dm(BOB, alice_box.box_key, b"hi alice")
                )
                page = client.history(chat, direction="forward")
                assert page.messages[0].msg == sent
                payloads = [m.msg.payload for m in page.messages]
                return chat, payloads, client.members(chat), bob.chats(BOB.user_id)

        _, payloads, members, bob_chats = await trio.to_thread.run_sync(converse)
        assert b"hi bob" not in payloads[0] and b"hi alice" not in payloads[1]  # stored sealed
        decode_envelope(payloads[0])
        # both parties read both messages; a third party cannot
        assert open_dm(BOB, payloads[0], ALICE.box_key) == b"hi bob"
        assert open_dm(ALICE, payloads[0], ALICE.box_key) == b"hi bob"
        assert open_dm(ALICE, payloads[1], BOB.box_key) == b"hi alice"
        assert sorted(members) == sorted([ALICE.user_id, BOB.user_id])
        assert bob_chats["chats"][0]["kind"] == "dm"
        assert bob_chats["chats"][0]["unread"] == 1  # Alice's: his own is never unread
        try:
            open_dm(CAROL, payloads[0], ALICE.box_key)
        except Exception as exc:
            assert "not addressed" in str(exc)
        else:
            raise AssertionError("a third party opened the DM")


# --- the user commands ----------------------------------------------------------------------


def run_cli(*args: str) -> Any:
    result = CliRunner().invoke(build_app(), list(args))
    return result


async def test_cli_keygen_send_dm_history_status(tmp_path: Path) -> None:
    alice_file, bob_file = tmp_path / "alice.key", tmp_path / "bob.key"
    carol_file, bob_key = tmp_path / "carol.key", str(tmp_path / "bob.key")
    async with running_node(tmp_path) as (_, http):
        url = url_of(http)

        def session() -> None:
            r = run_cli("keygen", "--out", str(alice_file))
            assert r.exit_code == 0, r.output
            alice = read_key_file(alice_file)
            assert alice.user_id.hex() in r.output
            assert os.stat(alice_file).st_mode & 0o777 == 0o600
            r = run_cli("keygen", "--out", str(alice_file))
            assert r.exit_code == 1 and "--force" in r.output
            assert read_key_file(alice_file) == alice  # not overwritten
            assert run_cli("keygen", "--out", str(bob_file)).exit_code == 0
            bob = read_key_file(bob_file)
            to = bob.user_id.hex()
            # Bob has not published yet: Alice cannot encrypt to him
            r = run_cli("send", "--key", str(alice_file), "--node", url, "--to", to, "hello bob")
            assert r.exit_code == 1 and "has not published" in r.output
            r = run_cli("publish", "--key", str(bob_file), "--node", url)
            assert r.exit_code == 0, r.output
            for text in ("hello bob", "second"):
                r = run_cli("send", "--key", str(alice_file), "--node", url, "--to", to, text)
                assert r.exit_code == 0, r.output
            chat = dm_chat_id(alice.user_id, bob.user_id).hex()
            with ChatsyncClient(url, key=bob.signing_key) as client:
                stored = [m.msg.payload for m in client.history(bytes.fromhex(chat)).messages]
                assert len(stored) == 2 and all(b"hello bob" not in p for p in stored)
                assert len(client.members(bytes.fromhex(chat))) == 2
                [entry] = client.chats(bob.user_id)["chats"]  # first contact: in Bob's list
                assert (entry["chat_id"], entry["kind"], entry["unread"]) == (chat, "dm", 2)
            r = run_cli("history", "--node", url, "--chat", chat, "--key", str(bob_file))
            assert r.exit_code == 0 and "hello bob" in r.output and "second" in r.output, r.output
            r = run_cli("history", "--node", url, "--chat", chat, "--key", str(alice_file))
            assert r.exit_code == 0 and "hello bob" in r.output and "me" in r.output
            # a third user may not read their DM at all
            assert run_cli("keygen", "--out", str(carol_file)).exit_code == 0
            r = run_cli("history", "--node", url, "--chat", chat, "--key", str(carol_file))
            assert r.exit_code == 1 and "not_a_member" in r.output and "hello" not in r.output
            r = run_cli("history", "--node", url, "--chat", chat, "--limit", "1", "--key", bob_key)
            assert "--cursor" in r.output
            # a group message with --chat is sealed for its members: none known here, none sent
            group = GROUP.hex()
            r = run_cli("send", "--key", str(bob_file), "--node", url, "--chat", group, "hi all")
            assert r.exit_code == 1 and "no members to encrypt to" in r.output, r.output
            # --plain: the text as is, held while Bob is no member of Alice's group
            plain = ("--chat", group, "--plain", "hi all")
            r = run_cli("send", "--key", str(bob_file), "--node", url, *plain)
            assert r.exit_code == 3 and "held, not shown" in r.output, r.output
            r = run_cli("history", "--node", url, "--chat", group, "--key", bob_key)
            assert r.exit_code == 1 and "not_a_member" in r.output  # held: he is none
            # ... and shown in a group of his own
            r = run_cli("group", "create", "--key", str(bob_file), "--node", url)
            assert r.exit_code == 0, r.output
            own = r.output.split()[-1]
            r = run_cli("send", "--key", str(bob_file), "--node", url, "--chat", own, "hi all")
            assert r.exit_code == 0 and "held" not in r.output, r.output
            r = run_cli(
                "history", "--node", url, "--chat", own, "--direction", "forward", "--key", bob_key
            )
            assert "hi all" in r.output
            r = run_cli("status", "--node", url)
            assert r.exit_code == 0 and "messages" in r.output and "no sync yet" in r.output
            # errors: one line, exit 1, no traceback
            r = run_cli("history", "--node", url, "--chat", "abc", "--key", bob_key)
            assert r.exit_code == 1 and "error" in r.output
            r = run_cli(
                "send", "--key", str(alice_file), "--node", url, "--chat", group, "--plain",
                "x" * 300_000,
            )  # fmt: skip
            assert r.exit_code == 1 and "over the limit" in r.output and "Traceback" not in r.output
            r = run_cli("status", "--node", f"http://127.0.0.1:{free_port()}")
            assert r.exit_code == 1 and "unreachable" in r.output
            assert r.exception is None or isinstance(r.exception, SystemExit)
            r = run_cli(
                "send", "--key", str(tmp_path / "missing.key"), "--node", url, "--chat", group, "x"
            )
            assert r.exit_code == 1 and "chatsync keygen" in r.output

        await trio.to_thread.run_sync(session)


async def test_client_raises_the_servers_code(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (_, http):
        url = url_of(http)

        def check() -> None:
            with ChatsyncClient(url, key=ALICE.signing_key) as client:
                for call, expected in (
                    (lambda: client.chats(ALICE.user_id, limit=0), (400, "bad_limit")),
                    (lambda: client.history(GROUP), (403, "not_a_member")),
                ):
                    try:
                        call()
                    except ChatsyncClientError as exc:
                        assert (exc.status, exc.code) == expected
                    else:
                        raise AssertionError("no error")
                assert client.health() == {"status": "ok"}
                assert "chatsync_records" in client.metrics()
                state = client.read_state(ALICE.user_id, GROUP)
                assert (state["position"], state["unread"]) == (None, 0)  # nothing read yet

        await trio.to_thread.run_sync(check)


def test_key_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "k"
    write_key_file(path, ALICE)
    assert read_key_file(path) == ALICE
    assert json.loads(path.read_text())["user_id"] == ALICE.user_id.hex()
    path.write_text("{}")
    try:
        read_key_file(path)
    except ValueError as exc:
        assert "not a chatsync key file" in str(exc)
    else:
        raise AssertionError("accepted an empty key file")
    assert dm_chat_id(ALICE.user_id, BOB.user_id) == dm_chat_id(BOB.user_id, ALICE.user_id)
    assert dm_chat_id(ALICE.user_id, BOB.user_id) != dm_chat_id(ALICE.user_id, CAROL.user_id)
