"""Export a user's history from one real node, import it into a fresh one (no mocks): the
same history, the same Merkle roots, nothing duplicated by a second import; a tampered,
truncated, incomplete or foreign export is refused with one line and nothing written."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from client.backup import fetch_history, read_containers, submission_order, submit, write_containers
from client.e2e import write_key_file
from client.http import ChatsyncClient, ChatsyncClientError
from dm3.containers import build_containers, open_containers
from store.authz import DmProof, new_group
from store.kinds import Claims, reaction_payload
from store.ops import MembershipAction
from store.records import MessageKind, Role, dm_chat_id
from tests.client.test_groups import ALICE, BOB, CAROL, ok, refused
from tests.node.node_support import running_node

GROUP = new_group(ALICE.signing_key, b"backup-tests-grp")


def url_of(http: Any) -> str:
    return str(http.base_url).rstrip("/")


def make_history(url: str) -> list[bytes]:
    """Alice's DM with Bob and her group with Bob and Carol: messages of every kind, a delete
    by the creator, a removal, receipts. The node holds nothing else but her identity."""
    with ChatsyncClient(url, key=ALICE.signing_key) as alice:
        alice.put_identity(ALICE.identity(alice.now()))
        dm, dm_proof = dm_chat_id(ALICE.user_id, BOB.user_id), DmProof(ALICE.user_id, BOB.user_id)
        joins = [
            alice.membership_op(ALICE.signing_key, dm, u.user_id, proof=dm_proof)
            for u in (ALICE, BOB)
        ]
        hi = alice.send_message(ALICE.signing_key, dm, b"hi bob", extra_ops=joins)
        alice.send_message(BOB.signing_key, dm, b"hi alice")
        alice.mark_read(ALICE.signing_key, hi)
        group = GROUP.chat_id()
        adds = [
            alice.membership_op(ALICE.signing_key, group, u.user_id, role=role, proof=GROUP)
            for u, role in ((ALICE, Role.ADMIN), (BOB, Role.PARTICIPANT), (CAROL, Role.PARTICIPANT))
        ]  # fmt: skip
        first = alice.send_message(ALICE.signing_key, group, b"first", extra_ops=adds)
        bobs = alice.send_message(BOB.signing_key, group, b"from bob")
        for key, payload, kind in (
            (ALICE, b"first, edited", MessageKind.EDIT),
            (BOB, reaction_payload(b"+1"), MessageKind.REACTION),
            (CAROL, b"re", MessageKind.REPLY),
        ):
            alice.send_message(key.signing_key, group, payload, kind=kind, ref=first.msg_id)
        claims = Claims.of(bobs).encode()
        delete = MessageKind.DELETE
        alice.send_message(ALICE.signing_key, group, claims, kind=delete, ref=bobs.msg_id)
        remove = alice.membership_op(
            ALICE.signing_key, group, CAROL.user_id, MembershipAction.REMOVE, proof=GROUP
        )
        alice.post([remove])
    with ChatsyncClient(url, key=BOB.signing_key) as bob:
        bob.mark_read(BOB.signing_key, first)
    return [dm, group]


def snapshot(url: str, chats: list[bytes]) -> dict[str, Any]:
    """What Alice sees of her chats (all but this node's local seq numbers), and the roots."""
    seen: dict[str, Any] = {}
    with ChatsyncClient(url, key=ALICE.signing_key) as alice:
        for chat in chats:
            page = alice.history(chat, direction="forward", limit=200)
            assert page.next_cursor is None
            seen[chat.hex()] = {
                "messages": [(m.msg, m.edit, m.reactions, m.reply_state) for m in page.messages],
                "tombstones": page.tombstones,
                "members": alice.member_list(chat),
                "read": alice.read_state(ALICE.user_id, chat),
            }
        seen["domains"] = alice.status()["domains"]
    return seen


def import_into(url: str, source: Path) -> tuple[int, int]:
    """(ops, new) of an import of ``source`` through the library."""
    opened = open_containers(read_containers(source), ALICE.signing_key)
    with ChatsyncClient(url, key=ALICE.signing_key) as client:
        new = submit(client, submission_order(opened.history), lambda n: None)
    return opened.history.op_count, new


async def test_export_wipe_import_gives_the_same_history_and_roots(tmp_path: Path) -> None:
    out = tmp_path / "export"
    async with running_node(tmp_path / "a") as (_, http):
        url = url_of(http)

        def export() -> tuple[list[bytes], dict[str, Any]]:
            chats = make_history(url)
            with ChatsyncClient(url, key=ALICE.signing_key) as client:
                history = fetch_history(client, ALICE.signing_key, lambda done, total: None)
            files = build_containers(ALICE.signing_key, history, os.urandom)
            write_containers(out, files, lambda: None)
            with ChatsyncClient(url, key=CAROL.signing_key) as carol:  # removed: reads nothing
                with pytest.raises(ChatsyncClientError, match="not_a_member"):
                    carol.member_ops(chats[1])
                with pytest.raises(ChatsyncClientError, match="not_a_member"):
                    carol.deletes(chats[1])
            return chats, snapshot(url, chats)

        chats, before = await trio.to_thread.run_sync(export)
    assert sorted(before["domains"]) == ["deletes", "identity", "index", "members", "messages"]
    assert all(d["count"] > 0 for d in before["domains"].values())
    async with running_node(tmp_path / "b") as (_, http):  # a fresh node: the wipe
        url = url_of(http)

        def restore() -> tuple[dict[str, Any], tuple[int, int], tuple[int, int]]:
            first = import_into(url, out)
            again = import_into(url, out)
            return snapshot(url, chats), first, again

        after, first, again = await trio.to_thread.run_sync(restore)
    # every op once, each new (the index holds the member ops again: counted once)
    total = sum(d["count"] for name, d in before["domains"].items() if name != "index")
    assert first == (total, total)
    assert again == (total, 0)  # the second import adds nothing
    assert after == before  # history, folded views, members, read state, Merkle roots


async def test_the_commands_export_import_and_refuse_a_bad_export(tmp_path: Path) -> None:
    key, bob = str(tmp_path / "alice.key"), str(tmp_path / "bob.key")
    write_key_file(Path(key), ALICE)
    write_key_file(Path(bob), BOB)
    out = tmp_path / "export"
    async with running_node(tmp_path / "a") as (_, http):
        url = url_of(http)

        def export() -> str:
            make_history(url)
            assert "500,000..10,000,000" in refused(
                "export", "--key", key, "--node", url, "--out", str(out), "--max-chunk-bytes", "1"
            )
            return ok("export", "--key", key, "--node", url, "--out", str(out))

        said = await trio.to_thread.run_sync(export)
    assert said.startswith("exported 2 chats, 16 ops in 2 chunks ("), said
    assert "not an empty directory" in refused(
        "export", "--key", key, "--node", url, "--out", str(out)
    )
    async with running_node(tmp_path / "b") as (_, http):
        url = url_of(http)

        def import_(source: Path) -> str:
            return ok("import", "--key", key, "--node", url, "--from", str(source))

        def refusals() -> list[str]:
            said = [
                refused("import", "--key", key, "--node", url, "--from", str(bad))
                for bad in broken_copies(out, tmp_path)
            ]
            said.append(refused("import", "--key", bob, "--node", url, "--from", str(out)))
            with ChatsyncClient(url) as client:  # nothing was written
                assert {d["count"] for d in client.status()["domains"].values()} == {0}
            return said

        said = await trio.to_thread.run_sync(refusals)
        assert "does not open" in said[0] and "truncated" in said[1] and "missing" in said[2]
        assert "a wrong key" in said[3]
        done = await trio.to_thread.run_sync(import_, out)
        assert done.startswith("imported 2 chats, 16 ops (16 new) from 2 chunks"), done
        again = await trio.to_thread.run_sync(import_, out)
        assert again.startswith("imported 2 chats, 16 ops (0 new)"), again


def broken_copies(out: Path, tmp_path: Path) -> list[Path]:
    """Copies of the export: a flipped ciphertext byte, a truncated file, a missing file."""
    copies = []
    for n, damage in enumerate((flip_a_byte, truncate, remove)):
        copy = tmp_path / f"broken{n}"
        copy.mkdir()
        names = sorted(p.name for p in out.iterdir())
        for name in names:
            (copy / name).write_bytes((out / name).read_bytes())
        damage(copy / names[n])
        copies.append(copy)
    return copies


def flip_a_byte(path: Path) -> None:
    sealed = json.loads(path.read_bytes())
    raw = bytearray(base64.b64decode(sealed["ciphertext"]))
    raw[0] ^= 0x80
    sealed["ciphertext"] = base64.b64encode(bytes(raw)).decode()
    path.write_text(json.dumps(sealed))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


def remove(path: Path) -> None:
    path.unlink()


async def test_an_encrypted_group_exported_and_imported_reads_the_same(tmp_path: Path) -> None:
    """The grants travel with the messages: after an import into a fresh node, the members
    read the sealed name, posts and edit there as before."""
    key, bob = str(tmp_path / "alice.key"), str(tmp_path / "bob.key")
    write_key_file(Path(key), ALICE)
    write_key_file(Path(bob), BOB)
    out = tmp_path / "export"

    def texts(url: str, chat: str) -> list[str]:
        args = ("history", "--chat", chat, "--direction", "forward", "--json")
        page = json.loads(ok(*args, "--key", bob, "--node", url))
        return [m["text"] for m in page["messages"]]

    async with running_node(tmp_path / "a") as (_, http):
        url = url_of(http)

        def converse() -> tuple[str, list[str]]:
            ok("publish", "--key", bob, "--node", url)
            said = ok("group", "create", "--name", "sealed team", "--key", key, "--node", url)
            chat = said.split()[-1]
            ok("group", "add", chat, BOB.user_id.hex(), "--key", key, "--node", url)
            sent = ok("send", "first, sealed", "--chat", chat, "--key", key, "--node", url)
            msg = sent.split()[2]
            ok("edit", msg, "edited, sealed", "--chat", chat, "--key", key, "--node", url)
            ok("export", "--key", bob, "--node", url, "--out", str(out))
            return chat, texts(url, chat)

        chat, before = await trio.to_thread.run_sync(converse)
    assert before == ["sealed team", "edited, sealed"], before
    async with running_node(tmp_path / "b") as (_, http):
        url = url_of(http)
        await trio.to_thread.run_sync(ok, "import", "--key", bob, "--node", url, "--from", str(out))
        assert await trio.to_thread.run_sync(texts, url, chat) == before
