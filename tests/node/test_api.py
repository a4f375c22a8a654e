"""The HTTP API against a real node over real HTTP (no mocks).

Each test starts a ``Node`` (RocksDB in tmp_path, libp2p on 127.0.0.1, hypercorn on a
free port) inside the test's trio run and talks to it with httpx. The client library
and the user commands have their own tests in ``tests/client/``.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import trio

from client.e2e import UserKey
from store.authz import DmProof, GroupProof, new_group
from store.hlc import Hlc
from store.kinds import Claims
from store.ops import MembershipAction, MembershipOp, Op, verify_identity
from store.records import DEFAULT_MAX_PAYLOAD, IdentityRecord, MessageKind, MsgV1, canonical_cbor

from node_support import b64, counts, now_ms, ops_body, running_node, sign_in

ALICE = UserKey.from_seed(b"\x01" * 32)
BOB = UserKey.from_seed(b"\x02" * 32)
CAROL = UserKey.from_seed(b"\x03" * 32)
GROUP_PROOF = new_group(ALICE.signing_key, b"api-tests-group!")  # Alice created it
GROUP = GROUP_PROOF.chat_id()
OTHER_PROOF = new_group(ALICE.signing_key, b"api-tests-other!")
OTHER = OTHER_PROOF.chat_id()


async def chunks(count: int, size: int) -> AsyncIterator[bytes]:
    """A request body without Content-Length (chunked transfer encoding)."""
    for _ in range(count):
        yield b"x" * size


def message(key: UserKey, text: bytes, ms: int, chat: bytes = GROUP) -> MsgV1:
    return MsgV1.create(key.signing_key, chat, Hlc(ms), text)


def add(actor: UserKey, user: UserKey, ms: int, chat: GroupProof = GROUP_PROOF) -> MembershipOp:
    return MembershipOp.create(
        actor.signing_key, chat.chat_id(), user.user_id, MembershipAction.ADD, Hlc(ms), proof=chat
    )


async def post_ok(http: httpx.AsyncClient, *ops: Op) -> list[bool]:
    response = await http.post("/ops", json=ops_body(*ops))
    assert response.status_code == 201, response.text
    new: list[bool] = response.json()["new"]
    return new


# --- happy paths --------------------------------------------------------------------------


async def test_every_endpoint_happy_path_with_pagination_and_unread(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (node, http):
        http.headers.update(await sign_in(http, ALICE.signing_key))
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
        proof = (await http.get(f"/chats/{chat}/proof")).json()
        assert proof["kind"] == "group" and proof["creator"] == ALICE.user_id.hex()
        # the chat list (inbox kept by the writer) with unread counts, then a read receipt
        alice = ALICE.user_id.hex()
        chats = (await http.get(f"/users/{alice}/chats")).json()
        assert chats["next_cursor"] is None
        [entry] = chats["chats"]
        assert entry["chat_id"] == chat and entry["kind"] == "group"
        assert entry["last_msg_id"] == msgs[-1].msg_id.hex() and entry["last_seq"] == 7
        assert entry["unread"] == 4 and entry["last_ts"] == base + 106  # Bob's: hers never are
        read_url = f"/users/{alice}/chats/{chat}/read"
        assert (await http.get(read_url)).json()["position"] is None
        r = await http.put(read_url, json={"receipt": b64(read_up_to(ALICE, msgs[4]).encoded)})
        assert r.status_code == 200 and r.json()["moved"] is True
        assert r.json()["position"] == {"physical_ms": base + 104, "logical": 0}
        assert r.json()["unread"] == 1  # Bob's msgs[6]
        assert (await http.get(read_url)).json()["unread"] == 1
        assert (await http.get(f"/users/{alice}/chats")).json()["chats"][0]["unread"] == 1
        bob = await sign_in(http, BOB.signing_key)
        bob_chats = (await http.get(f"/users/{BOB.user_id.hex()}/chats", headers=bob)).json()
        bob_chats = bob_chats["chats"]
        assert bob_chats[0]["unread"] == 3  # Alice's three: a position is per user
        # a second chat: the chat list pages newest first
        other_proof = new_group(ALICE.signing_key, b"api-tests-other!")
        other = other_proof.chat_id()
        join = MembershipOp.create(
            ALICE.signing_key,
            other,
            ALICE.user_id,
            MembershipAction.ADD,
            Hlc(base),
            proof=other_proof,
        )
        await post_ok(http, join, message(ALICE, b"later", base + 500, chat=other))
        page1 = (await http.get(f"/users/{alice}/chats", params={"limit": 1})).json()
        assert [c["chat_id"] for c in page1["chats"]] == [other.hex()]
        page2 = (
            await http.get(
                f"/users/{alice}/chats", params={"limit": 1, "cursor": page1["next_cursor"]}
            )
        ).json()
        assert [c["chat_id"] for c in page2["chats"]] == [chat] and page2["next_cursor"] is None
        # status, metrics, health, OpenAPI (messages: 8 posts and Alice's receipt)
        status = (await http.get("/status")).json()
        assert status["peer_id"] == node.peer_id and status["connected_peers"] == []
        assert {k: v["count"] for k, v in status["domains"].items()} == {
            "messages": 9, "members": 3, "identity": 2, "deletes": 0, "index": 3,
        }  # fmt: skip
        assert all(len(d["root"]) == 64 for d in status["domains"].values())
        assert status["last_sync"] == {}
        metrics = (await http.get("/metrics")).text
        assert 'chatsync_records{domain="messages"} 9' in metrics
        assert "chatsync_ops_submitted_total" in metrics
        memory = {
            line.split('"')[1]: float(line.rpartition(" ")[2])
            for line in metrics.splitlines()
            if line.startswith("chatsync_memory_bytes{")
        }
        assert memory["rss"] > memory["c_heap_used"] > memory["block_cache"] >= 0
        assert memory["memtables"] > 0  # the posts above sit in memtables
        assert (await http.get("/health")).json() == {"status": "ok"}
        schema = (await http.get("/openapi.json")).json()
        for path in (
            "/ops", "/chats/{chat_id}/messages", "/chats/{chat_id}/members", "/chats/{chat_id}/proof",
            "/users/{user_id}/chats", "/users/{user_id}/chats/{chat_id}/read",
            "/identity/{user_id}", "/status", "/metrics", "/health",
        ):  # fmt: skip
            assert path in schema["paths"]
        assert (await http.get("/docs")).status_code == 200


async def test_a_message_waits_for_its_senders_add_and_a_removed_sender_is_refused(
    tmp_path: Path,
) -> None:
    async with running_node(tmp_path) as (_, http):
        http.headers.update(await sign_in(http, ALICE.signing_key))
        base = now_ms() - 60_000
        early = message(BOB, b"before the node knows his add", base + 10)
        r = await http.post("/ops", json=ops_body(early))
        assert r.status_code == 202, r.text
        assert r.json() == {"accepted": 1, "new": [False], "waiting": [True]}
        assert (await counts(http))["messages"] == 0  # held, not stored
        # the add arrives: the waiting message is stored and shown
        assert await post_ok(http, add(ALICE, ALICE, base), add(ALICE, BOB, base)) == [True] * 2
        history = f"/chats/{GROUP.hex()}/messages"
        shown = (await http.get(history)).json()["messages"]
        assert [m["id"] for m in shown] == [early.msg_id.hex()]
        later = message(BOB, b"posted before the node knows his removal", base + 30)
        assert await post_ok(http, later) == [True]
        # Bob removed at base + 20: his message stamped after that is hidden, a new one refused
        remove = MembershipOp.create(
            ALICE.signing_key, GROUP, BOB.user_id, MembershipAction.REMOVE, Hlc(base + 20),
            proof=GROUP_PROOF,
        )  # fmt: skip
        assert await post_ok(http, remove) == [True]
        shown = (await http.get(history)).json()["messages"]
        assert [m["id"] for m in shown] == [early.msg_id.hex()]
        r = await http.post("/ops", json=ops_body(message(BOB, b"after", base + 31)))
        assert (r.status_code, r.json()["code"]) == (403, "not_a_member"), r.text
        # ... and one stamped while he was a member is still taken
        before = message(BOB, b"while a member", base + 15)
        assert await post_ok(http, before) == [True]
        shown = (await http.get(history)).json()["messages"]
        assert [m["id"] for m in shown] == [before.msg_id.hex(), early.msg_id.hex()]  # newest first
        assert (await counts(http))["messages"] == 3  # ``later`` is stored, not shown


def about(key: UserKey, kind: MessageKind, target: MsgV1, payload: bytes, ms: int) -> MsgV1:
    return MsgV1.create(
        key.signing_key, target.chat_id, Hlc(ms), payload, kind=kind, ref=target.msg_id
    )


def read_up_to(key: UserKey, target: MsgV1, *, after_ms: int = 100) -> MsgV1:
    """``key``'s user's receipt up to ``target``, stamped ``after_ms`` after it."""
    stamp = Hlc(target.hlc.physical_ms + after_ms)
    return about(key, MessageKind.READ_RECEIPT, target, target.hlc.to_bytes(), stamp.physical_ms)


async def test_read_receipts_move_the_position_and_the_api_refuses_what_it_can_tell(
    tmp_path: Path,
) -> None:
    """MESSAGES.md, READ_RECEIPT, through PUT .../read: someone else's receipt, one that is
    not a receipt, of another chat, misstating its message's stamp, reading past its own
    stamp, forged, or behind the known position — each a JSON code, nothing written, the
    position unchanged; the same receipt again changes nothing; a later one moves it."""
    async with running_node(tmp_path) as (node, http):
        http.headers.update(await sign_in(http, ALICE.signing_key))
        base = now_ms() - 60_000
        posts = [message(BOB, b"p%d" % i, base + 10 + i) for i in range(4)]
        await post_ok(http, add(ALICE, ALICE, base), add(ALICE, BOB, base), *posts)
        url = f"/users/{ALICE.user_id.hex()}/chats/{GROUP.hex()}/read"
        good = read_up_to(ALICE, posts[2])
        r = await http.put(url, json={"receipt": b64(good.encoded)})
        assert (r.status_code, r.json()["unread"], r.json()["moved"]) == (200, 1, True)

        async def refused(receipt: MsgV1) -> tuple[int, str]:
            before = await counts(http)
            r = await http.put(url, json={"receipt": b64(receipt.encoded)})
            assert await counts(http) == before  # nothing written
            assert (await http.get(url)).json()["position"]["physical_ms"] == base + 12
            return r.status_code, r.json()["code"]

        position = posts[1].hlc.to_bytes()
        forged = replace(read_up_to(ALICE, posts[3]), sig=bytes(64))
        cases = [
            (read_up_to(BOB, posts[3]), 403, "not_your_receipt"),
            (message(ALICE, b"hi", base + 30), 422, "not_a_receipt"),
            (read_up_to(ALICE, message(BOB, b"x", base + 11, chat=OTHER)), 422, "wrong_chat"),
            (about(ALICE, MessageKind.READ_RECEIPT, posts[3], position, base + 40), 422,
             "bad_position"),
            (about(ALICE, MessageKind.READ_RECEIPT, posts[3], Hlc(base + 99).to_bytes(),
                   base + 40), 400, "decode"),
            (forged, 422, "bad_signature"),
            (read_up_to(ALICE, posts[1], after_ms=500), 409, "receipt_backwards"),
            (read_up_to(ALICE, posts[2], after_ms=300), 409, "receipt_backwards"),  # no further
        ]  # fmt: skip
        for receipt, status, code in cases:
            assert await refused(receipt) == (status, code), code
        assert node.metrics.counter("ops_rejected", reason="receipt_backwards") == 2
        r = await http.put(url, json={"receipt": b64(good.encoded)})  # the same again
        assert (r.status_code, r.json()["moved"]) == (200, False)
        r = await http.put(url, json={"receipt": b64(read_up_to(ALICE, posts[3]).encoded)})
        assert (r.json()["unread"], r.json()["moved"]) == (0, True)


async def test_a_delete_through_the_api_erases_and_the_api_refuses_what_it_can_tell(
    tmp_path: Path,
) -> None:
    """MESSAGES.md through POST /ops: who may edit and delete, claims that must match, a
    deleted message that stays deleted — each refusal a JSON code, nothing written."""
    async with running_node(tmp_path) as (node, http):
        http.headers.update(await sign_in(http, ALICE.signing_key))
        base = now_ms() - 60_000
        post = message(ALICE, b"to be deleted", base + 10)
        other = message(ALICE, b"stays", base + 11, chat=OTHER)
        await post_ok(http, add(ALICE, ALICE, base), add(ALICE, BOB, base), post)
        await post_ok(http, add(ALICE, ALICE, base, chat=OTHER_PROOF), other)
        history = f"/chats/{GROUP.hex()}/messages"

        async def refused(op: MsgV1) -> tuple[int, str]:
            before = await counts(http)
            r = await http.post("/ops", json=ops_body(op))
            assert await counts(http) == before  # nothing written
            return r.status_code, r.json()["code"]

        claims = Claims.of(post).encode()
        assert await refused(about(BOB, MessageKind.EDIT, post, b"bob's", base + 12)) == (
            403, "not_author",
        )  # fmt: skip
        assert await refused(about(BOB, MessageKind.DELETE, post, claims, base + 12)) == (
            403, "not_allowed",
        )  # fmt: skip
        lie = Claims(BOB.user_id, post.hlc, post.kind).encode()
        assert await refused(about(BOB, MessageKind.DELETE, post, lie, base + 12)) == (
            422, "bad_claims",
        )  # fmt: skip
        cross = MsgV1.create(
            ALICE.signing_key, GROUP, Hlc(base + 12), b"re", kind=MessageKind.REPLY,
            ref=other.msg_id,
        )  # fmt: skip
        assert await refused(cross) == (422, "ref_other_chat")
        bad = about(ALICE, MessageKind.DELETE, post, b"not claims", base + 12)
        assert (await refused(bad))[0] == 400  # a malformed public payload
        edit = about(ALICE, MessageKind.EDIT, post, b"edited", base + 12)
        assert await post_ok(http, edit) == [True]
        assert await post_ok(http, about(ALICE, MessageKind.DELETE, post, claims, base + 20)) == [
            True
        ]
        assert (await http.get(history)).json()["messages"] == []  # the post and its edit
        with trio.fail_after(5):  # the erasure task compacts them out of the files
            while node.db.erasure_pending():
                await trio.sleep(0.05)
        assert await refused(post) == (410, "deleted")  # the same bytes again
        assert await refused(about(BOB, MessageKind.REACTION, post, b"\x01+1", base + 21)) == (
            410, "deleted",
        )  # fmt: skip


# --- hostile input ------------------------------------------------------------------------


async def test_hostile_input_is_refused_with_json_and_writes_nothing(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (node, http):
        http.headers.update(await sign_in(http, ALICE.signing_key))
        base = now_ms() - 60_000
        good = message(ALICE, b"hello", base)
        await post_ok(http, add(ALICE, ALICE, base), good)  # Alice created GROUP and joined it
        before = await counts(http)
        unknown = "66" * 32  # a chat this node holds no op (and no message) of
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
        huge = MsgV1.create(  # a "receipt" over the size limit
            ALICE.signing_key, GROUP, Hlc(base), b"x" * (DEFAULT_MAX_PAYLOAD + 1),
            kind=MessageKind.READ_RECEIPT, ref=bytes(32), max_payload=DEFAULT_MAX_PAYLOAD * 2,
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
            # a chat's proof: a malformed id is a 400, a chat with no member op here a 404
            ("GET", "/chats/abcd/proof", {}, 400, "bad_id"),
            ("GET", f"/chats/{'zz' * 32}/proof", {}, 400, "bad_id"),
            ("GET", f"/chats/{' ' * 64}/proof", {}, 400, "bad_id"),
            ("GET", f"/chats/{'0' * 62}\u00e9\u00e9/proof", {}, 400, "bad_id"),
            ("GET", f"/chats/{unknown}/proof", {}, 404, "unknown_chat"),
            ("GET", f"/users/{alice[:-2]}/chats", {}, 400, "bad_id"),
            ("GET", f"/chats/{chat}/messages", {"params": {"cursor": "%%%"}}, 400, "bad_cursor"),
            ("GET", f"/chats/{chat}/messages", {"params": {"cursor": b64(b"\x01" * 44)}}, 400, "bad_cursor"),
            ("GET", f"/users/{alice}/chats", {"params": {"cursor": b64(b"x" * 60)}}, 400, "bad_cursor"),
            ("GET", f"/chats/{chat}/messages", {"params": {"limit": 0}}, 400, "bad_limit"),
            ("GET", f"/chats/{chat}/messages", {"params": {"limit": 201}}, 400, "bad_limit"),
            ("GET", f"/users/{alice}/chats", {"params": {"limit": 201}}, 400, "bad_limit"),
            ("GET", f"/chats/{chat}/messages", {"params": {"limit": "many"}}, 422, "invalid_request"),
            ("GET", f"/chats/{chat}/messages", {"params": {"direction": "sideways"}}, 422, "invalid_request"),
            ("PUT", f"/users/{alice}/chats/{chat}/read", {"json": {"seq": 5}}, 422, "invalid_request"),
            ("PUT", f"/users/{alice}/chats/{chat}/read", {"json": {"receipt": "%%%"}}, 400, "bad_base64"),
            ("PUT", f"/users/{alice}/chats/{chat}/read", {"json": {"receipt": b64(b"\x89junk")}}, 400, "truncated"),
            ("PUT", f"/users/{alice}/chats/{chat}/read", {"json": {"receipt": b64(huge.encoded)}}, 413, "oversize"),
            ("GET", f"/users/{alice}/chats/{'zz' * 32}/read", {}, 400, "bad_id"),
            ("GET", "/no/such/route", {}, 404, "not_found"),
            ("DELETE", "/ops", {}, 405, "method_not_allowed"),
        ]  # fmt: skip
        for method, path, kwargs, status, code in cases:
            r = await http.request(method, path, **kwargs)
            assert (r.status_code, r.json().get("code")) == (status, code), (path, kwargs, r.text)
            assert r.json()["message"], r.text
        assert await counts(http) == before  # nothing was written
        r = await http.get(f"/users/{alice}/chats/{chat}/read")
        assert r.json()["position"] is None
        assert (await http.get("/health")).json() == {"status": "ok"}
        metrics = (await http.get("/metrics")).text
        assert 'chatsync_api_errors_total{code="bad_signature"} 4' in metrics
        assert "chatsync_api_bugs" not in metrics
        assert node.metrics.counter("ops_rejected", reason="clock_drift") == 1


async def test_a_chats_proof_says_who_controls_it(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (_, http):
        base = now_ms() - 60_000
        dm = DmProof(ALICE.user_id, BOB.user_id)
        join = MembershipOp.create(
            BOB.signing_key, dm.chat_id(), ALICE.user_id, MembershipAction.ADD, Hlc(base), proof=dm
        )
        await post_ok(http, add(ALICE, BOB, base), join)
        r = await http.get(f"/chats/{GROUP.hex()}/proof")
        assert r.status_code == 200 and r.json() == {
            "kind": "group",
            "creator_key": GROUP_PROOF.creator_key.hex(),
            "nonce": GROUP_PROOF.nonce.hex(),
            "creator": ALICE.user_id.hex(),
        }
        r = await http.get(f"/chats/{dm.chat_id().hex()}/proof")
        assert r.json() == {"kind": "dm", "users": [ALICE.user_id.hex(), BOB.user_id.hex()]}
        # a chat with a message waiting but no member op is unknown too
        stranger = message(CAROL, b"hi", base, chat=b"\x55" * 32)
        r = await http.post("/ops", json=ops_body(stranger))
        assert r.status_code == 202 and r.json()["waiting"] == [True], r.text
        for unknown in (b"\x55" * 32, b"\x66" * 32):
            r = await http.get(f"/chats/{unknown.hex()}/proof")
            assert (r.status_code, r.json()["code"]) == (404, "unknown_chat"), r.text
            assert unknown.hex() in r.json()["message"]


async def test_a_full_write_queue_answers_503_busy(tmp_path: Path) -> None:
    async with running_node(tmp_path, write_queue=1) as (node, http):
        base = now_ms() - 60_000
        await post_ok(http, add(ALICE, ALICE, base - 1))  # Alice created GROUP: she joins it
        results: list[int] = []

        async def post(i: int) -> None:
            r = await http.post("/ops", json=ops_body(message(ALICE, b"q%d" % i, base + i)))
            results.append(r.status_code)

        writer, busy, release = node.services.writer, threading.Event(), threading.Event()

        def hold() -> None:  # a job that keeps the one writer busy until released
            busy.set()
            release.wait()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.call, hold)
                while not busy.is_set():
                    await trio.sleep(0.01)
                nursery.start_soon(post, 0)
                while writer.statistics().queued < 1:  # the queue (capacity 1) is full
                    await trio.sleep(0.01)
                r = await http.post("/ops", json=ops_body(message(ALICE, b"q2", base + 2)))
                assert (r.status_code, r.json()["code"]) == (503, "busy")
                release.set()
        finally:
            release.set()
        assert results == [201]  # the one that waited in the queue is written
        assert (await counts(http))["messages"] == 1


async def test_members_read_the_chats_hidden_grants_and_nothing_else_hidden(
    tmp_path: Path,
) -> None:
    """``GET /chats/{chat}/hidden-grants``: Bob's grants and post stamped while he was
    removed are hidden; every member reads back the grants (Bob and Carol alike), neither
    the hidden post nor a shown grant; a non-member is refused, a bad chat id gets a clear
    error."""
    async with running_node(tmp_path) as (_, http):
        http.headers.update(await sign_in(http, ALICE.signing_key))
        base = now_ms() - 60_000
        await post_ok(http, add(ALICE, ALICE, base), add(ALICE, BOB, base), add(ALICE, CAROL, base))
        grants = MsgV1.create(BOB.signing_key, GROUP, Hlc(base + 30), b"k", kind=MessageKind.KEYS)
        post = message(BOB, b"while removed", base + 31)
        shown = message(BOB, b"after his re-add", base + 50)
        carols = MsgV1.create(CAROL.signing_key, GROUP, Hlc(base + 51), b"c", kind=MessageKind.KEYS)
        remove = MembershipOp.create(
            ALICE.signing_key, GROUP, BOB.user_id, MembershipAction.REMOVE, Hlc(base + 20),
            proof=GROUP_PROOF,
        )  # fmt: skip
        await post_ok(http, grants, post)  # before this node knows of the removal
        await post_ok(http, remove, add(ALICE, BOB, base + 40), shown, carols)
        hidden = f"/chats/{GROUP.hex()}/hidden-grants"
        for user in (BOB, CAROL):
            http.headers.update(await sign_in(http, user.signing_key))
            r = await http.get(hidden)
            assert r.status_code == 200, r.text
            assert [m["id"] for m in r.json()["messages"]] == [grants.msg_id.hex()]
        assert (await http.get("/chats/zz/hidden-grants")).status_code in (400, 422)
        assert (await http.get(f"/chats/{GROUP.hex()}/hidden")).status_code == 404  # gone
        stranger = UserKey.from_seed(b"\x09" * 32)
        http.headers.update(await sign_in(http, stranger.signing_key))
        r = await http.get(hidden)
        assert (r.status_code, r.json()["code"]) == (403, "not_a_member")
