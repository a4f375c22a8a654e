"""The dm3 gateway of a real node (HTTP on loopback, RocksDB in a temp dir): dm3 sign-in,
submissions and their refusals, fetch and acknowledgement, and that nothing refused is
written. The real dm3 libraries against two nodes: tests/interop/test_dm3_js.py."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey

from client.e2e import UserKey
from dm3 import rpc
from dm3.crypto import encryption_keys, sign_text, stringify
from dm3.envelope import build_envelope, open_envelope, sign_message
from dm3.names import inbox_proof, name_of
from store import Hlc
from store.ops import MembershipAction, MembershipOp, Op
from store.records import Role
from store.signing import user_id_from_key

from node_support import counts, now_ms, ops_body, running_node

ALICE, BOB, CAROL = (UserKey(SigningKey(bytes([i]) * 32)) for i in (41, 42, 43))


def name(user: UserKey) -> str:
    return name_of(user.user_id)


async def register(http: httpx.AsyncClient, user: UserKey, services: list[bytes]) -> None:
    """What ``chatsync dm3 register`` posts: identity, inbox, the services as admins."""
    proof = inbox_proof(bytes(user.signing_key.verify_key))
    stamp = now_ms()
    ops: list[Op] = [user.identity(Hlc(stamp))]
    ops += [
        MembershipOp.create(
            user.signing_key, proof.chat_id(), member, MembershipAction.ADD, Hlc(stamp, i),
            Role.ADMIN, proof=proof,
        )
        for i, member in enumerate([user.user_id, *services])
    ]  # fmt: skip
    assert (await http.post("/ops", json=ops_body(*ops))).status_code in (201, 202)


async def service_of(http: httpx.AsyncClient) -> tuple[bytes, bytes]:
    """(the node's dm3 user, its box key) from its delivery service profile."""
    profile = (await http.get("/dm3/profile")).json()
    assert set(profile) == {"publicSigningKey", "publicEncryptionKey", "url"}  # dm3's schema
    signing = base64.b64decode(profile["publicSigningKey"])
    return user_id_from_key(signing), base64.b64decode(profile["publicEncryptionKey"])


async def dm3_token(http: httpx.AsyncClient, user: UserKey) -> str:
    challenge = (await http.get(f"/auth/{name(user)}")).json()["challenge"]
    got = await http.post(
        f"/auth/{name(user)}", json={"signature": sign_text(user.signing_key, challenge)}
    )
    assert got.status_code == 200, got.text
    token: str = got.json()["token"]
    return token


def envelope(sender: UserKey, to: UserKey, service_box: bytes, text: str = "hi") -> dict[str, Any]:
    message = sign_message(sender.signing_key, name(sender), name(to), text, now_ms())
    box = encryption_keys(to.signing_key).public
    return build_envelope(sender.signing_key, message, box, service_box, os.urandom(88))


async def call(http: httpx.AsyncClient, method: str, *params: Any) -> dict[str, Any]:
    got = await http.post(
        "/rpc", json={"jsonrpc": "2.0", "id": 3, "method": method, "params": list(params)}
    )
    assert got.status_code == 200
    answer: dict[str, Any] = got.json()
    return answer


def code(answer: dict[str, Any]) -> int | None:
    return answer.get("error", {}).get("code")


async def test_submit_fetch_acknowledge_and_every_refusal(tmp_path: Path) -> None:
    async with running_node(tmp_path, dm3_sender_per_s=2.0) as (_, http):
        service, service_box = await service_of(http)
        await register(http, ALICE, [service])
        await register(http, BOB, [service])
        await register(http, CAROL, [])  # this node is not carol's delivery service
        alice = await dm3_token(http, ALICE)
        bob = {"authorization": f"Bearer {await dm3_token(http, BOB)}"}
        before = await counts(http)

        # refused, each with its code, and nothing written
        good = envelope(ALICE, BOB, service_box, "gm")
        assert code(await call(http, "dm3_submitMessage", stringify(good))) == rpc.INVALID_PARAMS
        assert (
            code(await call(http, "dm3_submitMessage", stringify(good), "forged"))
            == rpc.UNAUTHORIZED
        )
        bob_token = bob["authorization"].removeprefix("Bearer ")
        assert (
            code(await call(http, "dm3_submitMessage", stringify(good), bob_token))
            == rpc.UNAUTHORIZED
        )
        to_carol = envelope(ALICE, CAROL, service_box)
        assert (
            code(await call(http, "dm3_submitMessage", stringify(to_carol), alice))
            == rpc.UNAVAILABLE
        )
        unsealed = envelope(ALICE, BOB, encryption_keys(SigningKey.generate()).public)
        assert (
            code(await call(http, "dm3_submitMessage", stringify(unsealed), alice))
            == rpc.INVALID_INPUT
        )
        assert (
            code(await call(http, "dm3_getProfileExtension", name_of(b"\x01" * 20)))
            == rpc.NOT_FOUND
        )
        assert code(await call(http, "dm3_getProfileExtension")) == rpc.INVALID_PARAMS
        huge = b'{"jsonrpc": "2.0", "method": "dm3_submitMessage", "params": ["' + b"x" * (9 << 20)
        got = await http.post("/rpc", content=huge)
        assert got.status_code == 413 and got.json()["error"]["code"] == rpc.TOO_BIG
        assert await counts(http) == before

        # accepted, fetched by the recipient only, opened
        assert (await call(http, "dm3_submitMessage", stringify(good), alice))[
            "result"
        ] == "success"
        path = f"/delivery/messages/{name(BOB)}/contact/{name(ALICE)}"
        assert (await http.get(path)).status_code == 401
        alice_header = {"authorization": f"Bearer {alice}"}
        assert (await http.get(path, headers=alice_header)).json()["code"] == "wrong_user"
        kept = (await http.get(path, headers=bob)).json()
        message, postmark = open_envelope(encryption_keys(BOB.signing_key), kept[0])
        assert len(kept) == 1 and message["message"] == "gm"
        other = f"/delivery/messages/{name(BOB)}/contact/{name(CAROL)}"
        assert (await http.get(other, headers=bob)).json() == []

        # a sender over its rate (2/s, burst 10) is told to slow down
        answers = [
            await call(
                http, "dm3_submitMessage", stringify(envelope(ALICE, BOB, service_box)), alice
            )
            for _ in range(12)
        ]
        assert code(answers[-1]) == rpc.LIMIT_EXCEEDED
        assert all(code(a) in (None, rpc.LIMIT_EXCEEDED) for a in answers)
        accepted = 1 + sum(code(a) is None for a in answers)

        # acknowledged up to a time: what came in by then is deleted (DELETE ops: on every node)
        ack = f"/delivery/messages/{name(BOB)}/syncAcknowledgment/{postmark['incommingTimestamp'] - 1}"
        body = {"acknoledgments": [{"contactAddress": name(ALICE), "messageHash": "0x"}]}
        assert (await http.post(ack, json=body, headers=bob)).json() == {"deleted": 0}
        everything = f"/delivery/messages/{name(BOB)}/syncAcknowledgment/{now_ms() + 1000}"
        assert (await http.post(everything, json=body, headers=bob)).json() == {"deleted": accepted}
        assert (
            await http.get(f"/delivery/messages/incoming/{name(BOB)}", headers=bob)
        ).json() == []
        assert (await http.post(everything, json={"acks": []}, headers=bob)).status_code == 422
        # this node may read carol's inbox for her, but not delete there: it is not her service
        carol = {"authorization": f"Bearer {await dm3_token(http, CAROL)}"}
        not_hers = f"/delivery/messages/{name(CAROL)}/syncAcknowledgment/{now_ms()}"
        refused = await http.post(not_hers, json=body, headers=carol)
        assert (refused.status_code, refused.json()["code"]) == (403, "not_a_delivery_service")
        assert (
            await http.get(f"/delivery/messages/incoming/{name(CAROL)}", headers=carol)
        ).json() == []


async def test_the_largest_envelope_under_the_limit_is_kept(tmp_path: Path) -> None:
    """sizeLimit leaves room for the postmark and the wrapping within the payload limit."""
    from dm3.envelope import envelope_size

    async with running_node(tmp_path) as (_, http):
        service, service_box = await service_of(http)
        await register(http, ALICE, [service])
        await register(http, BOB, [service])
        alice = await dm3_token(http, ALICE)
        limit = json.loads((await call(http, "dm3_getDeliveryServiceProperties"))["result"])[
            "sizeLimit"
        ]
        text = "x" * (limit // 2)  # sealed twice over in base64: grow it to just under the limit
        while envelope_size(envelope(ALICE, BOB, service_box, text + "x" * 1500)) <= limit:
            text += "x" * 1500
        biggest = envelope(ALICE, BOB, service_box, text)
        assert limit - 3000 < envelope_size(biggest) <= limit
        assert (await call(http, "dm3_submitMessage", stringify(biggest), alice))[
            "result"
        ] == "success"
        bob = {"authorization": f"Bearer {await dm3_token(http, BOB)}"}
        kept = (await http.get(f"/delivery/messages/incoming/{name(BOB)}", headers=bob)).json()
        assert open_envelope(encryption_keys(BOB.signing_key), kept[0])[0]["message"] == text


async def test_dm3_sign_in_refusals(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (_, http):
        service, _ = await service_of(http)
        await register(http, ALICE, [service])
        assert (await http.get("/auth/alice.eth")).json()["code"] == "unknown_name"
        assert (await http.get(f"/auth/{name(BOB)}")).status_code == 404  # no identity here
        url = f"/auth/{name(ALICE)}"
        first = await http.post(url, json={"signature": base64.b64encode(b"x" * 64).decode()})
        assert first.json()["code"] == "challenge_unknown"  # ask for one first
        challenge = (await http.get(url)).json()["challenge"]
        wrong = sign_text(BOB.signing_key, challenge)
        assert (await http.post(url, json={"signature": wrong})).json()["code"] == "bad_signature"
        challenge = (await http.get(url)).json()["challenge"]
        assert (await http.post(url, json={"signature": "***"})).json()["code"] == "bad_signature"
        challenge = (await http.get(url)).json()["challenge"]
        signature = sign_text(ALICE.signing_key, challenge)
        token = (await http.post(url, json={"signature": signature})).json()["token"]
        again = await http.post(url, json={"signature": signature, "challenge": challenge})
        assert again.json()["code"] == "challenge_unknown"  # good once
        # the dm3 token is the node's usual one: it opens alice's own chat list too
        chats = await http.get(
            f"/users/{ALICE.user_id.hex()}/chats", headers={"authorization": f"Bearer {token}"}
        )
        assert chats.status_code == 200


async def test_the_cli_registers_sends_and_reads_the_inbox(tmp_path: Path) -> None:
    import trio
    from typer.testing import CliRunner

    from cli.main import build_app
    from client.e2e import write_key_file

    async with running_node(tmp_path) as (_, http):
        url = str(http.base_url).rstrip("/")
        files = {}
        for label, user in (("alice", ALICE), ("bob", BOB)):
            files[label] = str(tmp_path / f"{label}.key")
            write_key_file(Path(files[label]), user)

        async def chatsync(*args: str) -> str:
            result = await trio.to_thread.run_sync(
                lambda: CliRunner().invoke(build_app(), list(args))
            )
            assert result.exit_code == 0, result.output
            return result.output

        for label in ("alice", "bob"):
            assert "dm3 name" in await chatsync(
                "dm3", "register", "--key", files[label], "--node", url
            )
        sent = await chatsync(
            "dm3",
            "send",
            "hello from the CLI",
            "--to",
            name(BOB),
            "--key",
            files["alice"],
            "--node",
            url,
        )
        assert f"sent to {name(BOB)}" in sent
        shown = await chatsync("dm3", "inbox", "--key", files["bob"], "--node", url, "--ack")
        assert f"{name(ALICE)}: hello from the CLI" in shown and "1 deleted" in shown
        assert "signature not checked" not in shown
        assert "hello" not in await chatsync("dm3", "inbox", "--key", files["bob"], "--node", url)
        refused = await trio.to_thread.run_sync(
            lambda: CliRunner().invoke(
                build_app(),
                ["dm3", "send", "x", "--to", "bob.eth", "--key", files["alice"], "--node", url],
            )
        )
        assert refused.exit_code == 1 and "not a chatsync dm3 name" in refused.output


# --- convergence: what an inbox keeps is a function of the replicated state ---

SHAPE = {"version": "v1", "deliveryInformation": "-", "encryptedMessageHash": "-", "signature": "-"}
GATEWAYS = [SigningKey(bytes([i]) * 32) for i in (51, 52)]  # the inbox's admins
MEMBER = SigningKey(bytes([53]) * 32)  # a participant: may post, does not count as a service


def inbox_ops(
    posts: list[tuple[int, int]], deletes: list[tuple[int, int]]
) -> tuple[list[Op], set[bytes]]:
    """Bob's inbox: his identity and adds, envelopes posted by (author, n) — author 0/1 a
    gateway, 2 a mere member — and deletes of post i by (author); the oracle's kept ids."""
    from dm3.envelope import Delivered, DeliveryInformation, wrap
    from store import MsgV1
    from store.kinds import Claims
    from store.records import MessageKind

    proof = inbox_proof(bytes(BOB.signing_key.verify_key))
    inbox = proof.chat_id()
    users = [user_id_from_key(bytes(k.verify_key)) for k in (*GATEWAYS, MEMBER)]
    ops: list[Op] = [BOB.identity(Hlc(1000))]
    for i, (user, role) in enumerate(
        zip(users, (Role.ADMIN, Role.ADMIN, Role.PARTICIPANT), strict=True)
    ):
        ops.append(
            MembershipOp.create(
                BOB.signing_key, inbox, user, MembershipAction.ADD, Hlc(1000 + i), role, proof=proof
            )
        )
    authors = [*GATEWAYS, MEMBER]
    msgs = []
    for n, (author, salt) in enumerate(posts):
        kept = Delivered(
            {"message": f"m{salt}", "metadata": SHAPE},
            DeliveryInformation(name(BOB), name(ALICE)),
            2000 + n,
        )
        msgs.append(MsgV1.create(authors[author], inbox, Hlc(2000 + n), wrap(kept)))
    ops += msgs
    erased = set()
    for target, author in deletes:
        if target < len(msgs):
            msg = msgs[target]
            ops.append(
                MsgV1.create(
                    authors[author],
                    inbox,
                    Hlc(5000 + target),
                    Claims.of(msg).encode(),
                    kind=MessageKind.DELETE,
                    ref=msg.msg_id,
                )
            )
            if (
                author < 2 or authors[author] is authors[posts[target][0]]
            ):  # an admin, or its author
                erased.add(msg.msg_id)
    gateways = {user_id_from_key(bytes(k.verify_key)) for k in GATEWAYS}
    expected = {m.msg_id for m in msgs if m.sender in gateways} - erased
    return ops, expected


@settings(max_examples=20)
@given(
    posts=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 9)), min_size=1, max_size=6),
    deletes=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2)), max_size=4),
    orders=st.lists(st.randoms(use_true_random=False), min_size=3, max_size=3),
    batch=st.integers(1, 4),
)
def test_every_replica_keeps_the_same_envelopes_whatever_the_order(
    posts: list[tuple[int, int]], deletes: list[tuple[int, int]], orders: list[Any], batch: int
) -> None:
    import tempfile

    from node.dm3 import kept_envelopes
    from store import ChatDb, ChatDbConfig
    from sync.replica import DbReplica

    ops, expected = inbox_ops(posts, deletes)
    inbox = inbox_proof(bytes(BOB.signing_key.verify_key)).chat_id()
    seen = []
    for rnd in orders:
        shuffled = ops + rnd.sample(ops, k=len(ops) // 2)  # duplicates too
        rnd.shuffle(shuffled)
        with (
            tempfile.TemporaryDirectory() as tmp,
            ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=Path(tmp)) as db,
        ):
            replica = DbReplica(db)
            for at in range(0, len(shuffled), batch):
                replica.apply_ops(shuffled[at : at + batch])
            seen.append([m.msg_id for m, _ in kept_envelopes(db, inbox)])
    assert seen[0] == seen[1] == seen[2]  # the same envelopes, in the same order
    assert set(seen[0]) == expected  # the oracle: the gateways' posts no valid delete erased
