"""``chatsync group ...`` and the client's ``chat_proof`` against a real node (no mocks).

As in test_client.py: a ``Node`` in the test's trio run, the synchronous client and the
commands in a worker thread so the node keeps serving meanwhile.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio
from typer.testing import CliRunner, Result

from cli.main import build_app
from client.e2e import UserKey, write_key_file
from client.http import ChatsyncClient, proof_from_json
from store.authz import DmProof, new_group
from store.errors import InvalidInput
from store.records import Role, dm_chat_id
from tests.node.node_support import free_port, running_node

ALICE = UserKey.from_seed(b"\x01" * 32)  # creates the group
BOB = UserKey.from_seed(b"\x02" * 32)
CAROL = UserKey.from_seed(b"\x03" * 32)  # made an admin
DAVE = UserKey.from_seed(b"\x04" * 32)


def run_cli(*args: str) -> Result:
    result = CliRunner().invoke(build_app(), list(args))
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def ok(*args: str) -> str:
    result = run_cli(*args)
    assert result.exit_code == 0, result.output
    return result.output


def refused(*args: str) -> str:
    """One red line, exit status 1."""
    result = run_cli(*args)
    assert result.exit_code == 1, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    return result.output


def member_rows(output: str) -> dict[str, str]:
    """user hex -> role column of a ``group members`` table."""
    return {m[1]: m[2].strip() for m in re.finditer(r"│ ([0-9a-f]{40}) │ ([^│]+)│", output)}


async def test_create_add_remove_leave_and_admins_from_the_command_line(tmp_path: Path) -> None:
    keys = {}
    for name, key in (("alice", ALICE), ("bob", BOB), ("carol", CAROL), ("dave", DAVE)):
        keys[name] = str(tmp_path / f"{name}.key")
        write_key_file(Path(keys[name]), key)
    alice, bob, carol, dave = (u.user_id.hex() for u in (ALICE, BOB, CAROL, DAVE))
    async with running_node(tmp_path) as (_, http):
        url = str(http.base_url).rstrip("/")

        def as_(who: str, *args: str) -> tuple[str, ...]:
            return ("group", args[0], *args[1:], "--key", keys[who], "--node", url)

        def session() -> None:
            out = ok(*as_("alice", "create", "--name", "the team"))
            [chat] = re.findall(r"created group ([0-9a-f]{64})", out)
            rows = member_rows(ok(*as_("alice", "members", chat)))
            assert rows == {alice: "creator (me)"}
            out = ok("history", "--node", url, "--chat", chat, "--key", keys["alice"])
            assert "the team" in out  # the name

            ok(*as_("alice", "add", chat, bob))
            rows = member_rows(ok(*as_("bob", "members", chat)))
            assert rows == {alice: "creator", bob: "participant (me)"}
            # Bob is no admin: the node refuses, and the CLI shows its code
            out = refused(*as_("bob", "add", chat, carol))
            assert "not allowed: unauthorized:" in out and "HTTP 422" in out

            # Alice makes Carol an admin: the grant is printed, and the same by `group grant`
            out = ok(*as_("alice", "add", chat, carol, "--admin"))
            [grant] = re.findall(r"\b[0-9a-f]{128}\b", out)
            assert re.findall(r"\b[0-9a-f]{128}\b", ok(*as_("alice", "grant", chat, carol))) == [
                grant
            ]
            assert "only the group's creator" in refused(*as_("bob", "grant", chat, carol))
            # with her grant Carol adds a participant and removes Bob ...
            ok(*as_("carol", "add", chat, dave, "--grant", grant))
            ok(*as_("carol", "remove", chat, bob, "--grant", grant))
            # ... but not without it, not the creator, not another admin, and not with Bob's key
            assert "unauthorized" in refused(*as_("carol", "add", chat, bob))
            assert "unauthorized" in refused(*as_("carol", "remove", chat, alice, "--grant", grant))
            out = refused(*as_("carol", "add", chat, bob, "--admin", "--grant", grant))
            assert "unauthorized" in out
            assert "unauthorized" in refused(*as_("bob", "add", chat, bob, "--grant", grant))
            assert "--grant" in refused(*as_("carol", "add", chat, bob, "--grant", "abcd"))

            ok(*as_("dave", "leave", chat))
            rows = member_rows(ok(*as_("carol", "members", chat)))
            assert rows == {alice: "creator", carol: "admin (me)"}
            ok(*as_("alice", "remove", chat, carol))  # the creator removes an admin
            ok(*as_("alice", "leave", chat))
            assert "not_a_member" in refused(*as_("alice", "members", chat))  # she left

        await trio.to_thread.run_sync(session)


async def test_group_commands_say_what_went_wrong(tmp_path: Path) -> None:
    key_file = str(tmp_path / "bob.key")
    write_key_file(Path(key_file), BOB)
    async with running_node(tmp_path) as (_, http):
        url = str(http.base_url).rstrip("/")
        dm = DmProof(ALICE.user_id, BOB.user_id)

        def session() -> None:
            with ChatsyncClient(url) as client:
                client.post_ops(
                    [client.membership_op(BOB.signing_key, dm.chat_id(), BOB.user_id, proof=dm)]
                )
            node = ("--key", key_file, "--node", url)
            unknown = "77" * 32
            out = refused("group", "add", unknown, ALICE.user_id.hex(), *node)
            assert f"unknown chat {unknown}" in out
            assert "unknown chat" in refused("group", "members", unknown, *node)
            out = refused("group", "add", dm.chat_id().hex(), CAROL.user_id.hex(), *node)
            assert "is a DM, not a group" in out
            # members works for a DM too
            assert BOB.user_id.hex() in ok("group", "members", dm.chat_id().hex(), *node)
            assert "CHAT must be 64 hex digits" in refused("group", "leave", "abcd", *node)
            assert "USER is not hex" in refused("group", "remove", unknown, "zz" * 20, *node)
            out = refused("group", "leave", unknown, "--key", key_file, "--node", f"http://127.0.0.1:{free_port()}")  # fmt: skip
            assert "unreachable: cannot reach the node" in out
            out = refused("group", "create", "--key", str(tmp_path / "none.key"), "--node", url)
            assert "chatsync keygen" in out

        await trio.to_thread.run_sync(session)


async def test_client_chat_proof_group_dm_unknown(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (_, http):
        url = str(http.base_url).rstrip("/")
        group = new_group(ALICE.signing_key, b"client-proof-gr!")
        dm = DmProof(BOB.user_id, ALICE.user_id)

        def check() -> None:
            with ChatsyncClient(url, key=BOB.signing_key) as client:  # Bob reads the members
                assert client.chat_proof(group.chat_id()) is None
                client.post_ops(
                    [
                        client.membership_op(
                            ALICE.signing_key, group.chat_id(), BOB.user_id, proof=group
                        ),
                        client.membership_op(
                            ALICE.signing_key, dm.chat_id(), BOB.user_id, proof=dm
                        ),
                    ]
                )
                assert client.chat_proof(group.chat_id()) == group
                assert client.chat_proof(dm.chat_id()) == dm
                assert client.chat_proof(dm_chat_id(ALICE.user_id, CAROL.user_id)) is None
                [bob] = client.member_list(group.chat_id())
                assert (bob.user_id, bob.role) == (BOB.user_id, Role.PARTICIPANT)

        await trio.to_thread.run_sync(check)


def test_the_client_checks_that_the_proof_derives_the_chat_id() -> None:
    group = new_group(ALICE.signing_key, b"n" * 16)
    as_json = {
        "kind": "group", "creator_key": group.creator_key.hex(), "nonce": group.nonce.hex(),
    }  # fmt: skip
    assert proof_from_json(group.chat_id(), as_json) == group
    with pytest.raises(InvalidInput, match="does not derive"):
        proof_from_json(bytes(32), as_json)  # a node claiming Alice controls another chat
    with pytest.raises(InvalidInput, match="malformed"):
        proof_from_json(group.chat_id(), {**as_json, "nonce": "abc"})
    with pytest.raises(InvalidInput, match="malformed"):
        proof_from_json(bytes(32), {"kind": "dm", "users": [ALICE.user_id.hex()]})
