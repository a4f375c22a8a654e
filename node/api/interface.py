"""The narrow interface the HTTP layer has to a running node (``node.node.RunningNode``).

Handlers reach it through FastAPI's dependency injection (``NodeDep``): the app keeps
it in ``app.state.node``. Reads go straight to the store (in a worker thread), through
``reads`` — a ``store.chat_reads.ChatReads``, which has no write; every write goes through
the node's writer (``submit_ops``).
"""

from __future__ import annotations

from typing import Annotated, Any, Protocol

from fastapi import Depends, Request
from fastapi.requests import HTTPConnection

from node.auth import Authenticator
from node.commits import CommitSignal
from node.config import NodeConfig
from node.delivery import Acks
from node.dm3 import Dm3Gateway
from node.intake import Submitted
from node.metrics import Metrics
from node.series import Series
from store.chat_reads import ChatReads
from store.ops import Op


class NodeApi(Protocol):
    @property
    def reads(self) -> ChatReads:
        """The store's reads (there is no write in the type)."""
        ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def max_payload(self) -> int: ...

    @property
    def config(self) -> NodeConfig: ...

    @property
    def auth(self) -> Authenticator:
        """Sign-in and user tokens (node/auth.py)."""
        ...

    @property
    def admin_token(self) -> str: ...

    @property
    def acks(self) -> Acks:
        """Stream acknowledgements, written to the store each second."""
        ...

    @property
    def commits(self) -> CommitSignal:
        """Wakes event streams when the store logs events."""
        ...

    @property
    def dm3(self) -> Dm3Gateway:
        """The dm3 delivery service (node/dm3.py)."""
        ...

    async def settle_chat_lists(self) -> None:
        """The chat-list moves that wait, written by the node's writer: a list read next
        shows every stored message."""
        ...

    async def submit_ops(self, ops: list[Op], *, wait_for_room: bool = True) -> Submitted:
        """Validate, write and gossip; per op, whether it was new and whether it waits for
        a member op. ``wait_for_room=False``: trio.WouldBlock at once if the queue is full."""
        ...

    def status(self) -> dict[str, Any]: ...

    def holds_chat(self, chat: bytes) -> bool:
        """Whether the chat lies in this node's scope (SYNC.md, "Scopes")."""
        ...

    def holders_of(self, chat: bytes) -> list[str]:
        """Peer ids (base58) of nodes holding a chat outside our scope (a worker thread's
        read: node/scope_answer.py)."""
        ...

    def indexes_user(self, user: bytes) -> bool:
        """Whether the user's identity and index entries lie in this node's scope."""
        ...

    def user_holders_of(self, user: bytes) -> list[str]:
        """Peer ids (base58) of nodes holding a user shard outside our scope (by the R rule
        among our peers: node/scope_answer.py)."""
        ...

    def network(self) -> dict[str, Any]:
        """Our roots, and per known peer the roots it last agreed on (node/agreement.py)."""
        ...

    @property
    def series(self) -> Series:
        """A sample a second of the node's rates, memory and lag (node/series.py)."""
        ...

    async def block_peer(self, peer_id: str) -> list[str]:
        """Drop this peer's traffic; the blocked peers, sorted."""
        ...

    def unblock_peer(self, peer_id: str) -> list[str]: ...

    def arrivals(self) -> dict[str, list[tuple[int, int]]]:
        """(packed HLC, arrival ms) of the newest ops gossip and sync delivered."""
        ...


def node_of(connection: HTTPConnection) -> NodeApi:
    node: NodeApi = connection.app.state.node
    return node


async def _node_dependency(request: Request) -> NodeApi:
    # async: FastAPI runs a plain ``def`` dependency in a worker thread, a hop per request
    return node_of(request)


NodeDep = Annotated[NodeApi, Depends(_node_dependency)]
