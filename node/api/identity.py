"""A user's identity record: read it, publish a signed one."""

from __future__ import annotations

import trio
from fastapi import APIRouter
from starlette.exceptions import HTTPException as StarletteHTTPException

from node.api.decode import decode_identity_in, user_param
from node.api.errors import ERRORS
from node.api.interface import NodeDep
from node.api.models import HlcOut, IdentityIn, IdentityOut, IdentityPutOut, b64encode
from node.intake import user_outside_scope

router = APIRouter()


@router.get("/identity/{user_id}", responses=ERRORS)
async def get_identity(user_id: str, node: NodeDep) -> IdentityOut:
    """The user's current identity record (verify it: ``store.ops.verify_identity``); 421
    naming nodes that hold it if this node does not index the user (SYNC.md, "Scopes")."""
    user = user_param(user_id)
    if not node.indexes_user(user):
        raise user_outside_scope(user, node.config.network_shards)
    found = await trio.to_thread.run_sync(node.reads.get_identity, user)
    if found is None:
        raise StarletteHTTPException(404, f"no identity for user {user.hex()}")
    hlc, blob = found
    return IdentityOut(user_id=user.hex(), hlc=HlcOut.of(hlc), blob=b64encode(blob))


@router.put("/identity/{user_id}", responses=ERRORS)
async def put_identity(user_id: str, body: IdentityIn, node: NodeDep) -> IdentityPutOut:
    """Publish a signed IdentityRecord for this user (last writer wins by HLC)."""
    user = user_param(user_id)
    record = decode_identity_in(user, body)
    submitted = await node.submit_ops([record], wait_for_room=False)
    return IdentityPutOut(user_id=user.hex(), new=submitted.new[0])
