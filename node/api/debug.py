"""Debug endpoints for benchmarks: ``GET /debug/latency``.

It returns the node's gossip propagation latency quantiles (``Metrics.latency_quantiles``:
now - op HLC time, for every op gossip delivered that was new here). With
``?arrivals=1`` it also lists ``[packed HLC, arrival ms]`` of the newest ops gossip
delivered, and as ``sync_arrivals`` of the newest messages anti-entropy stored (at most
``node.arrivals.ARRIVAL_LOG`` each), so a benchmark that stamps every op with a distinct
HLC can tell when, and by which path, each op reached each node.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from node.api.auth import ADMIN
from node.api.errors import ERRORS
from node.api.interface import NodeDep

router = APIRouter()


@router.get("/debug/latency", dependencies=ADMIN, responses=ERRORS)
async def debug_latency(node: NodeDep, arrivals: bool = False) -> dict[str, Any]:
    """Gossip latency quantiles (ms); with ?arrivals=1 the per-op arrival log."""
    body: dict[str, Any] = {"quantiles": node.metrics.latency_quantiles()}
    if arrivals:
        body.update(node.arrivals())
    return body
