"""A client asking a node for a chat outside its scope gets 421 ``out_of_scope`` naming the
shard and nodes that hold it: the home nodes its members name, as far as the node's member
index knows them, then the R rule's holders (SYNC.md, "Scopes"). Against a real node over
real HTTP, and the naming rule on a real store."""

from __future__ import annotations

from pathlib import Path

from client.e2e import UserKey
from node.scope_answer import nodes_holding, nodes_holding_user
from store import ChatDb, ChatDbConfig
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
from sync.scope import holders, shard_of, user_shard_of

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


def remove(user: UserKey, ms: int) -> MembershipOp:
    return MembershipOp.create(
        ALICE.signing_key, GROUP, user.user_id, MembershipAction.REMOVE, Hlc(ms), proof=PROOF
    )


async def test_a_chat_outside_the_scope_is_answered_421_for_anyone(tmp_path: Path) -> None:
    """Messages, deletes and member ops follow the chat: every read and write of a chat
    outside the scope is 421 with its shard, member or not (membership is the holders' to
    tell), and nothing of it is written."""
    elsewhere = (shard_of(GROUP, SHARDS) + 1) % SHARDS
    async with running_node(tmp_path, network_shards=SHARDS, scope_shards=(elsewhere,)) as (
        _,
        http,
    ):
        base = now_ms() - 60_000
        bob_id = make_identity(BOB.signing_key, BOB.box_key, Hlc(base), [BOB_HOME])
        assert (await http.post("/ops", json=ops_body(bob_id))).status_code == 201  # global
        msg = MsgV1.create(ALICE.signing_key, GROUP, Hlc(base + 10), b"hi")
        for ops in ((add(ALICE, base), add(BOB, base)), (msg,)):
            r = await http.post("/ops", json=ops_body(*ops))
            assert r.status_code == 421 and r.json()["code"] == "out_of_scope", r.text
        stranger = UserKey.from_seed(b"\x29" * 32)
        for user in (ALICE, stranger):
            http.headers.update(await sign_in(http, user.signing_key))
            for what in ("messages", "deletes", "members", "member-ops", "proof"):
                r = await http.get(f"/chats/{GROUP.hex()}/{what}")
                assert r.status_code == 421, (what, r.text)
                body = r.json()
                assert body["code"] == "out_of_scope" and body["shard"] == shard_of(GROUP, SHARDS)
                assert body["holders"] == [] and GROUP.hex() in body["message"]  # none known


def test_the_holders_named_are_the_home_nodes_of_the_members_the_index_knows(
    tmp_path: Path,
) -> None:
    """A chat not held: its members' home nodes come from the member index (the users of
    the node's user shards), then the shard's holders by the R rule among known peers."""
    peer = b"\x00\x24some-known-peer"
    with ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=tmp_path / "db") as db:
        base = now_ms() - 60_000
        db.apply_ops([make_identity(BOB.signing_key, BOB.box_key, Hlc(base), [BOB_HOME])])

        def named(r: int) -> list[bytes]:
            return nodes_holding(
                GROUP, db.reads, own=b"me", known=[peer], replication_factor=r, num_shards=SHARDS
            )

        assert named(0) == []  # no index entry of the chat: no member known
        db.member_index.put([add(BOB, base)])
        assert named(0) == [BOB_HOME]
        assert named(3) == [BOB_HOME, peer]  # the R rule among {peer, me}, ourselves left out
        db.member_index.put([remove(BOB, base + 1)])
        assert named(0) == []  # removed: no longer a member


async def test_a_chat_in_the_scope_is_served_and_its_member_ops_indexed(tmp_path: Path) -> None:
    """Served as before; and the node indexes what it writes: a member op naming a user of
    a user shard it did not index widens its index first (so sessions carry the op to the
    shard's other holders even if gossip loses it)."""
    async with running_node(
        tmp_path, network_shards=SHARDS, scope_shards=(shard_of(GROUP, SHARDS),)
    ) as (node, http):
        replica = node.services.replica
        assert replica.scope.user_shards == frozenset()  # a fixed scope indexes no one
        base = now_ms() - 60_000
        msg = MsgV1.create(ALICE.signing_key, GROUP, Hlc(base + 10), b"hi")
        ops = (add(ALICE, base), add(BOB, base), msg)
        assert (await http.post("/ops", json=ops_body(*ops))).status_code == 201
        http.headers.update(await sign_in(http, ALICE.signing_key))
        r = await http.get(f"/chats/{GROUP.hex()}/messages")
        assert r.status_code == 200 and len(r.json()["messages"]) == 1
        users = {user_shard_of(u.user_id, SHARDS) for u in (ALICE, BOB)}
        assert replica.scope.user_shards == users and node.services.intake.scope == replica.scope
        indexed = {user for _, user in replica.db.member_index.iter_users()}
        assert indexed == {ALICE.user_id, BOB.user_id}


async def test_a_users_identity_is_held_by_the_nodes_indexing_the_user(tmp_path: Path) -> None:
    """Identities follow their user's user shard: one a client puts widens the node's index
    to its user first (the node indexes what it writes); one arriving from a peer for a
    user the node does not index is refused, and nothing of it is stored."""
    async with running_node(
        tmp_path, network_shards=SHARDS, scope_shards=(shard_of(GROUP, SHARDS),)
    ) as (node, http):
        replica = node.services.replica
        assert replica.scope.user_shards == frozenset()
        base = now_ms() - 60_000
        alice = make_identity(ALICE.signing_key, ALICE.box_key, Hlc(base))
        path = f"/identity/{ALICE.user_id.hex()}"
        put = await http.put(path, json={"data": b64(alice.encode())})
        assert put.status_code in (200, 201), put.text
        assert replica.scope.user_shards == {user_shard_of(ALICE.user_id, SHARDS)}
        assert (await http.get(path)).status_code == 200
        # a peer's identity of a user of another user shard: refused, not stored
        bob = make_identity(BOB.signing_key, BOB.box_key, Hlc(base))
        assert not replica.scope.indexes_user(BOB.user_id)
        refused = replica.refused_out_of_scope
        assert replica.apply_ops([bob]).new == [False]
        assert replica.refused_out_of_scope == refused + 1
        assert replica.db.get_identity(BOB.user_id) is None
        # and a client asking for it is told where to go, not that it does not exist
        r = await http.get(f"/identity/{BOB.user_id.hex()}")
        assert r.status_code == 421, r.text
        body = r.json()
        assert body["code"] == "out_of_scope" and body["holders"] == []  # no peer: R rule empty
        assert body["shard"] == user_shard_of(BOB.user_id, SHARDS)


def test_a_users_holders_are_named_by_the_replication_rule_over_user_shards() -> None:
    peers = [bytes([0x30 + i]) * 20 for i in range(6)]
    shard = user_shard_of(BOB.user_id, SHARDS)
    want = holders(shard, [*peers, b"me"], 3, SHARDS)
    named = nodes_holding_user(
        BOB.user_id, own=b"me", known=peers, replication_factor=3, num_shards=SHARDS
    )
    assert named == [n for n in want if n != b"me"] and len(named) >= 2
    assert not nodes_holding_user(
        BOB.user_id, own=b"me", known=peers, replication_factor=0, num_shards=SHARDS
    )


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
