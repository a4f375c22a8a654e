"""``POST /ops``: signed ops in."""

from __future__ import annotations

from fastapi import APIRouter

from node.api.decode import decode_ops_in
from node.api.errors import ERRORS
from node.api.interface import NodeDep
from node.api.models import OpsIn, OpsOut

router = APIRouter()


@router.post("/ops", status_code=201, responses=ERRORS)
async def submit_ops(body: OpsIn, node: NodeDep) -> OpsOut:
    """Submit signed ops; answered once written (durable mode: once in the WAL).

    All or nothing: if any op is malformed, forged or too far ahead, none is written.
    """
    ops = decode_ops_in(body, max_payload=node.max_payload)
    new = await node.submit_ops(ops, wait_for_room=False)
    return OpsOut(accepted=len(ops), new=new)
