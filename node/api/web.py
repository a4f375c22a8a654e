"""The web view: ``/`` (the page, from ``node/web/``: no CDN, no build step), the JSON it
polls — ``/network`` (our roots beside each peer's last agreed ones) and ``/status/series``
(a sample a second) — and Swagger UI at ``/docs`` from packaged files (``create_app``).

Open to all, like ``/status``: the figures carry no message. The page's admin parts (the
partition switch, the latency log) send the admin token the operator types in, to the
``/admin`` and ``/debug`` endpoints that check it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import FileResponse

from node.api.errors import ERRORS
from node.api.interface import NodeDep

WEB_DIR = Path(__file__).resolve().parent.parent / "web"

router = APIRouter()


@router.get("/", include_in_schema=False)
async def page() -> FileResponse:
    return FileResponse(WEB_DIR / "index.html", headers={"cache-control": "no-cache"})


@router.get("/network", responses=ERRORS)
async def network(node: NodeDep) -> dict[str, Any]:
    """Our Merkle roots; per known peer the roots of its last converged sync session, whether
    they are still ours, how long ago it agreed, its last session's result."""
    return node.network()


@router.get("/status/series", responses=ERRORS)
async def series(
    node: NodeDep, since: int = Query(0, ge=0, description="only samples after this (wall ms)")
) -> dict[str, Any]:
    """One sample a second for ten minutes: running totals of ops written and received by
    gossip, sync and the API, ops published; resident memory, connected peers, gossip lag."""
    return {"samples": node.series.since(since)}
