"""The real dm3 client libraries (npm, pinned in tests/interop/dm3/package-lock.json) against
two real chatsync nodes: envelopes built and encrypted by dm3-lib-messaging go to node A by
JSON-RPC; the recipient's history exported from node B (``chatsync export``) opens with
dm3-lib-crypto's ``decrypt``; node A is killed; the recipient's dm3 client falls back to node B, fetches,
decrypts, checks the signatures and acknowledges. Hostile submissions get the seed's codes.
Needs Node.js 20 and npm (the README's test command installs the packages here)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import build_app
from cluster.local import Cluster
from dm3.crypto import sign_text
from dm3.names import name_of

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent / "dm3"
TEXT = "gm bob — sent through chatsync, read from another node"


@pytest.fixture(scope="module")
def dm3_packages() -> Path:
    """``npm ci``: exactly the lock file's packages."""
    npm = shutil.which("npm")
    assert npm is not None, (
        "npm is needed (Node.js 20 + npm): the interop tests use dm3's libraries"
    )
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=HERE, check=True, timeout=300)
    return HERE


def chatsync(*args: str) -> str:
    result = CliRunner().invoke(build_app(), list(args))
    assert result.exit_code == 0, result.output
    return result.output


def user(tmp: Path, name: str, node: str, services: list[str]) -> dict[str, Any]:
    key_file = str(tmp / f"{name}.key")
    chatsync("keygen", "--out", key_file)
    chatsync("dm3", "register", "--key", key_file, "--node", node,
             *[arg for url in services for arg in ("--service", url)])  # fmt: skip
    keys = json.loads(chatsync("dm3", "keys", "--key", key_file))
    return {
        "name": chatsync("dm3", "name", "--key", key_file).strip(),
        "keys": keys,
        "file": key_file,
    }


def node_js(command: str, config: Path) -> list[dict[str, Any]]:
    node = shutil.which("node")
    assert node is not None, "Node.js is needed"
    done = subprocess.run(
        [node, "dm3_client.js", command, str(config)], cwd=HERE, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    for event in events:
        print(json.dumps(event))
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return events


def kept_at(url: str, recipient: dict[str, Any], key: Any) -> list[dict[str, Any]]:
    """The envelopes waiting for ``recipient`` on that node, signed in as them."""
    name = recipient["name"]
    challenge = httpx.get(f"{url}/auth/{name}").json()["challenge"]
    token = httpx.post(f"{url}/auth/{name}", json={"signature": sign_text(key, challenge)})
    got = httpx.get(
        f"{url}/delivery/messages/incoming/{name}",
        headers={"authorization": f"Bearer {token.json()['token']}"},
    )
    got.raise_for_status()
    result: list[dict[str, Any]] = got.json()
    return result


def test_dm3_library_submits_to_a_and_fetches_from_b_after_a_dies(
    dm3_packages: Path, tmp_path: Path
) -> None:
    from client.e2e import read_key_file

    with Cluster(2, tmp_path / "nodes", sync_interval_s=1.0) as cluster:
        cluster.start()
        a, b = (n.url for n in cluster.nodes)
        alice = user(tmp_path, "alice", a, [a])
        bob = user(tmp_path, "bob", a, [a, b])  # both nodes are bob's delivery services
        mallory = user(tmp_path, "mallory", a, [a])
        profiles = {name: httpx.get(f"{url}/dm3/profile").json() for name, url in
                    (("node-a.ds", a), ("node-b.ds", b))}  # fmt: skip
        config = tmp_path / "config.json"
        config.write_text(json.dumps({
            "alice": alice, "bob": bob, "mallory": mallory, "nodeA": a, "services": profiles,
            "text": TEXT, "strangerName": name_of(b"\x07" * 20),
        }))  # fmt: skip

        submitted = node_js("submit", config)
        assert any(e.get("submitted") == TEXT for e in submitted)
        bob_key = read_key_file(Path(bob["file"])).signing_key
        deadline = time.monotonic() + 30
        while not (kept := kept_at(b, bob, bob_key)) and time.monotonic() < deadline:
            time.sleep(0.3)  # gossip (or sync) brings it to node B
        assert len(kept) == 1, "exactly the one valid envelope: no hostile one was written"

        # bob's history exported from node B opens with dm3-lib-crypto's own decrypt
        export = tmp_path / "export"
        chatsync("export", "--key", bob["file"], "--node", b, "--out", str(export))
        opened = json.loads(config.read_text())
        opened.update(dir=str(export), storageKey=bob["keys"]["storageEncryptionKey"])
        (tmp_path / "open.json").write_text(json.dumps(opened))
        containers = node_js("open", tmp_path / "open.json")[-1]["detail"]
        assert {"conversations", "identity", "user"} in [set(c["keys"]) for c in containers]
        assert any(c["keys"] == ["messages"] for c in containers)

        cluster.stop(0, kill=True)  # node A is gone; bob's client falls back to node B
        fetched = node_js("fetch", config)
        assert any(e.get("fetched") == TEXT for e in fetched)
        assert kept_at(b, bob, bob_key) == []  # acknowledged: deleted on node B too
