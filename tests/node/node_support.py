"""Builders shared by the node tests: signed ops, small DBs, a real node on free ports."""

from __future__ import annotations

import base64
import errno
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio
from nacl.signing import SigningKey

from cluster.local import free_port
from node.config import NodeConfig
from node.errors import PortInUse
from node.node import Node, RunningNode
from node.syncer import StoreReceived
from store import ChatDb, ChatDbConfig, Hlc, MsgV1
from store.authz import new_group
from store.ops import MembershipAction, MembershipOp, Op, encode_op, make_identity, op_kind
from store.records import Role
from store.signing import key_from_seed, public_key, user_id_from_key
from sync.protocol import Received
from sync.replica import Replica

KEYS = [key_from_seed(bytes([i + 11]) * 32) for i in range(3)]
USERS = [user_id_from_key(public_key(k)) for k in KEYS]
PROOF = new_group(KEYS[0], b"node-tests-chat!")  # KEYS[0] created the chat
CHAT = PROOF.chat_id()


def small_db(path: Path) -> ChatDb:
    return ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=path)


def messages(start: int, count: int, *, author: int = 0) -> list[MsgV1]:
    return [
        MsgV1.create(KEYS[author], CHAT, Hlc(1_000 + i), b"n%d" % i)
        for i in range(start, start + count)
    ]


def add(user: int, hlc: int) -> MembershipOp:
    return MembershipOp.create(
        KEYS[0], CHAT, USERS[user], MembershipAction.ADD, Hlc(hlc), Role.ADMIN, proof=PROOF
    )


# The creator's own add, stamped before every ``messages()``: it admits KEYS[0]'s messages
# (a node stores a message only once an add of its sender stamped at or before it is known).
JOIN = add(0, 1)


def store_directly(replica: Replica) -> StoreReceived:
    """A test peer's sync writes, straight into its replica (a node's go through its one
    writer, ``DbWriter.store_received``)."""

    async def store(received: Received) -> int:
        return received.write_to(replica)

    return store


def seed(db: ChatDb, msgs: list[MsgV1], *ops: MembershipOp) -> None:
    """Fill ``db`` as a node would: JOIN and ``ops``, then ``msgs`` under the message rule
    (``ChatDb.put_authorized``); every message must be admitted."""
    db.apply_member_ops([JOIN, *ops])
    waiting = db.put_authorized(msgs).park
    assert not waiting, f"{len(waiting)} messages not admitted"


def identity(user: int, hlc: int):  # type: ignore[no-untyped-def]
    return make_identity(KEYS[user], bytes([user]) * 32, Hlc(hlc))


def now_ms() -> int:
    return int(time.time() * 1000)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode()


def ops_body(*ops: Op) -> dict[str, Any]:
    return {"ops": [{"kind": int(op_kind(op)), "data": b64(encode_op(op))} for op in ops]}


@asynccontextmanager
async def running_node(
    tmp_path: Path, **config: Any
) -> AsyncIterator[tuple[RunningNode, httpx.AsyncClient]]:
    async with trio.open_nursery() as nursery:
        for attempt in range(START_ATTEMPTS):
            # free_port closes its socket: another bind (the node's own libp2p listener on
            # port 0, a client's connection) may take the port before the HTTP server does
            port = free_port()
            node = Node(
                NodeConfig(
                    data=str(tmp_path / "node"), listen="/ip4/127.0.0.1/tcp/0",
                    http=f"127.0.0.1:{port}", **{"sync_interval_s": 3600, **config},
                )
            )  # fmt: skip
            try:
                running = await nursery.start(node.run)
                break
            except BaseException as exc:
                if attempt + 1 == START_ATTEMPTS or not _address_in_use(exc):
                    raise
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=20) as http:
            yield running, http
        node.stop()


START_ATTEMPTS = 3


def _address_in_use(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_address_in_use(inner) for inner in exc.exceptions)
    return isinstance(exc, PortInUse)  # Node.run's check of the ports (node/startup.py)


async def counts(http: httpx.AsyncClient) -> dict[str, int]:
    status = (await http.get("/status")).json()
    return {name: d["count"] for name, d in status["domains"].items()}


async def sign_in(http: httpx.AsyncClient, key: SigningKey, device: str = "test") -> dict[str, str]:
    """The Authorization header of ``key``'s user: sign this node's challenge (node/auth.py)."""
    public = bytes(key.verify_key)
    user = user_id_from_key(public).hex()
    got = await http.post("/auth/challenge", json={"user_id": user})
    assert got.status_code == 200, got.text
    challenge = got.json()["challenge"]
    signature = key.sign(base64.urlsafe_b64decode(challenge)).signature
    body = {
        "user_id": user, "public_key": public.hex(), "challenge": challenge,
        "signature": b64(signature), "device": device,
    }  # fmt: skip
    issued = await http.post("/auth/token", json=body)
    assert issued.status_code == 200, issued.text
    return {"authorization": f"Bearer {issued.json()['token']}"}


def notices(metrics: Any, metric: str, now: Any = lambda: 0.0) -> Any:
    """A ``Notices`` for tests: one line per subject and reason per minute of ``now``."""
    import logging

    from node.notices import Notices

    return Notices(
        metrics, metric, "test", interval_s=60, now=now, logger=logging.getLogger("chatsync.test")
    )
