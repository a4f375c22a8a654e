"""The HTTP API, the client and the user CLI against a real node over real HTTP (no mocks).

Each test starts a ``Node`` (RocksDB in tmp_path, libp2p on 127.0.0.1, hypercorn on a
free port) inside the test's trio run and talks to it with httpx. The synchronous
client and the CLI run in a worker thread so the node keeps serving meanwhile.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import trio
from typer.testing import CliRunner

from node.cli import app as cli_app
from node.client import ChatsyncClient, ChatsyncClientError
from node.e2e import UserKey, decode_envelope, open_dm, read_key_file, seal_dm
from store.authz import DmProof, new_group
from store.hlc import Hlc
from store.ops import MembershipAction, MembershipOp, Op, verify_identity
from store.records import DEFAULT_MAX_PAYLOAD, IdentityRecord, MsgV1, canonical_cbor, dm_chat_id

from node_support import b64, counts, free_port, now_ms, ops_body, running_node

ALICE = UserKey.from_seed(b"\x01" * 32)
BOB = UserKey.from_seed(b"\x02" * 32)
CAROL = UserKey.from_seed(b"\x03" * 32)
GROUP_PROOF = new_group(ALICE.signing_key, b"api-tests-group!")  # Alice created it
GROUP = GROUP_PROOF.chat_id()


async def chunks(count: int, size: int) -> AsyncIterator[bytes]:
    """A request body without Content-Length (chunked transfer encoding)."""
    for _ in range(count):
        yield b"x" * size


def message(key: UserKey, text: bytes, ms: int, chat: bytes = GROUP) -> MsgV1:
    return MsgV1.create(key.signing_key, chat, Hlc(ms), text)


def add(actor: UserKey, user: UserKey, ms: int) -> MembershipOp:
    return MembershipOp.create(
        actor.signing_key, GROUP, user.user_id, MembershipAction.ADD, Hlc(ms), proof=GROUP_PROOF
    )


def url_of(http: httpx.AsyncClient) -> str:
    return str(http.base_url).rstrip("/")


async def post_ok(http: httpx.AsyncClient, *ops: Op) -> list[bool]:
    response = await http.post("/ops", json=ops_body(*ops))
    assert response.status_code == 201, response.text
    new: list[bool] = response.json()["new"]
    return new


# --- happy paths --------------------------------------------------------------------------


async def test_every_endpoint_happy_path_with_pagination_and_unread(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (node, http):
        base = now_ms() - 60_000
        # identities: PUT, then GET round trip (the record verifies)
        for i, key in enumerate((ALICE, BOB)):
            record = key.identity(Hlc(base + i))
            r = await http.put(
                f"/identity/{key.user_id.hex()}", json={"data": b64(record.encode())}
            )
            assert r.status_code == 200 and r.json() == {"user_id": key.user_id.hex(), "new": True}
        r = await http.get(f"/identity/{BOB.user_id.hex()}")
        got = r.json()
        hlc = Hlc(got["hlc"]["physical_ms"], got["hlc"]["logical"])
        blob = base64.urlsafe_b64decode(got["blob"])
        assert verify_identity(IdentityRecord(BOB.user_id, hlc, blob)).box_key == BOB.box_key
        # a group: two members, 7 messages over two submissions
        assert await post_ok(http, add(ALICE, ALICE, base), add(ALICE, BOB, base)) == [True, True]
        msgs = [message(ALICE if i % 2 else BOB, b"m%d" % i, base + 100 + i) for i in range(7)]
        assert await post_ok(http, *msgs[:4]) == [True] * 4
        assert await post_ok(http, *msgs[4:], msgs[0]) == [True, True, True, False]
        # history, both directions, paged by 3: every message once, in HLC order
        chat = GROUP.hex()
        for direction, expected in (("backward", msgs[::-1]), ("forward", msgs)):
            seen: list[dict[str, Any]] = []
            cursor = None
            while True:
                params: dict[str, Any] = {"limit": 3, "direction": direction}
                if cursor:
                    params["cursor"] = cursor
                page = (await http.get(f"/chats/{chat}/messages", params=params)).json()
                seen += page["messages"]
                cursor = page["next_cursor"]
                if cursor is None:
                    break
            assert [m["id"] for m in seen] == [m.msg_id.hex() for m in expected]
        first = seen[0]
        assert first["sender"] == msgs[0].sender.hex() and first["kind"] == 0
        assert base64.urlsafe_b64decode(first["payload"]) == b"m0" and first["ref"] is None
        assert first["hlc"] == {"physical_ms": base + 100, "logical": 0} and first["seq"] == 1
        # members
        members = (await http.get(f"/chats/{chat}/members")).json()["members"]
        assert sorted(m["user_id"] for m in members) == sorted(
            [ALICE.user_id.hex(), BOB.user_id.hex()]
        )
        assert {m["role"] for m in members} == {"participant"}
        # the chat list (inbox kept by the writer) with unread counts, then read progress
        alice = ALICE.user_id.hex()
        chats = (await http.get(f"/users/{alice}/chats")).json()
        assert chats["next_cursor"] is None
        [entry] = chats["chats"]
        assert entry["chat_id"] == chat and entry["kind"] == "group"
        assert entry["last_msg_id"] == msgs[-1].msg_id.hex() and entry["last_seq"] == 7
        assert entry["unread"] == 7 and entry["last_ts"] == base + 106
        read_url = f"/users/{alice}/chats/{chat}/read"
        assert (await http.get(read_url)).json()["seq"] == 0
        r = await http.put(read_url, json={"seq": 5})
        assert r.json()["moved"] is True
        assert r.json()["seq"] == 5 and r.json()["unread"] == 2
        r = await http.put(read_url, json={"seq": 3})  # never backwards
        assert r.json()["moved"] is False and r.json()["seq"] == 5
        r = await http.put(read_url, json={"seq": 1000})  # capped at the chat's last seq
        assert r.json()["seq"] == 7 and r.json()["unread"] == 0
        assert (await http.get(f"/users/{alice}/chats")).json()["chats"][0]["unread"] == 0
        bob_chats = (await http.get(f"/users/{BOB.user_id.hex()}/chats")).json()["chats"]
        assert bob_chats[0]["unread"] == 7  # read progress is per user
        # a second chat: the chat list pages newest first
        other = b"\x78" * 32
        await post_ok(http, message(ALICE, b"later", base + 500, chat=other))
        page1 = (await http.get(f"/users/{alice}/chats", params={"limit": 1})).json()
        assert [c["chat_id"] for c in page1["chats"]] == [other.hex()]
        page2 = (
            await http.get(
                f"/users/{alice}/chats", params={"limit": 1, "cursor": page1["next_cursor"]}
            )
        ).json()
        assert [c["chat_id"] for c in page2["chats"]] == [chat] and page2["next_cursor"] is None
        # status, metrics, health, OpenAPI
        status = (await http.get("/status")).json()
        assert status["peer_id"] == node.peer_id and status["connected_peers"] == []
        assert {k: v["count"] for k, v in status["domains"].items()} == {
            "messages": 8, "members": 2, "identity": 2,
        }  # fmt: skip
        assert all(len(d["root"]) == 64 for d in status["domains"].values())
        assert status["last_sync"] == {}
        metrics = (await http.get("/metrics")).text
        assert 'chatsync_records{domain="messages"} 8' in metrics
        assert "chatsync_ops_submitted_total" in metrics
        assert (await http.get("/health")).json() == {"status": "ok"}
        schema = (await http.get("/openapi.json")).json()
        for path in (
            "/ops", "/chats/{chat_id}/messages", "/chats/{chat_id}/members",
            "/users/{user_id}/chats", "/users/{user_id}/chats/{chat_id}/read",
            "/identity/{user_id}", "/status", "/metrics", "/health",
        ):  # fmt: skip
            assert path in schema["paths"]
        assert (await http.get("/docs")).status_code == 200


async def test_dm_is_encrypted_end_to_end_through_the_node(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (_, http):
        url = url_of(http)

        def converse() -> tuple[bytes, list[bytes], list[Any], dict[str, Any]]:
            with ChatsyncClient(url) as client:
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
                [entry] = client.chats(BOB.user_id)["chats"]
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
                return chat, payloads, client.members(chat), client.chats(BOB.user_id)

        _, payloads, members, bob_chats = await trio.to_thread.run_sync(converse)
        assert b"hi bob" not in payloads[0] and b"hi alice" not in payloads[1]  # stored sealed
        decode_envelope(payloads[0])
        # both parties read both messages; a third party cannot
        assert open_dm(BOB, payloads[0], ALICE.box_key) == b"hi bob"
        assert open_dm(ALICE, payloads[0], ALICE.box_key) == b"hi bob"
        assert open_dm(ALICE, payloads[1], BOB.box_key) == b"hi alice"
        assert sorted(members) == sorted([ALICE.user_id, BOB.user_id])
        assert bob_chats["chats"][0]["kind"] == "dm" and bob_chats["chats"][0]["unread"] == 2
        try:
            open_dm(CAROL, payloads[0], ALICE.box_key)
        except Exception as exc:
            assert "not addressed" in str(exc)
        else:
            raise AssertionError("a third party opened the DM")


# --- hostile input ------------------------------------------------------------------------


async def test_hostile_input_is_refused_with_json_and_writes_nothing(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (node, http):
        base = now_ms() - 60_000
        good = message(ALICE, b"hello", base)
        await post_ok(http, good)
        before = await counts(http)
        chat, alice = GROUP.hex(), ALICE.user_id.hex()
        forged_sig = MsgV1(
            good.chat_id, good.sender, good.hlc, good.kind, good.payload, None,
            good.author_key, bytes(64),
        )  # fmt: skip
        tampered = MsgV1(
            good.chat_id,
            good.sender,
            good.hlc,
            good.kind,
            b"HELLO",
            None,
            good.author_key,
            good.sig,
        )
        impostor = MsgV1(  # Bob's id, Alice's key and signature
            good.chat_id, BOB.user_id, good.hlc, good.kind, good.payload, None,
            good.author_key, good.sig,
        )  # fmt: skip
        oversized = MsgV1.create(
            ALICE.signing_key, GROUP, Hlc(base), b"x" * (DEFAULT_MAX_PAYLOAD + 1),
            max_payload=DEFAULT_MAX_PAYLOAD * 2,
        )  # fmt: skip
        ahead = message(ALICE, b"from the future", now_ms() + 10 * 60_000)
        bob_identity = BOB.identity(Hlc(base))
        join = add(ALICE, BOB, base)
        short_chat = canonical_cbor(  # a MembershipOp whose chat id is 31 bytes
            [
                1,
                GROUP[:31],
                BOB.user_id,
                0,
                0,
                Hlc(base).pack(),
                join.actor_key,
                None,
                None,
                join.sig,
            ]
        )
        cases: list[tuple[str, str, dict[str, Any], int, str]] = [
            # (method, path, request kwargs, status, code)
            ("POST", "/ops", {"json": {"ops": [{"kind": 1, "data": "!!not base64!!"}]}}, 400, "bad_base64"),
            ("POST", "/ops", {"json": {"ops": [{"kind": 1, "data": b64(b"\xff\x00\x13garbage")}]}}, 400, "malformed"),
            ("POST", "/ops", {"json": {"ops": [{"kind": 1, "data": b64(b"\x82\x01\x02")}]}}, 400, "wrong_type"),
            ("POST", "/ops", {"json": {"ops": [{"kind": 2, "data": b64(short_chat)}]}}, 400, "wrong_length"),
            ("POST", "/ops", {"json": {"ops": [{"kind": 9, "data": b64(good.encoded)}]}}, 400, "unknown_kind"),
            ("POST", "/ops", {"json": {"ops": [{"kind": 2, "data": b64(good.encoded)}]}}, 400, "wrong_type"),
            ("POST", "/ops", {"json": {"ops": [{"kind": "one", "data": ""}]}}, 422, "invalid_request"),
            ("POST", "/ops", {"json": ops_body(tampered)}, 422, "bad_signature"),
            ("POST", "/ops", {"json": ops_body(impostor)}, 422, "bad_signature"),
            ("POST", "/ops", {"json": ops_body(forged_sig)}, 422, "bad_signature"),
            # Bob is no admin of Alice's group: he may not add Carol (store.authz)
            ("POST", "/ops", {"json": ops_body(MembershipOp.create(BOB.signing_key, GROUP, CAROL.user_id, MembershipAction.ADD, Hlc(base), proof=GROUP_PROOF))}, 422, "unauthorized"),
            # a membership op without its chat proof
            ("POST", "/ops", {"json": ops_body(MembershipOp.create(ALICE.signing_key, GROUP, CAROL.user_id, MembershipAction.ADD, Hlc(base)))}, 422, "unauthorized"),
            ("POST", "/ops", {"json": ops_body(oversized)}, 413, "oversize"),
            ("POST", "/ops", {"json": ops_body(ahead)}, 422, "clock_drift"),
            # one bad op spoils the batch: the good new op before it is not written either
            ("POST", "/ops", {"json": ops_body(message(BOB, b"new", base), tampered)}, 422, "bad_signature"),
            ("POST", "/ops", {"json": {"ops": [{"kind": 1, "data": "AA"}] * 1025}}, 422, "invalid_request"),
            ("POST", "/ops", {"content": b"{not json", "headers": {"content-type": "application/json"}}, 422, "invalid_request"),
            ("POST", "/ops", {"content": b"x" * (9 << 20)}, 413, "body_too_large"),
            ("POST", "/ops", {"content": chunks(9, 1 << 20)}, 413, "body_too_large"),
            ("PUT", f"/identity/{alice}", {"json": {"data": b64(bob_identity.encode())}}, 422, "user_mismatch"),
            ("PUT", f"/identity/{alice}", {"json": {"data": b64(b"junk")}}, 400, "truncated"),
            ("PUT", f"/identity/{alice}", {"json": {}}, 422, "invalid_request"),
            ("GET", f"/identity/{alice}", {}, 404, "not_found"),
            ("GET", "/identity/abc", {}, 400, "bad_id"),
            ("GET", "/chats/abcd/messages", {}, 400, "bad_id"),
            ("GET", f"/chats/{'zz' * 32}/messages", {}, 400, "bad_id"),
            ("GET", f"/chats/{chat}00/members", {}, 400, "bad_id"),
            ("GET", f"/users/{alice[:-2]}/chats", {}, 400, "bad_id"),
            ("GET", f"/chats/{chat}/messages", {"params": {"cursor": "%%%"}}, 400, "bad_cursor"),
            ("GET", f"/chats/{chat}/messages", {"params": {"cursor": b64(b"\x01" * 44)}}, 400, "bad_cursor"),
            ("GET", f"/users/{alice}/chats", {"params": {"cursor": b64(b"x" * 60)}}, 400, "bad_cursor"),
            ("GET", f"/chats/{chat}/messages", {"params": {"limit": 0}}, 400, "bad_limit"),
            ("GET", f"/chats/{chat}/messages", {"params": {"limit": 201}}, 400, "bad_limit"),
            ("GET", f"/users/{alice}/chats", {"params": {"limit": 201}}, 400, "bad_limit"),
            ("GET", f"/chats/{chat}/messages", {"params": {"limit": "many"}}, 422, "invalid_request"),
            ("GET", f"/chats/{chat}/messages", {"params": {"direction": "sideways"}}, 422, "invalid_request"),
            ("PUT", f"/users/{alice}/chats/{chat}/read", {"json": {"seq": -1}}, 422, "invalid_request"),
            ("PUT", f"/users/{alice}/chats/{chat}/read", {"json": {"seq": 1 << 32}}, 422, "invalid_request"),
            ("GET", "/no/such/route", {}, 404, "not_found"),
            ("DELETE", "/ops", {}, 405, "method_not_allowed"),
        ]  # fmt: skip
        for method, path, kwargs, status, code in cases:
            r = await http.request(method, path, **kwargs)
            assert (r.status_code, r.json().get("code")) == (status, code), (path, kwargs, r.text)
            assert r.json()["message"], r.text
        assert await counts(http) == before  # nothing was written
        r = await http.get(f"/users/{alice}/chats/{chat}/read")
        assert r.json()["seq"] == 0
        assert (await http.get("/health")).json() == {"status": "ok"}
        metrics = (await http.get("/metrics")).text
        assert 'chatsync_api_errors_total{code="bad_signature"} 4' in metrics
        assert "chatsync_api_bugs" not in metrics
        assert node.metrics.counter("ops_rejected", reason="clock_drift") == 1


async def test_a_full_write_queue_answers_503_busy(tmp_path: Path) -> None:
    async with running_node(tmp_path, write_queue=1) as (node, http):
        base = now_ms() - 60_000
        results: list[int] = []

        async def post(i: int) -> None:
            r = await http.post("/ops", json=ops_body(message(ALICE, b"q%d" % i, base + i)))
            results.append(r.status_code)

        lock, writer = node.services.db_lock, node.services.writer
        await lock.acquire()  # the writer takes one request, then waits for the lock
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, 0)
                while not lock.statistics().tasks_waiting:
                    await trio.sleep(0.01)
                nursery.start_soon(post, 1)  # fills the queue (capacity 1)
                while writer.statistics().queued < 1:
                    await trio.sleep(0.01)
                r = await http.post("/ops", json=ops_body(message(ALICE, b"q2", base + 2)))
                assert (r.status_code, r.json()["code"]) == (503, "busy")
                lock.release()
        finally:
            if lock.locked():
                lock.release()
        assert sorted(results) == [201, 201]
        assert (await counts(http))["messages"] == 2


# --- the CLI ------------------------------------------------------------------------------


def run_cli(*args: str) -> Any:
    result = CliRunner().invoke(cli_app, list(args))
    return result


async def test_cli_keygen_send_dm_history_status(tmp_path: Path) -> None:
    alice_file, bob_file = tmp_path / "alice.key", tmp_path / "bob.key"
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
            with ChatsyncClient(url) as client:
                stored = [m.msg.payload for m in client.history(bytes.fromhex(chat)).messages]
                assert len(stored) == 2 and all(b"hello bob" not in p for p in stored)
                assert len(client.members(bytes.fromhex(chat))) == 2
                [entry] = client.chats(bob.user_id)["chats"]  # first contact: in Bob's list
                assert (entry["chat_id"], entry["kind"], entry["unread"]) == (chat, "dm", 2)
            r = run_cli("history", "--node", url, "--chat", chat, "--key", str(bob_file))
            assert r.exit_code == 0 and "hello bob" in r.output and "second" in r.output, r.output
            r = run_cli("history", "--node", url, "--chat", chat, "--key", str(alice_file))
            assert r.exit_code == 0 and "hello bob" in r.output and "me" in r.output
            r = run_cli("history", "--node", url, "--chat", chat)
            assert r.exit_code == 0 and "encrypted DM" in r.output and "hello" not in r.output
            r = run_cli("history", "--node", url, "--chat", chat, "--limit", "1")
            assert "--cursor" in r.output
            # a plain group message with --chat
            group = GROUP.hex()
            r = run_cli("send", "--key", str(bob_file), "--node", url, "--chat", group, "hi all")
            assert r.exit_code == 0, r.output
            r = run_cli("history", "--node", url, "--chat", group, "--direction", "forward")
            assert "hi all" in r.output
            r = run_cli("status", "--node", url)
            assert r.exit_code == 0 and "messages" in r.output and "no sync yet" in r.output
            # errors: one line, exit 1, no traceback
            r = run_cli("history", "--node", url, "--chat", "abc")
            assert r.exit_code == 1 and "error" in r.output
            r = run_cli(
                "send", "--key", str(alice_file), "--node", url, "--chat", group, "x" * 300_000
            )
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
            with ChatsyncClient(url) as client:
                try:
                    client.history(GROUP, limit=0)
                except ChatsyncClientError as exc:
                    assert (exc.status, exc.code) == (400, "bad_limit")
                else:
                    raise AssertionError("no error")
                assert client.health() == {"status": "ok"}
                assert "chatsync_records" in client.metrics()
                assert client.read_progress(ALICE.user_id, GROUP)["seq"] == 0
                state = client.set_read_progress(ALICE.user_id, GROUP, 3)
                assert state["moved"] is False  # an empty chat caps progress at 0

        await trio.to_thread.run_sync(check)


def test_key_file_round_trip(tmp_path: Path) -> None:
    from node.e2e import write_key_file

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
