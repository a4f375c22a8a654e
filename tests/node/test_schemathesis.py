"""Schemathesis against a real node's OpenAPI schema: no request may get a 5xx.

One ``chatsync node run`` process (real RocksDB, libp2p on 127.0.0.1, HTTP on a free port,
started by ``cluster.local.Cluster``) holding a small group chat — members, messages, an
identity — so reads have something to page through. Schemathesis (its CLI, as a person would
run it) then fuzzes every operation twice, with the ``not_a_server_error`` check only:

1. against ``/openapi.json`` exactly as the node serves it;
2. against the same schema with the documented id formats added to the path parameters
   (``chat_id``: 64 hex digits, ``user_id``: 40; docs/OPERATING.md "HTTP API") and the stored
   chat, user and a real cursor as examples — so generated requests also get past the id check
   and reach the store, while negative cases still send every kind of malformed id.

The second run signs in as Alice (a member of the group) and sends her token with every
request, so the generated requests get past the 401 to her chat list, read state, events and
the group's history. Nothing is excluded: ``/admin/block`` and ``/admin/unblock`` take any
peer id string (a one-node cluster has no peer to lose; without the admin token they are
refused anyway), ``/metrics`` and ``/debug/latency`` are read-only.
Valid signed ops cannot be generated from a schema; the CBOR decoding behind ``POST /ops`` is
fuzzed by ``tests/fuzz/fuzz_http.py`` and ``fuzz_ops.py`` instead.

Budget: ``MAX_EXAMPLES`` per operation and phase, ``MAX_TIME_S`` per run (about 2 minutes in
all); ``SCHEMATHESIS_MAX_EXAMPLES`` and ``SCHEMATHESIS_MAX_TIME`` raise them for the larger run
by hand (docs/TESTING.md, "Fuzzing").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from client.e2e import UserKey
from client.http import ChatsyncClient
from cluster.local import Cluster
from store.authz import new_group
from store.hlc import Hlc
from store.ops import MembershipAction, MembershipOp, Op
from store.records import MsgV1

pytestmark = pytest.mark.slow

# The larger run by hand sets these (docs/TESTING.md, "Fuzzing").
MAX_EXAMPLES = int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "25"))
MAX_TIME_S = int(os.environ.get("SCHEMATHESIS_MAX_TIME", "40"))
ALICE = UserKey.from_seed(b"\x41" * 32)
BOB = UserKey.from_seed(b"\x42" * 32)
GROUP_PROOF = new_group(ALICE.signing_key, b"schemathesis-grp")
GROUP = GROUP_PROOF.chat_id()
ID_FORMATS = {"chat_id": (64, GROUP.hex()), "user_id": (40, ALICE.user_id.hex())}


def stored_ops() -> list[Op]:
    base = int(time.time() * 1000) - 60_000
    ops: list[Op] = [ALICE.identity(Hlc(base)), BOB.identity(Hlc(base))]
    for user in (ALICE, BOB):
        ops.append(
            MembershipOp.create(
                ALICE.signing_key, GROUP, user.user_id, MembershipAction.ADD, Hlc(base + 1),
                proof=GROUP_PROOF,
            )
        )  # fmt: skip
    for i in range(12):
        author = (ALICE, BOB)[i % 2]
        ops.append(MsgV1.create(author.signing_key, GROUP, Hlc(base + 10 + i), b"msg %d" % i))
    return ops


@pytest.fixture(scope="module")
def node_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with Cluster(1, tmp_path_factory.mktemp("schemathesis-node")) as cluster:
        cluster.start()
        assert all(cluster.post_ops(0, stored_ops()))
        yield cluster.nodes[0].url


def with_id_formats(schema: dict[str, Any], cursor: str) -> dict[str, Any]:
    """The served schema plus what docs/OPERATING.md documents: ids are fixed-length lowercase
    hex."""
    schema = json.loads(json.dumps(schema))
    for operations in schema["paths"].values():
        for operation in operations.values():
            for param in operation.get("parameters", []):
                if param["in"] == "path" and param["name"] in ID_FORMATS:
                    digits, example = ID_FORMATS[param["name"]]
                    param["schema"] = {
                        "type": "string",
                        "pattern": f"^[0-9a-f]{{{digits}}}$",
                        "examples": [example],
                    }
                elif param["name"] == "cursor":
                    param["schema"]["anyOf"][0]["examples"] = [cursor]
    return schema


def run_schemathesis(
    schema_location: str, base_url: str, report: Path, token: str | None = None
) -> dict[str, Any]:
    auth = [] if token is None else ["--header", f"Authorization: Bearer {token}"]
    args = [
        sys.executable, "-m", "schemathesis.cli", "run", schema_location, "--url", base_url, *auth,
        "--checks", "not_a_server_error", "--max-examples", str(MAX_EXAMPLES),
        "--max-time", str(MAX_TIME_S), "--seed", "1", "--workers", "1",
        "--request-timeout", "20", "--report", "json,har", "--report-json-path", str(report),
        "--report-har-path", str(report.with_suffix(".har")),
    ]  # fmt: skip
    done = subprocess.run(  # cwd: schemathesis keeps a cache directory (.schemathesis/) there
        args, capture_output=True, text=True, timeout=MAX_TIME_S * 4, check=False, cwd=report.parent
    )
    assert report.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    result: dict[str, Any] = json.loads(report.read_text())
    result["output"] = done.stdout[-6000:]
    har = json.loads(report.with_suffix(".har").read_text())
    result["requests"] = len(har["log"]["entries"])  # every request sent, stateful ones too
    return result


def assert_no_server_error(result: dict[str, Any]) -> None:
    cases = result["test_cases"]
    print(
        f"schemathesis: {result['requests']} requests in {cases['generated']} test cases, "
        f"{result['operations']['tested']}/{result['operations']['total']} operations, "
        f"{cases['with_failures']} with failures, {len(result['errors'])} errors, "
        f"{result['running_time']:.0f} s"
    )
    assert result["operations"]["tested"] == result["operations"]["total"], result["output"]
    assert not result["failures"] and not result["errors"], result["output"]
    assert result["exit_code"] == 0, result["output"]


def test_the_served_schema_finds_no_server_error(node_url: str, tmp_path: Path) -> None:
    result = run_schemathesis(f"{node_url}/openapi.json", node_url, tmp_path / "report.json")
    assert_no_server_error(result)


def test_the_schema_with_id_formats_finds_no_server_error(node_url: str, tmp_path: Path) -> None:
    served = httpx.get(f"{node_url}/openapi.json", timeout=20).json()
    with ChatsyncClient(node_url, key=ALICE.signing_key) as client:
        token = client.token()  # Alice's: the generated requests reach her chat and lists
    auth = {"authorization": f"Bearer {token}"}
    page = httpx.get(
        f"{node_url}/chats/{GROUP.hex()}/messages", params={"limit": 5}, timeout=20, headers=auth
    )
    cursor = page.json()["next_cursor"]
    assert cursor, page.text
    schema_path = tmp_path / "openapi-with-id-formats.json"
    schema_path.write_text(json.dumps(with_id_formats(served, cursor)))
    result = run_schemathesis(str(schema_path), node_url, tmp_path / "report.json", token)
    assert_no_server_error(result)
