"""A node indexes the users it writes for (their user shards widen) and lets them go again:
kept across a restart and while no session handed them over, released once no served user,
R rule or unhanded write needs them — after the grace their index entries and identities
leave the disk and the trees, and the scope narrows (SYNC.md, "Leaving"; docs/design/member-scopes.md). A real node, real HTTP."""

from __future__ import annotations

from pathlib import Path

import trio

from client.e2e import UserKey
from node.gossip.settings import OPS_TOPIC
from node.gossip.topics import user_topic
from store.authz import new_group
from store.hlc import Hlc
from store.ops import MembershipAction, MembershipOp, make_identity
from sync.frames import Domain
from sync.scope import shard_of, user_shard_of

from node_support import b64, now_ms, ops_body, running_node

SHARDS = 16
ALICE = UserKey.from_seed(b"\x31" * 32)
BOB = UserKey.from_seed(b"\x32" * 32)
PROOF = new_group(ALICE.signing_key, b"user-shard-leave")
GROUP = PROOF.chat_id()


def add(user: UserKey, ms: int) -> MembershipOp:
    return MembershipOp.create(
        ALICE.signing_key, GROUP, user.user_id, MembershipAction.ADD, Hlc(ms), proof=PROOF
    )


async def test_a_user_shard_written_for_is_kept_until_handed_over_then_released_after_the_grace(
    tmp_path: Path,
) -> None:
    config = {
        "network_shards": SHARDS, "scope_shards": (shard_of(GROUP, SHARDS),),
        "scope_check_interval_s": 0.1, "gossip_sharded": True, "sync_interval_s": 1.0,
    }  # fmt: skip
    users = {user_shard_of(u.user_id, SHARDS) for u in (ALICE, BOB)}
    base = now_ms() - 60_000
    async with running_node(tmp_path, **config) as (node, http):  # a day's grace
        replica = node.services.replica
        assert (await http.post("/ops", json=ops_body(add(ALICE, base), add(BOB, base)))).status_code == 201  # fmt: skip
        alice = make_identity(ALICE.signing_key, ALICE.box_key, Hlc(base))
        put = await http.put(f"/identity/{ALICE.user_id.hex()}", json={"data": b64(alice.encode())})  # fmt: skip
        assert put.status_code in (200, 201), put.text
        assert replica.scope.user_shards == users

    # no peer to hand the writes over to: kept past the grace (a cut longer than the grace
    # would have lost the index entries: issue 33)
    async with running_node(tmp_path, **config, scope_grace_s=1.0) as (node, http):
        replica = node.services.replica
        assert replica.scope.user_shards == users  # persisted: the store holds their rows
        topics = {user_topic(OPS_TOPIC, s) for s in users}
        assert topics <= set(node.scopes.pubsub.raw.topic_ids)
        await trio.sleep(3.0)
        assert replica.scope.user_shards == users
        assert replica.tree(Domain.INDEX).count == 2 and replica.tree(Domain.IDENTITY).count == 1

    # a full peer keeps every user shard: a session hands them over, the grace ends them
    async with running_node(tmp_path / "h", sync_interval_s=1.0, network_shards=SHARDS) as (
        holder, _,
    ):  # fmt: skip
        address = f"{holder.listen_addrs[0]}/p2p/{holder.peer_id}"
        async with running_node(
            tmp_path, **config, scope_grace_s=1.0, bootstrap=(address,)
        ) as (node, http):  # fmt: skip
            replica = node.services.replica
            with trio.fail_after(60):
                while replica.scope.user_shards:
                    await trio.sleep(0.1)
            assert node.metrics.counter("scope_user_shards_handed_over") == len(users)
            held = holder.services.replica
            assert held.tree(Domain.INDEX).count == 2 and held.tree(Domain.IDENTITY).count == 1
            assert node.services.intake.scope == replica.scope
            assert not topics & set(node.scopes.pubsub.raw.topic_ids)  # left
            assert list(replica.db.member_index.iter_users()) == []
            assert replica.db.get_identity(ALICE.user_id) is None
            assert replica.tree(Domain.INDEX).count == 0
            assert replica.tree(Domain.IDENTITY).count == 0
            assert replica.tree(Domain.MEMBERS).count == 2  # the chat's ops stay: shard held
            # a new write indexes its user again, until handed over
            again = add(BOB, base + 1)
            assert (await http.post("/ops", json=ops_body(again))).status_code == 201
            assert replica.scope.user_shards == {user_shard_of(BOB.user_id, SHARDS)}
            assert {i for i, _ in replica.db.member_index.iter_users()} == {again.op_id}
