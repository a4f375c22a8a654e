"""The client's ``chat_proof`` against a real node (no mocks).

As in test_client.py: a ``Node`` in the test's trio run, the synchronous client in a
worker thread so the node keeps serving meanwhile.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from client.e2e import UserKey
from client.http import ChatsyncClient, proof_from_json
from store.authz import DmProof, new_group
from store.errors import InvalidInput
from store.records import Role, dm_chat_id
from tests.node.node_support import running_node

ALICE = UserKey.from_seed(b"\x01" * 32)
BOB = UserKey.from_seed(b"\x02" * 32)
CAROL = UserKey.from_seed(b"\x03" * 32)


async def test_client_chat_proof_group_dm_unknown(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (_, http):
        url = str(http.base_url).rstrip("/")
        group = new_group(ALICE.signing_key, b"client-proof-gr!")
        dm = DmProof(BOB.user_id, ALICE.user_id)

        def check() -> None:
            with ChatsyncClient(url) as client:
                assert client.chat_proof(group.chat_id()) is None
                client.post_ops(
                    [
                        client.membership_op(
                            ALICE.signing_key, group.chat_id(), BOB.user_id, proof=group
                        ),
                        client.membership_op(
                            ALICE.signing_key, dm.chat_id(), BOB.user_id, proof=dm
                        ),
                    ]
                )
                assert client.chat_proof(group.chat_id()) == group
                assert client.chat_proof(dm.chat_id()) == dm
                assert client.chat_proof(dm_chat_id(ALICE.user_id, CAROL.user_id)) is None
                [bob] = client.member_list(group.chat_id())
                assert (bob.user_id, bob.role) == (BOB.user_id, Role.PARTICIPANT)

        await trio.to_thread.run_sync(check)


def test_the_client_checks_that_the_proof_derives_the_chat_id() -> None:
    group = new_group(ALICE.signing_key, b"n" * 16)
    as_json = {
        "kind": "group", "creator_key": group.creator_key.hex(), "nonce": group.nonce.hex(),
    }  # fmt: skip
    assert proof_from_json(group.chat_id(), as_json) == group
    with pytest.raises(InvalidInput, match="does not derive"):
        proof_from_json(bytes(32), as_json)  # a node claiming Alice controls another chat
    with pytest.raises(InvalidInput, match="malformed"):
        proof_from_json(group.chat_id(), {**as_json, "nonce": "abc"})
    with pytest.raises(InvalidInput, match="malformed"):
        proof_from_json(bytes(32), {"kind": "dm", "users": [ALICE.user_id.hex()]})
