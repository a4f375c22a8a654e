"""The 421 answer names holders among the peers a node knows, not only those it is connected
to (SYNC.md, "Replication factor"): three real nodes on 127.0.0.1, A connected only to B, C
connected to B; A hears of C by peer exchange, and a chat whose shard C holds by the R rule
(R = 1) is answered by A with C first — over its connections alone A would name B. And the
views are bounded, whatever a flood of peer records does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import base58
import trio

from client.e2e import UserKey
from node.scope_answer import MAX_NAMED, nodes_holding_user
from store.authz import new_group
from sync.peering import HEARD_MAX, HEARD_PER_SOURCE, TRIED_MAX, PeerBook
from sync.scope import holders, shard_of, user_shard_of

from node_support import running_node, sign_in

SHARDS = 32
ALICE = UserKey.from_seed(b"\x41" * 32)
FEW = {"peers_low": 1, "peers_high": 1, "peer_exchange_interval_s": 1.0}


async def _until(done: Callable[[], bool], timeout_s: float = 20.0) -> None:
    with trio.fail_after(timeout_s):
        while not done():
            await trio.sleep(0.1)


async def test_a_node_connected_to_one_peer_names_a_holder_it_only_heard_of(
    tmp_path: Path,
) -> None:
    common = {"network_shards": SHARDS, "replication_factor": 1, "scope_check_interval_s": 0.2}
    async with running_node(tmp_path / "b", **common) as (b, _):
        b_address = f"{b.listen_addrs[0]}/p2p/{b.peer_id}"
        async with running_node(
            tmp_path / "c", **common, **FEW, scope_auto=True, bootstrap=(b_address,)
        ) as (c, _):
            entry = b.peers.book.peers
            await _until(lambda: c.peer_id in entry and entry[c.peer_id].tried)
            async with running_node(
                tmp_path / "a", **common, **FEW, scope_shards=(0,), bootstrap=(b_address,)
            ) as (a, http):
                await _until(lambda: c.peer_id in a.peers.known())
                assert a.peers.connected() == [b.peer_id]  # A never reached C itself
                assert c.peer_id not in a.peers.reached()
                ids = [base58.b58decode(n.peer_id) for n in (a, b, c)]
                c_shards = [s for s in range(1, SHARDS) if holders(s, ids, 1, SHARDS) == (ids[2],)]
                assert c_shards, "C holds some shard by the R rule (1 in 10^5 it does not)"
                proof = next(
                    p
                    for n in range(10_000)
                    if shard_of((p := new_group(ALICE.signing_key, b"%016d" % n)).chat_id(), SHARDS)
                    == c_shards[0]
                )
                chat = proof.chat_id()
                await _until(lambda: c.services.replica.scope.holds_chat(chat))
                http.headers.update(await sign_in(http, ALICE.signing_key))
                r = await http.get(f"/chats/{chat.hex()}/messages")
                assert r.status_code == 421, r.text
                named = r.json()["holders"]
                assert named[0] == c.peer_id  # the R rule over what A knows
                # then the rule over what it reached ({A, B}: B, or A itself, left out)
                assert set(named[1:]) <= {b.peer_id}
                # a user of a user shard C holds by the rule: its identity's holders, too
                user = next(
                    u
                    for seed in range(10_000)
                    if holders(
                        user_shard_of((u := UserKey.from_seed(b"%032d" % seed)).user_id, SHARDS),
                        ids, 1, SHARDS,
                    ) == (ids[2],)
                )  # fmt: skip
                r = await http.get(f"/identity/{user.user_id.hex()}")
                assert r.status_code == 421 and r.json()["holders"][0] == c.peer_id, r.text


def test_a_flood_of_peer_records_leaves_the_views_bounded() -> None:
    """Hearsay from 100 tellers of 200 peers each: the book (and so the 421's view)
    stays within its bounds, the keeper's view (peers reached lately) gets none of it, and
    an answer names at most ``MAX_NAMED`` nodes."""
    book = PeerBook("me")
    for peer in range(300):
        book.connected(f"reached-{peer}", [f"/ip4/10.0.0.1/tcp/{peer}"], now_ms=1_000)
    for teller in range(100):
        told = [(f"fake-{teller}-{n}", ["/ip4/10.9.9.9/tcp/1"]) for n in range(200)]
        book.heard(f"liar-{teller}", told, now_ms=2_000 + teller)
        book.heard(f"liar-{teller}", told[:HEARD_PER_SOURCE], now_ms=2_000 + teller)
    assert len(book.known()) <= TRIED_MAX + HEARD_MAX
    assert not [p for p in book.reached_since(0) if p.startswith("fake")]
    assert len(book.reached_since(1_000)) == TRIED_MAX
    book.seen("reached-299", 5_000)
    assert book.reached_since(5_000) == ["reached-299"]
    book.seen("fake-99-1", 5_000)  # hearsay is never marked alive by a connection mark
    assert "fake-99-1" not in book.reached_since(0)
    known = [n.encode() for n in book.known()]
    named = nodes_holding_user(
        b"u" * 20, own=b"me", known=known, reached=known[:10], replication_factor=64,
        num_shards=SHARDS,
    )  # fmt: skip
    assert len(named) == MAX_NAMED
