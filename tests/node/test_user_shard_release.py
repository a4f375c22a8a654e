"""A node indexes the users it writes for (their user shards widen) and lets them go again:
kept across a restart, released once no served user, R rule or recent write needs them —
after the grace their index entries and identities leave the disk and the trees, and the
scope narrows (SYNC.md, "Leaving"; docs/design/member-scopes.md). A real node, real HTTP."""

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


async def test_a_user_shard_written_for_is_kept_over_a_restart_and_released_after_the_grace(
    tmp_path: Path,
) -> None:
    config = {
        "network_shards": SHARDS, "scope_shards": (shard_of(GROUP, SHARDS),),
        "scope_check_interval_s": 0.1, "gossip_sharded": True,
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

    async with running_node(tmp_path, **config, scope_grace_s=1.0) as (node, http):
        replica = node.services.replica
        assert replica.scope.user_shards == users  # persisted: the store holds their rows
        topics = {user_topic(OPS_TOPIC, s) for s in users}
        assert topics <= set(node.scopes.pubsub.raw.topic_ids)
        assert replica.tree(Domain.INDEX).count == 2 and replica.tree(Domain.IDENTITY).count == 1
        with trio.fail_after(30):  # the grace restarts with the node: 1 s
            while replica.scope.user_shards:
                await trio.sleep(0.1)
        assert node.services.intake.scope == replica.scope
        assert not topics & set(node.scopes.pubsub.raw.topic_ids)  # left
        assert list(replica.db.member_index.iter_users()) == []
        assert replica.db.get_identity(ALICE.user_id) is None
        assert replica.tree(Domain.INDEX).count == 0 and replica.tree(Domain.IDENTITY).count == 0
        assert replica.tree(Domain.MEMBERS).count == 2  # the chat's ops stay: its shard is held
        # a new write indexes its user again, for another grace
        again = add(BOB, base + 1)
        assert (await http.post("/ops", json=ops_body(again))).status_code == 201
        assert replica.scope.user_shards == {user_shard_of(BOB.user_id, SHARDS)}
        assert {i for i, _ in replica.db.member_index.iter_users()} == {again.op_id}
