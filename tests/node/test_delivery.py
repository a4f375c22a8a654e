"""A message's delivery per recipient (RFC-0005's PENDING -> DELIVERED -> READ): pending until
a device of theirs acknowledges it on this node's stream, delivered then (per device), read
once their signed receipt reaches it."""

from __future__ import annotations

import json
from pathlib import Path

import trio
import trio_websocket

from client.e2e import UserKey
from store.authz import new_group
from store.hlc import Hlc
from store.ops import MembershipAction, MembershipOp
from store.records import MessageKind, MsgV1

from node_support import b64, now_ms, ops_body, running_node, sign_in

ALICE = UserKey.from_seed(b"\x31" * 32)
BOB = UserKey.from_seed(b"\x32" * 32)
CAROL = UserKey.from_seed(b"\x33" * 32)
GROUP = new_group(ALICE.signing_key, b"delivery-tests!!")


async def test_pending_then_delivered_to_a_device_then_read(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (_, http):
        base = now_ms() - 60_000
        chat = GROUP.chat_id()
        adds = [
            MembershipOp.create(
                ALICE.signing_key, chat, u.user_id, MembershipAction.ADD, Hlc(base), proof=GROUP
            )
            for u in (ALICE, BOB, CAROL)
        ]
        msg = MsgV1.create(ALICE.signing_key, chat, Hlc(base + 10), b"did you get this?")
        assert (await http.post("/ops", json=ops_body(*adds, msg))).status_code == 201
        alice = await sign_in(http, ALICE.signing_key)
        url = f"/chats/{chat.hex()}/messages/{msg.msg_id.hex()}/delivery"

        async def states() -> dict[str, tuple[str, dict[str, bool]]]:
            r = await http.get(url, headers=alice)
            assert r.status_code == 200, r.text
            return {x["user_id"]: (x["state"], x["devices"]) for x in r.json()["recipients"]}

        bob, carol = BOB.user_id.hex(), CAROL.user_id.hex()
        assert await states() == {bob: ("pending", {}), carol: ("pending", {})}  # not the sender
        token = (await sign_in(http, BOB.signing_key, device="phone"))["authorization"][7:]
        ws_url = (
            str(http.base_url).replace("http", "ws") + f"/users/{bob}/stream?access_token={token}"
        )
        async with trio_websocket.open_websocket_url(ws_url) as ws:
            frame = json.loads(await ws.get_message())
            assert msg.msg_id.hex() in [e["message"]["id"] for e in frame["events"] if e["message"]]
            assert (await states())[bob] == ("pending", {})  # pushed, not acknowledged
            await ws.send_message(json.dumps({"ack": frame["next"]}))
            for _ in range(50):
                if (await states())[bob][0] == "delivered":
                    break
                await trio.sleep(0.05)
        assert await states() == {bob: ("delivered", {"phone": True}), carol: ("pending", {})}
        receipt = MsgV1.create(
            BOB.signing_key, chat, Hlc(base + 20), msg.hlc.to_bytes(),
            kind=MessageKind.READ_RECEIPT, ref=msg.msg_id,
        )  # fmt: skip
        bob_headers = await sign_in(http, BOB.signing_key)
        r = await http.put(
            f"/users/{bob}/chats/{chat.hex()}/read",
            json={"receipt": b64(receipt.encoded)}, headers=bob_headers,
        )  # fmt: skip
        assert r.status_code == 200, r.text
        assert (await states())[bob] == ("read", {"phone": True})
        r = await http.get(
            url, headers=await sign_in(http, UserKey.from_seed(b"\x34" * 32).signing_key)
        )
        assert (r.status_code, r.json()["code"]) == (403, "not_a_member")
