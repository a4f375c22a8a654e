"""Debug endpoints for benchmarks: ``GET /debug/latency`` (registered by ``node.api.create_app``).

``GET /debug/latency`` returns the node's gossip propagation latency quantiles
(``Metrics.latency_quantiles``: now - op HLC time, for every op gossip delivered
that was new here). With ``?arrivals=1`` it also lists ``[packed HLC, arrival ms]``
of the newest ops gossip delivered, and as ``sync_arrivals`` of the newest messages
anti-entropy stored (at most ``node.gossip.ARRIVAL_LOG`` each), so a benchmark that
stamps every op with a distinct HLC can tell when, and by which path, each op reached
each node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

if TYPE_CHECKING:
    from node.node import Node


def register_debug_routes(app: FastAPI, node: Node) -> None:
    @app.get("/debug/latency")
    async def debug_latency(arrivals: bool = False) -> dict[str, Any]:
        """Gossip latency quantiles (ms); with ?arrivals=1 the per-op arrival log."""
        body: dict[str, Any] = {"quantiles": node.metrics.latency_quantiles()}
        if arrivals and node.gossip is not None:
            body["arrivals"] = list(node.gossip.arrivals)
            body["sync_arrivals"] = list(node.sync_arrivals)
        return body
