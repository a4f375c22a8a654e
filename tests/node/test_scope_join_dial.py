"""A ``--scope auto`` node joining a chat no connected peer holds dials a holder it knows of
(SYNC.md, "Joining"): three real nodes on 127.0.0.1, real libp2p. J (auto, serving Dana) is
connected only to M, which holds another shard; H (full) holds the chat and is known to J
only by peer exchange (M told it). Dana is added to the chat at H; J learns it through M (M
indexes Dana's user shard), widens its scope, finds no connected holder, dials H — named by
the home node of Erin, a member of the chat in Dana's user shard — and its ordinary sessions
with H fill the chat: J ends holding the chat's messages, the same as H's, and nothing of
another chat H holds. Without the dial J never catches up (no connection to H: both run at
their low water mark, and nothing else dials)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import trio

from client.e2e import UserKey
from node.node import RunningNode
from store.authz import GroupProof, new_group
from store.hlc import Hlc
from store.ops import MembershipAction, MembershipOp, Op, make_identity
from store.records import MsgV1
from sync.frames import Domain
from sync.scope import shard_of, user_shard_of

from node_support import b64, now_ms, ops_body, running_node, sign_in

SHARDS = 16
ALICE = UserKey.from_seed(b"\x61" * 32)
DANA = UserKey.from_seed(b"\x64" * 32)
# a member of the chat in Dana's user shard, whose home node is the holder: J, indexing Dana's
# user shard, learns from Erin's identity where the chat is held
ERIN = next(
    k
    for n in range(10_000)
    if user_shard_of((k := UserKey.from_seed(b"e%031d" % n)).user_id, SHARDS)
    == user_shard_of(DANA.user_id, SHARDS)
    and k.user_id != DANA.user_id
)
M_SHARD = 0  # the middle node's one shard: not the chat's
PROOF = next(
    p
    for n in range(10_000)
    if shard_of((p := new_group(ALICE.signing_key, b"join-%011d" % n)).chat_id(), SHARDS)
    not in (M_SHARD,)
)
CHAT = PROOF.chat_id()
OTHER_PROOF = next(
    p
    for n in range(10_000)
    if shard_of((p := new_group(ALICE.signing_key, b"othr-%011d" % n)).chat_id(), SHARDS)
    not in (M_SHARD, shard_of(CHAT, SHARDS))
)
MESSAGES = 40
COMMON = {
    "network_shards": SHARDS, "replication_factor": 0, "scope_check_interval_s": 0.2,
    "sync_interval_s": 1.0, "gossip_sharded": True,
}  # fmt: skip
# at their low water mark with one connection, and no turnover: nobody dials anyone else
# (J's exchange every second, to hear of H; H's once an hour, so it never turns over to J)
J_PEERS = {"peers_low": 1, "peers_high": 1, "peer_exchange_interval_s": 1.0}
H_PEERS = {"peers_low": 1, "peers_high": 1, "peer_exchange_interval_s": 3600.0}


async def _until(done: Callable[[], bool], timeout_s: float = 60.0) -> None:
    with trio.fail_after(timeout_s):
        while not done():
            await trio.sleep(0.1)


async def _post(http: httpx.AsyncClient, *ops: Op) -> None:
    r = await http.post("/ops", json=ops_body(*ops))
    assert r.status_code == 201, r.text


async def _put_identity(http: httpx.AsyncClient, user: UserKey, home: bytes, ms: int) -> None:
    record = make_identity(user.signing_key, user.box_key, Hlc(ms), [home])
    r = await http.put(f"/identity/{user.user_id.hex()}", json={"data": b64(record.encode())})
    assert r.status_code in (200, 201), r.text


def _add(user: UserKey, ms: int, proof: GroupProof = PROOF) -> MembershipOp:
    return MembershipOp.create(
        ALICE.signing_key, proof.chat_id(), user.user_id, MembershipAction.ADD, Hlc(ms),
        proof=proof,
    )  # fmt: skip


async def _history(http: httpx.AsyncClient) -> list[str]:
    r = await http.get(f"/chats/{CHAT.hex()}/messages", params={"limit": 200})
    assert r.status_code == 200, r.text
    return sorted(m["id"] for m in r.json()["messages"])


def _metric(node: RunningNode, name: str, **labels: str) -> float:
    return node.metrics.counter(name, **labels)


async def test_a_node_joining_a_chat_no_connected_peer_holds_dials_a_known_holder(
    tmp_path: Path,
) -> None:
    base = now_ms() - 60_000
    async with running_node(tmp_path / "m", **COMMON, scope_shards=(M_SHARD,)) as (m, m_http):
        m_address = f"{m.listen_addrs[0]}/p2p/{m.peer_id}"
        async with running_node(tmp_path / "h", **COMMON, **H_PEERS, bootstrap=(m_address,)) as (
            h,
            h_http,
        ):
            h_id = h.p2p_host.peer_id.to_bytes()
            await _post(h_http, _add(ALICE, base), _add(ERIN, base + 1))
            await _post(h_http, _add(ALICE, base, OTHER_PROOF))
            await _put_identity(h_http, ERIN, h_id, base)
            msgs = [
                MsgV1.create(ALICE.signing_key, CHAT, Hlc(base + 10 + i), b"m%d" % i)
                for i in range(MESSAGES)
            ]
            others = [
                MsgV1.create(ALICE.signing_key, OTHER_PROOF.chat_id(), Hlc(base + 10 + i), b"o")
                for i in range(10)
            ]
            await _post(h_http, *msgs, *others)
            entry = m.peers.book.peers
            await _until(lambda: h.peer_id in entry and entry[h.peer_id].tried)
            # H asked M for peers before J exists: it never hears of J, never turns over to it
            await _until(lambda: h.peers._next_exchange > trio.current_time() + 60)
            async with running_node(
                tmp_path / "j", **COMMON, **J_PEERS, scope_auto=True, bootstrap=(m_address,)
            ) as (j, j_http):
                j_id = j.p2p_host.peer_id.to_bytes()
                # Dana names J as her home node; M indexes her user shard too (it writes for her)
                await _put_identity(j_http, DANA, j_id, base)
                await _put_identity(m_http, DANA, j_id, base)
                await _until(lambda: h.peer_id in j.peers.known())
                assert j.peers.connected() == [m.peer_id]  # J never reached H
                users = j.services.replica
                await _until(lambda: users.scope.holds_user_shard(user_shard_of(ERIN.user_id, SHARDS)))  # fmt: skip
                await _until(lambda: users.db.get_identity(ERIN.user_id) is not None)
                assert not users.scope.holds_chat(CHAT)

                await _post(h_http, _add(DANA, base + 2))  # Dana joins: J must follow
                await _until(lambda: users.scope.holds_chat(CHAT))
                assert not m.services.replica.scope.holds_chat(CHAT)  # M never held it
                await _until(lambda: users.tree(Domain.MESSAGES).count >= MESSAGES, 90)

                j_http.headers.update(await sign_in(j_http, DANA.signing_key))
                h_http.headers.update(await sign_in(h_http, DANA.signing_key))
                held = await _history(j_http)
                assert len(held) == MESSAGES and held == await _history(h_http)
                assert users.tree(Domain.MESSAGES).count == MESSAGES  # the other chat: none
                assert not users.scope.holds_chat(OTHER_PROOF.chat_id())
                # (counted once identify answered: H's own sessions may have filled J by then)
                await _until(lambda: _metric(j, "scope_join_dials", result="connected") == 1)
                assert _metric(j, "scope_join_dials", result="failed") == 0
                await _until(lambda: _metric(j, "scope_joins", result="caught_up") == 1)
