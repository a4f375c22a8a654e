"""Keys owed across removals, on real nodes (issue 34, SECURITY.md "Hand-overs").

* Bob, cut off, posts before he learns that Alice added Carol; Alice then removes him. Bob
  can no longer grant Carol the key he owes her (a removed member's grants are refused), so
  Carol cannot read his post — until Alice, the one member of his epoch still in the group,
  next posts and hands the key over.
* Bob, cut off, is removed, re-added and removed again without knowing it, and posts in
  between: his epoch grant, stamped while he was removed, is hidden once the member ops
  arrive, yet Alice reads his valid post from the re-added spell through it (``GET
  /chats/{chat}/hidden-grants``) — though Bob, gone, can grant nothing any more."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import build_app
from client.e2e import UserKey, write_key_file
from client.http import ChatsyncClient
from cluster.local import Cluster

pytestmark = pytest.mark.slow

USERS = {name: UserKey.from_seed(bytes([i + 61]) * 32) for i, name in enumerate(("alice", "bob", "carol"))}  # fmt: skip
OWED = "BOB-BEFORE-HE-KNEW-3391"
NO_KEY = "[encrypted: no key for it reached you]"


def _keys(tmp_path: Path) -> dict[str, str]:
    keys = {}
    for name, key in USERS.items():
        keys[name] = str(tmp_path / f"{name}.key")
        write_key_file(Path(keys[name]), key)
    return keys


def cli(*args: str) -> str:
    result = CliRunner().invoke(build_app(), list(args))
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    return result.output


def test_a_removed_senders_owed_key_is_handed_over_by_a_remaining_member(tmp_path: Path) -> None:
    keys = _keys(tmp_path)
    with Cluster(3, tmp_path / "nodes", sync_interval_s=1.0) as cluster:
        cluster.start()
        url = {name: cluster.nodes[i].url for i, name in enumerate(USERS)}

        def as_(who: str, *args: str) -> str:
            return cli(*args, "--key", keys[who], "--node", url[who])

        def carol_reads() -> list[str]:
            page = json.loads(
                as_("carol", "history", "--chat", chat, "--direction", "forward", "--json")
            )
            return [m["text"] for m in page["messages"]]

        for name in USERS:
            as_(name, "publish")
        cluster.wait_converged(timeout_s=30)
        [chat] = re.findall(r"created group ([0-9a-f]{64})", as_("alice", "group", "create", "--name", "crew"))  # fmt: skip
        as_("alice", "group", "add", chat, USERS["bob"].user_id.hex())
        as_("alice", "send", "hello bob", "--chat", chat)
        cluster.wait_converged(timeout_s=30)

        cluster.partition(1)  # Bob's node
        as_("alice", "group", "add", chat, USERS["carol"].user_id.hex())
        as_("bob", "send", OWED, "--chat", chat)  # sealed for Alice and Bob only
        as_("alice", "group", "remove", chat, USERS["bob"].user_id.hex())
        cluster.heal(1)
        cluster.wait_converged(timeout_s=60)
        # Bob can no longer post anything there, the grants he owes included
        refused = CliRunner().invoke(build_app(), ["send", "again", "--chat", chat, "--key", keys["bob"], "--node", url["bob"]])  # fmt: skip
        assert refused.exit_code == 1 and "not a member" in refused.output, refused.output
        # "hello bob" was sent before Carol's add: hers to miss; Bob's post is owed to her
        assert carol_reads() == ["crew", NO_KEY, NO_KEY]

        as_("alice", "send", "welcome carol", "--chat", chat)  # her grants hand the key over
        cluster.wait_converged(timeout_s=60)
        assert carol_reads() == ["crew", NO_KEY, OWED, "welcome carol"]
        alice = json.loads(as_("alice", "history", "--chat", chat, "--direction", "forward", "--json"))  # fmt: skip
        assert [m["text"] for m in alice["messages"]] == [
            "crew",
            "hello bob",
            OWED,
            "welcome carol",
        ]


def test_a_hidden_epoch_grant_opens_a_valid_post_of_a_sender_gone_since(tmp_path: Path) -> None:
    keys = _keys(tmp_path)
    with Cluster(2, tmp_path / "nodes", sync_interval_s=1.0) as cluster:
        cluster.start()
        url = {"alice": cluster.nodes[0].url, "bob": cluster.nodes[1].url}

        def as_(who: str, *args: str) -> str:
            return cli(*args, "--key", keys[who], "--node", url[who])

        def texts(who: str) -> list[str]:
            page = json.loads(as_(who, "history", "--chat", chat, "--direction", "forward", "--json"))  # fmt: skip
            return [m["text"] for m in page["messages"]]

        for name in ("alice", "bob"):
            as_(name, "publish")
        cluster.wait_converged(timeout_s=30)
        [chat] = re.findall(r"created group ([0-9a-f]{64})", as_("alice", "group", "create", "--name", "crew"))  # fmt: skip
        bob = USERS["bob"].user_id.hex()
        as_("alice", "group", "add", chat, bob)
        cluster.wait_converged(timeout_s=30)

        cluster.partition(1)  # Bob's node: he learns of none of Alice's ops below until the heal
        as_("alice", "group", "remove", chat, bob)
        as_("bob", "send", "while removed", "--chat", chat)  # his epoch's grant: hidden later
        as_("alice", "group", "add", chat, bob)
        as_("bob", "send", OWED, "--chat", chat)  # valid, sealed under that epoch
        as_("alice", "group", "remove", chat, bob)  # gone again: he will post nothing more
        cluster.heal(1)
        cluster.wait_converged(timeout_s=60)
        hidden = ChatsyncClient(url["alice"], key=USERS["alice"].signing_key).hidden_grants(
            bytes.fromhex(chat)
        )
        assert len(hidden) == 1 and hidden[0].sender == USERS["bob"].user_id
        assert texts("alice") == ["crew", OWED]
