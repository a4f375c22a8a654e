"""A client asking a node for a chat outside its scope gets 421 ``out_of_scope`` naming the
shard and nodes that hold it: the home nodes its members name (SYNC.md, "Scopes"). Against a
real node over real HTTP."""

from __future__ import annotations

from pathlib import Path

import base58

from client.e2e import UserKey
from store.authz import new_group
from store.hlc import Hlc
from store.ops import (
    IdentityDoc,
    MembershipAction,
    MembershipOp,
    decode_identity_doc,
    make_identity,
)
from store.records import IdentityRecord, MsgV1, canonical_cbor
from sync.scope import shard_of

from node_support import b64, now_ms, ops_body, running_node, sign_in

SHARDS = 16
ALICE = UserKey.from_seed(b"\x21" * 32)
BOB = UserKey.from_seed(b"\x22" * 32)
PROOF = new_group(ALICE.signing_key, b"scope-answer-grp")
GROUP = PROOF.chat_id()
BOB_HOME = b"\x00\x24bob-home-node-peer-id"  # the bytes of a peer id (any, for the test)


def add(user: UserKey, ms: int) -> MembershipOp:
    return MembershipOp.create(
        ALICE.signing_key, GROUP, user.user_id, MembershipAction.ADD, Hlc(ms), proof=PROOF
    )


async def test_a_chat_outside_the_scope_is_answered_421_naming_its_holders(
    tmp_path: Path,
) -> None:
    elsewhere = (shard_of(GROUP, SHARDS) + 1) % SHARDS
    async with running_node(tmp_path, network_shards=SHARDS, scope_shards=(elsewhere,)) as (
        _,
        http,
    ):
        base = now_ms() - 60_000
        bob_id = make_identity(BOB.signing_key, BOB.box_key, Hlc(base), [BOB_HOME])
        r = await http.post("/ops", json=ops_body(add(ALICE, base), add(BOB, base), bob_id))
        assert r.status_code == 201, r.text  # member ops and identities are global: held
        http.headers.update(await sign_in(http, ALICE.signing_key))
        expected_holders = [base58.b58encode(BOB_HOME).decode()]

        for path in (f"/chats/{GROUP.hex()}/messages", f"/chats/{GROUP.hex()}/deletes"):
            r = await http.get(path)
            assert r.status_code == 421, (path, r.text)
            body = r.json()
            assert body["code"] == "out_of_scope" and body["shard"] == shard_of(GROUP, SHARDS)
            assert body["holders"] == expected_holders and GROUP.hex() in body["message"]

        msg = MsgV1.create(ALICE.signing_key, GROUP, Hlc(base + 10), b"hi")
        r = await http.post("/ops", json=ops_body(msg))
        assert r.status_code == 421 and r.json()["holders"] == expected_holders

        r = await http.get(f"/chats/{GROUP.hex()}/members")  # global: answered here
        assert r.status_code == 200 and len(r.json()["members"]) == 2

        stranger = UserKey.from_seed(b"\x29" * 32)
        http.headers.update(await sign_in(http, stranger.signing_key))
        r = await http.get(f"/chats/{GROUP.hex()}/messages")
        assert (r.status_code, r.json()["code"]) == (403, "not_a_member")  # no answer to guess


async def test_a_chat_in_the_scope_is_served_as_before(tmp_path: Path) -> None:
    async with running_node(
        tmp_path, network_shards=SHARDS, scope_shards=(shard_of(GROUP, SHARDS),)
    ) as (_, http):
        base = now_ms() - 60_000
        msg = MsgV1.create(ALICE.signing_key, GROUP, Hlc(base + 10), b"hi")
        assert (await http.post("/ops", json=ops_body(add(ALICE, base), msg))).status_code == 201
        http.headers.update(await sign_in(http, ALICE.signing_key))
        r = await http.get(f"/chats/{GROUP.hex()}/messages")
        assert r.status_code == 200 and len(r.json()["messages"]) == 1


async def test_a_forged_or_oversized_home_node_list_is_refused_by_the_api(tmp_path: Path) -> None:
    """PUT /identity: a home-node list not signed by the user (swapped after signing), or
    longer than 8, is refused and nothing is written."""
    async with running_node(tmp_path) as (_, http):
        good = make_identity(BOB.signing_key, BOB.box_key, Hlc(now_ms()), [BOB_HOME])
        doc: IdentityDoc = decode_identity_doc(good.blob)
        swapped = canonical_cbor([2, doc.sign_key, doc.box_key, [b"\x00\x24thief"], doc.sig])
        nine = canonical_cbor(
            [2, doc.sign_key, doc.box_key, [bytes([i]) for i in range(9)], doc.sig]
        )
        path = f"/identity/{BOB.user_id.hex()}"
        for blob, status in ((swapped, 422), (nine, 413)):
            forged = IdentityRecord(BOB.user_id, good.hlc, blob)
            r = await http.put(path, json={"data": b64(forged.encode())})
            assert r.status_code == status, r.text
        assert (await http.get(path)).status_code == 404  # nothing written
        r = await http.put(path, json={"data": b64(good.encode())})
        assert r.status_code in (200, 201), r.text
