"""The node itself: the partition switch (admin token), status, metrics, liveness."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from node.api.auth import ADMIN
from node.api.errors import ERRORS
from node.api.interface import NodeDep
from node.api.models import PeerIn

router = APIRouter()


@router.post("/admin/block", dependencies=ADMIN, responses=ERRORS)
async def block_peer(body: PeerIn, node: NodeDep) -> dict[str, Any]:
    """Partition switch: drop this peer's traffic (gossip, sync, connections)."""
    return {"blocked": await node.block_peer(body.peer_id)}


@router.post("/admin/unblock", dependencies=ADMIN, responses=ERRORS)
async def unblock_peer(body: PeerIn, node: NodeDep) -> dict[str, Any]:
    return {"blocked": node.unblock_peer(body.peer_id)}


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/status")
async def status(node: NodeDep) -> dict[str, Any]:
    """Peer id, connected peers, Merkle root and record count per domain, last sync per peer."""
    return node.status()


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(node: NodeDep) -> str:
    """Counters and gauges in the Prometheus text format."""
    return node.metrics.render()
