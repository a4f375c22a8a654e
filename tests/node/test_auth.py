"""Who may call what (node/auth.py, node/api/auth.py): sign-in with a key, tokens, the admin
token. The rules alone (a clock and randomness given), then a real node over HTTP: every
forged, replayed, expired, malformed or misdirected credential gets its 401/403 code, nothing
is read or written for it, and the node serves on."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest
import trio

from client.e2e import UserKey
from node.auth import ADMIN_FILE, SECRET_FILE, Authenticator, AuthRefused, load_or_create_secrets
from store.authz import new_group
from store.hlc import Hlc
from store.ops import MembershipAction, MembershipOp
from store.records import MsgV1

from node_support import b64, now_ms, ops_body, running_node, sign_in

ALICE = UserKey.from_seed(b"\x21" * 32)
BOB = UserKey.from_seed(b"\x22" * 32)
GROUP = new_group(ALICE.signing_key, b"auth-tests-group")


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


def authenticator(clock: Clock, node: bytes = b"node-a") -> Authenticator:
    return Authenticator(b"s" * 32, node, now_ms=clock, token_ttl_s=60, max_pending=3)


def signed(auth: Authenticator, key: UserKey, device: str = "phone") -> tuple[str, bytes]:
    challenge = auth.challenge(key.user_id).data
    public = bytes(key.signing_key.verify_key)
    token, _ = auth.sign_in(
        key.user_id, public, challenge, key.signing_key.sign(challenge).signature, device
    )
    return token, challenge


def refusal(call: object) -> tuple[int, str]:
    with pytest.raises(AuthRefused) as refused:
        call()  # type: ignore[operator]
    return refused.value.status, refused.value.code


def test_a_signed_challenge_gives_a_token_good_until_it_expires() -> None:
    clock = Clock()
    auth = authenticator(clock)
    token, _ = signed(auth, ALICE)
    who = auth.verify(token)
    assert (who.user_id, who.device) == (ALICE.user_id, "phone")
    clock.ms += 59_999
    assert auth.verify(token).user_id == ALICE.user_id
    clock.ms += 1
    assert refusal(lambda: auth.verify(token)) == (401, "token_expired")


def test_forged_replayed_and_misdirected_sign_ins_are_refused() -> None:
    clock = Clock()
    auth, other_node = authenticator(clock), authenticator(clock, b"node-b")
    public = bytes(ALICE.signing_key.verify_key)
    sign = ALICE.signing_key.sign
    _, used = signed(auth, ALICE)
    assert refusal(
        lambda: auth.sign_in(ALICE.user_id, public, used, sign(used).signature, "x")
    ) == (
        401,
        "challenge_unknown",
    )  # good once
    theirs = other_node.challenge(ALICE.user_id).data
    assert refusal(
        lambda: auth.sign_in(ALICE.user_id, public, theirs, sign(theirs).signature, "x")
    ) == (401, "wrong_node")
    mine = auth.challenge(ALICE.user_id).data
    bob_key = bytes(BOB.signing_key.verify_key)
    bob_signs = BOB.signing_key.sign(mine).signature
    assert refusal(lambda: auth.sign_in(ALICE.user_id, bob_key, mine, bob_signs, "x")) == (
        401,
        "wrong_key",
    )
    assert refusal(lambda: auth.sign_in(ALICE.user_id, public, mine, bob_signs, "x")) == (
        401,
        "bad_signature",
    )
    assert refusal(lambda: auth.sign_in(BOB.user_id, bob_key, mine, bob_signs, "x")) == (
        401,
        "bad_challenge",
    )  # Alice's challenge
    clock.ms += 60_001
    assert refusal(
        lambda: auth.sign_in(ALICE.user_id, public, mine, sign(mine).signature, "x")
    ) == (401, "challenge_expired")
    assert refusal(lambda: auth.sign_in(ALICE.user_id, public, b"short", b"", "x")) == (
        401,
        "bad_challenge",
    )


def test_tampered_and_malformed_tokens_are_refused_and_pending_sign_ins_are_bounded() -> None:
    clock = Clock()
    auth = authenticator(clock)
    token, _ = signed(auth, ALICE)
    raw = bytearray(base64.urlsafe_b64decode(token))
    raw[0] ^= 1  # another user, the same MAC
    for bad in (
        base64.urlsafe_b64encode(bytes(raw)).decode(),
        token[:-2] + ("AA" if token[-2:] != "AA" else "BB"),
        "",
        "%%%",
        "x" * 10_000,
        signed(authenticator(clock, b"node-b"), ALICE)[0],  # another node's
    ):
        assert refusal(lambda bad=bad: auth.verify(bad)) == (401, "bad_token")
    for _ in range(3):
        auth.challenge(BOB.user_id)
    assert refusal(lambda: auth.challenge(BOB.user_id)) == (503, "busy")
    clock.ms += 60_001  # the expired ones make room
    auth.challenge(BOB.user_id)


def test_the_secrets_are_made_once_and_only_the_owner_reads_them(tmp_path: Path) -> None:
    secret, admin = load_or_create_secrets(tmp_path)
    assert load_or_create_secrets(tmp_path) == (secret, admin)
    for name in (SECRET_FILE, ADMIN_FILE):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o600


async def test_over_http_only_the_user_and_the_members_read_and_only_the_admin_blocks(
    tmp_path: Path,
) -> None:
    async with running_node(tmp_path) as (node, http):
        base = now_ms() - 60_000
        add = MembershipOp.create(
            ALICE.signing_key, GROUP.chat_id(), ALICE.user_id, MembershipAction.ADD, Hlc(base),
            proof=GROUP,
        )  # fmt: skip
        assert (await http.post("/ops", json=ops_body(add))).status_code == 201
        alice = await sign_in(http, ALICE.signing_key)
        bob = await sign_in(http, BOB.signing_key)
        chat, user = GROUP.chat_id().hex(), ALICE.user_id.hex()
        protected = [
            f"/users/{user}/chats", f"/users/{user}/chats/{chat}/read", f"/users/{user}/events",
            f"/users/{user}/delivery", f"/chats/{chat}/messages", f"/chats/{chat}/members",
        ]  # fmt: skip
        for path in protected:
            assert (await http.get(path)).json()["code"] == "no_token", path
            r = await http.get(path, headers={"authorization": "Bearer nonsense"})
            assert (r.status_code, r.json()["code"]) == (401, "bad_token"), path
            r = await http.get(path, headers=bob)
            assert r.status_code == 403 and r.json()["code"] in ("wrong_user", "not_a_member")
            assert (await http.get(path, headers=alice)).status_code == 200, path
        r = await http.get(f"/chats/{chat}/proof")  # open: a client signs member ops with it
        assert r.status_code == 200
        admin = (Path(node.config.data) / ADMIN_FILE).read_text().strip()
        block = {"peer_id": "QmNobody"}
        r = await http.post("/admin/block", json=block)
        assert (r.status_code, r.json()["code"]) == (401, "no_token")
        r = await http.post("/admin/block", json=block, headers=alice)
        assert (r.status_code, r.json()["code"]) == (403, "not_admin")
        r = await http.post(
            "/admin/block", json=block, headers={"authorization": f"Bearer {admin}"}
        )
        assert r.status_code == 200 and r.json()["blocked"] == ["QmNobody"]
        r = await http.get("/debug/latency")
        assert r.status_code == 401
        # sign-in over HTTP: a replayed challenge, a bad body
        got = (await http.post("/auth/challenge", json={"user_id": user})).json()["challenge"]
        body = {
            "user_id": user, "public_key": bytes(ALICE.signing_key.verify_key).hex(),
            "challenge": got,
            "signature": b64(ALICE.signing_key.sign(base64.urlsafe_b64decode(got)).signature),
        }  # fmt: skip
        assert (await http.post("/auth/token", json=body)).status_code == 200
        r = await http.post("/auth/token", json=body)
        assert (r.status_code, r.json()["code"]) == (401, "challenge_unknown")
        r = await http.post("/auth/token", json={**body, "public_key": "zz"})
        assert (r.status_code, r.json()["code"]) == (400, "bad_id")
        metrics = (await http.get("/metrics")).text
        assert (await http.get("/health")).json() == {"status": "ok"}
    for code in ("no_token", "bad_token", "wrong_user", "not_admin", "challenge_unknown"):
        assert f'code="{code}"' in metrics


async def test_events_page_on_while_posts_go_on_and_a_foreign_token_is_gone(
    tmp_path: Path,
) -> None:
    async with running_node(tmp_path) as (_, http):
        base = now_ms() - 60_000
        chat = GROUP.chat_id()
        add = MembershipOp.create(
            ALICE.signing_key, chat, ALICE.user_id, MembershipAction.ADD, Hlc(base), proof=GROUP
        )
        assert (await http.post("/ops", json=ops_body(add))).status_code == 201
        alice = await sign_in(http, ALICE.signing_key)
        url = f"/users/{ALICE.user_id.hex()}/events"
        posted: list[str] = []
        seen: list[str] = []
        since = None
        for n in range(12):
            msg = MsgV1.create(ALICE.signing_key, chat, Hlc(base + 10 + n), b"%d" % n)
            assert (await http.post("/ops", json=ops_body(msg))).status_code == 201
            posted.append(msg.msg_id.hex())
            params = {"limit": 2} | ({} if since is None else {"since": since})
            page = (await http.get(url, params=params, headers=alice)).json()
            seen += [e["message"]["id"] for e in page["events"] if e["type"] == "message"]
            since = page["next"]
        while True:
            page = (await http.get(url, params={"since": since}, headers=alice)).json()
            if page["next"] == since:
                break
            seen += [e["message"]["id"] for e in page["events"] if e["type"] == "message"]
            since = page["next"]
        assert seen == posted  # each once, in commit order
        foreign = b64(b"\x00" * 8 + (1).to_bytes(8, "big"))
        r = await http.get(url, params={"since": foreign}, headers=alice)
        assert (r.status_code, r.json()["code"]) == (410, "foreign_token")
        raw = base64.urlsafe_b64decode(since + "=" * (-len(since) % 4))
        ahead = b64(raw[:8] + (10**6).to_bytes(8, "big"))
        r = await http.get(url, params={"since": ahead}, headers=alice)
        assert (r.status_code, r.json()["code"]) == (410, "unknown_position")
        r = await http.get(url, params={"since": "!!"}, headers=alice)
        assert (r.status_code, r.json()["code"]) == (400, "bad_since")


async def test_an_expired_token_gets_nothing_and_a_new_sign_in_does(tmp_path: Path) -> None:
    async with running_node(tmp_path, token_ttl_s=1) as (_, http):
        alice = await sign_in(http, ALICE.signing_key)
        url = f"/users/{ALICE.user_id.hex()}/chats"
        assert (await http.get(url, headers=alice)).status_code == 200
        await trio.sleep(1.1)
        r = await http.get(url, headers=alice)
        assert (r.status_code, r.json()["code"]) == (401, "token_expired")
        assert (
            await http.get(url, headers=await sign_in(http, ALICE.signing_key))
        ).status_code == 200
