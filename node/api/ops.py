"""``POST /ops``: signed ops in."""

from __future__ import annotations

from fastapi import APIRouter, Response

from node.api.decode import decode_ops_in
from node.api.errors import ERRORS
from node.api.interface import NodeDep
from node.api.models import OpsIn, OpsOut

router = APIRouter()


@router.post("/ops", status_code=201, responses={**ERRORS, 202: {"model": OpsOut}})
async def submit_ops(body: OpsIn, node: NodeDep, response: Response) -> OpsOut:
    """Submit signed ops; answered once written (durable mode: once in the WAL).

    All or nothing: if any op is malformed, forged, too far ahead, or a message from a
    sender removed from its chat at its stamp (403 ``not_a_member``), none is written.
    A message the node knows no add op of its sender for (stamped at or before it) is held,
    not stored: 202 with ``waiting`` true for it; it is stored and shown once such an op
    arrives, and a stranger's never is (SECURITY.md, "Who may post").
    """
    ops = decode_ops_in(body, max_payload=node.max_payload)
    submitted = await node.submit_ops(ops, wait_for_room=False)
    if any(submitted.waiting):
        response.status_code = 202
    return OpsOut(accepted=len(ops), new=submitted.new, waiting=submitted.waiting)
