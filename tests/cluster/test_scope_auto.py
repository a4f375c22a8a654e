"""``--scope auto`` on real processes (SYNC.md, "Scopes"): a node serves the users naming it
as a home node, holds nothing of the chats they are not in, and joins a chat's shard (and
catches up on its history) when a served user is added to it."""

from __future__ import annotations

import time
from pathlib import Path

import base58
import pytest

from cluster.local import Cluster
from cluster.scenario import GROUP, Authors, wall_ms
from store import Hlc, MsgV1
from store.authz import new_group
from store.ops import MembershipAction, MembershipOp, make_identity
from store.signing import key_from_seed, public_key, user_id_from_key
from sync.scope import replica_shards, shard_of

pytestmark = pytest.mark.slow

SHARDS = 16
DANA_KEY = key_from_seed(b"\x5d" * 32)
DANA = user_id_from_key(public_key(DANA_KEY))


def other_group(authors: Authors) -> tuple[bytes, MembershipOp]:
    """A second group of author 1's, in another shard than GROUP's."""
    for n in range(100):
        proof = new_group(authors.keys[1], f"other-group-{n:04d}".encode())
        if shard_of(proof.chat_id(), SHARDS) != shard_of(GROUP, SHARDS):
            add = MembershipOp.create(
                authors.keys[1], proof.chat_id(), authors.ids[1], MembershipAction.ADD,
                authors.stamp(1), proof=proof,
            )  # fmt: skip
            return proof.chat_id(), add
    raise AssertionError("no other shard found")


def wait_for(check: object, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if check():  # type: ignore[operator]
            return time.monotonic() - t0
        time.sleep(0.2)
    raise TimeoutError(f"not within {timeout_s} s")


def test_an_auto_node_joins_the_chat_a_served_user_is_added_to(tmp_path: Path) -> None:
    authors = Authors(2)
    other, other_add = other_group(authors)
    with Cluster(
        2, tmp_path, sync_interval_s=1.0,
        node_config={
            "network_shards": SHARDS, "scope_check_interval_s": 0.2, "gossip_sharded": True,
        },
    ) as cluster:  # fmt: skip
        cluster.node_overrides[1] = {
            "scope_auto": True, "replication_factor": 0, "scope_grace_s": 3.0,
        }  # fmt: skip
        cluster.start()
        home = base58.b58decode(cluster.nodes[1].peer_id)
        cluster.post_ops(0, [*authors.joins, other_add])
        cluster.post_ops(0, authors.messages(150, "history"))
        other_msgs = [
            MsgV1.create(authors.keys[1], other, authors.stamp(1), f"o{i}".encode())
            for i in range(20)
        ]
        cluster.post_ops(0, other_msgs)
        # Dana puts her identity at her home node, which indexes her (and serves her from
        # then on); it reaches the full node; no chat's messages reach the auto node: Dana
        # is in none
        dana = make_identity(DANA_KEY, b"\x0d" * 32, Hlc(wall_ms()), [home])
        cluster.post_ops(1, [dana])
        wait_for(lambda: cluster.roots(0)["identity"] == cluster.roots(1)["identity"], 30)
        time.sleep(2.0)  # sessions and gossip had their chance
        assert cluster.roots(0)["messages"][1] == 170
        assert cluster.roots(1)["messages"][1] == 0

        add = MembershipOp.create(
            authors.keys[0], GROUP, DANA, MembershipAction.ADD, authors.stamp(0),
            proof=authors.joins[0].proof,  # type: ignore[union-attr]
        )  # fmt: skip
        cluster.post_ops(0, [add])
        wait_for(lambda: cluster.roots(1)["messages"][1] == 150, 60)  # GROUP's history
        time.sleep(2.0)
        assert cluster.roots(1)["messages"][1] == 150  # and nothing of the other shard
        metrics = cluster.http.get(f"{cluster.nodes[1].url}/metrics").text
        assert "scope_shards 1" in metrics and "served_users 1" in metrics

        # Dana leaves: after the grace period the shard's rows leave the auto node's disk
        remove = MembershipOp.create(
            DANA_KEY, GROUP, DANA, MembershipAction.LEAVE, Hlc(wall_ms()),
            proof=authors.joins[0].proof,  # type: ignore[union-attr]
        )  # fmt: skip
        cluster.post_ops(0, [remove])
        left = time.monotonic()
        wait_for(lambda: cluster.roots(1)["messages"][1] == 0, 60)
        assert time.monotonic() - left >= 2.5  # not before its grace (3 s)
        metrics = cluster.http.get(f"{cluster.nodes[1].url}/metrics").text
        assert "scope_shards 0" in metrics and "scope_shards_left_total 1" in metrics
        refused = _gauge(cluster, 1, "chatsync_refused_out_of_scope")
        cluster.post_ops(0, authors.messages(5, "after she left"))
        time.sleep(2.0)  # gossip and sessions had their chance: nothing of it comes back
        assert cluster.roots(1)["messages"][1] == 0 and cluster.roots(0)["messages"][1] == 175
        # not even offered: the shard's gossip topic was left with the shard
        assert _gauge(cluster, 1, "chatsync_refused_out_of_scope") == refused


def _gauge(cluster: Cluster, index: int, name: str) -> float:
    for line in cluster.http.get(f"{cluster.nodes[index].url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name}")


def test_a_peer_claiming_everything_gets_by_sync_only_the_chats_its_users_are_in(
    tmp_path: Path,
) -> None:
    """Scope authentication on node 0: node 1 (full: it claims every shard) is a home node of
    Dana, a member of GROUP only; what node 0's sessions give it is GROUP's history, not the
    other chat's. (Gossip is cut while the history is posted: it is not bounded — SECURITY.md.)"""
    authors = Authors(2)
    other, other_add = other_group(authors)
    with Cluster(
        2, tmp_path, sync_interval_s=1.0,
        node_config={"network_shards": SHARDS, "scope_check_interval_s": 0.2},
    ) as cluster:  # fmt: skip
        cluster.node_overrides[0] = {"scope_authenticate": True, "replication_factor": 0}
        cluster.start()
        home = base58.b58decode(cluster.nodes[1].peer_id)
        dana = make_identity(DANA_KEY, b"\x0d" * 32, Hlc(wall_ms()), [home])
        add = MembershipOp.create(
            authors.keys[0], GROUP, DANA, MembershipAction.ADD, authors.stamp(0),
            proof=authors.joins[0].proof,  # type: ignore[union-attr]
        )  # fmt: skip
        cluster.partition(1)
        cluster.post_ops(0, [*authors.joins, other_add, dana, add])
        cluster.post_ops(0, authors.messages(40, "history"))
        cluster.post_ops(0, [
            MsgV1.create(authors.keys[1], other, authors.stamp(1), f"o{i}".encode())
            for i in range(30)
        ])  # fmt: skip
        # gossip's message cache (a few heartbeats) would hand the newest over on reconnect:
        # wait it out, so that what node 1 gets is what sessions give it
        time.sleep(8.0)
        cluster.heal(1)
        wait_for(lambda: cluster.roots(1)["messages"][1] == 40, 60)
        # member ops follow their chat too: GROUP's, not the other chat's add
        wait_for(lambda: cluster.roots(1)["members"][1] == cluster.roots(0)["members"][1] - 1, 30)
        time.sleep(3.0)  # three sync intervals more: nothing of the other chat comes
        assert cluster.roots(1)["messages"][1] == 40 and cluster.roots(0)["messages"][1] == 70
        assert cluster.roots(1)["members"][1] == cluster.roots(0)["members"][1] - 1


def test_auto_nodes_take_their_shards_by_the_replication_rule(tmp_path: Path) -> None:
    """Three --scope auto nodes serving no one, R = 1 over 6 shards: once connected, each
    holds exactly its shards by ``replica_shards`` (every shard on one node), having
    released after the grace period what it took while it knew fewer peers."""
    with Cluster(
        3, tmp_path, sync_interval_s=1.0,
        node_config={
            "network_shards": 6, "scope_check_interval_s": 0.2, "scope_auto": True,
            "replication_factor": 1, "scope_grace_s": 1.0,
        },
    ) as cluster:  # fmt: skip
        cluster.start()
        ids = [base58.b58decode(n.peer_id) for n in cluster.nodes]
        expected = [len(replica_shards(node, ids, 1, 6)) for node in ids]
        assert sum(expected) == 6
        wait_for(
            lambda: [_gauge(cluster, i, "chatsync_scope_shards") for i in range(3)] == expected,
            60,
        )
