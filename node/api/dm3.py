"""dm3's delivery service API on the node's HTTP port (docs/DM3.md).

* ``POST /rpc`` — JSON-RPC 2.0: ``dm3_submitMessage`` ([envelope JSON, token]),
  ``dm3_getDeliveryServiceProperties`` ([]), ``dm3_getProfileExtension`` ([name]). Every
  answer is HTTP 200 with a JSON-RPC result or error (the seed's codes, ``dm3/rpc.py``).
* ``GET``/``POST /auth/{name}`` — dm3's sign-in (``dm3-lib-delivery-api`` ``auth-http``): a
  challenge text, then ``{signature}`` for a token.
* ``GET /delivery/messages/{name}/contact/{contact}``, ``GET
  /delivery/messages/incoming/{name}``, ``POST
  /delivery/messages/{name}/syncAcknowledgment/{last_message_pull}`` — the recipient fetches
  its envelopes and acknowledges them (``messaging-http``), with its token.
* ``GET /dm3/profile`` — this node's delivery service profile (what ENS would hold).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from dm3 import rpc
from dm3.crypto import stringify
from node.api.auth import Signed, as_user
from node.api.errors import ERRORS
from node.api.interface import NodeDep
from node.dm3 import Dm3Gateway

log = logging.getLogger(__name__)
router = APIRouter()
MAX_ACKS = 1000


@router.post("/rpc")
async def json_rpc(request: Request, node: NodeDep) -> JSONResponse:
    """dm3's JSON-RPC methods; errors with the seed's codes, always HTTP 200."""
    try:
        call = rpc.parse_request(await request.body())
        try:
            result = await _dispatch(node.dm3, call)
        except rpc.RpcError as exc:
            exc.request_id = call.id
            raise
        answer = rpc.response(call.id, result)
    except rpc.RpcError as exc:  # the seed's codes
        node.metrics.inc("dm3_rpc_errors", code=str(exc.code), help="dm3 JSON-RPC refusals")
        answer = rpc.error_response(exc)
    except Exception:  # a bug: logged and counted like the API's, answered as JSON-RPC
        log.exception("dm3 JSON-RPC call failed")
        node.metrics.inc("api_bugs", help="HTTP requests that failed with an unexpected error")
        answer = rpc.error_response(rpc.RpcError(rpc.INTERNAL_ERROR, "Internal error"))
    return JSONResponse(answer)


async def _dispatch(gateway: Dm3Gateway, call: rpc.Request) -> Any:
    if call.method == "dm3_submitMessage":
        return await gateway.submit(call.params)
    if call.method == "dm3_getDeliveryServiceProperties":
        return stringify(gateway.properties())  # dm3-lib-delivery-api JSON.parses the result
    if call.method == "dm3_getProfileExtension":
        if len(call.params) != 1 or not isinstance(call.params[0], str):
            raise rpc.RpcError(rpc.INVALID_PARAMS, "Invalid params: [the recipient's name]")
        return await gateway.profile_extension(call.params[0])
    raise rpc.RpcError(rpc.METHOD_NOT_FOUND, f"Method not found: {call.method[:80]}")


# --- sign-in ---


class SignatureIn(BaseModel):
    signature: str = Field(max_length=256)
    challenge: str | None = Field(None, max_length=512, description="default: the last one given")


@router.get("/auth/{name}", responses=ERRORS)
async def dm3_challenge(name: str, node: NodeDep) -> dict[str, str]:
    """A challenge for the name's dm3 signing key (its chatsync key) to sign, as text."""
    await _known(node.dm3, name)
    return {"challenge": node.dm3.challenge(name)}


@router.post("/auth/{name}", responses=ERRORS)
async def dm3_token(name: str, body: SignatureIn, node: NodeDep) -> dict[str, str]:
    """A token (the node's usual one) for the signature over the challenge."""
    await _known(node.dm3, name)
    token, _ = await node.dm3.sign_in(name, body.challenge, body.signature)
    return {"token": token}


# --- the recipient's envelopes ---


@router.get("/delivery/messages/incoming/{name}", responses=ERRORS)
async def incoming(name: str, node: NodeDep, who: Signed) -> list[dict[str, Any]]:
    """Every envelope waiting for the user, oldest first (at most 1,000)."""
    user = await _own(node.dm3, name, who)
    return [kept.envelope for kept in await node.dm3.kept(user)]


@router.get("/delivery/messages/{name}/contact/{contact}", responses=ERRORS)
async def from_contact(name: str, contact: str, node: NodeDep, who: Signed) -> list[dict[str, Any]]:
    """The envelopes waiting for the user from ``contact``, oldest first."""
    user = await _own(node.dm3, name, who)
    return [kept.envelope for kept in await node.dm3.kept(user, contact)]


class Acknowledgment(BaseModel):
    contactAddress: str = Field(max_length=255)
    messageHash: str | None = Field(None, max_length=128)


class AcknowledgmentsIn(BaseModel):
    acknoledgments: list[Acknowledgment] = Field(max_length=MAX_ACKS)  # sic: dm3's spelling


@router.post("/delivery/messages/{name}/syncAcknowledgment/{last_message_pull}", responses=ERRORS)
@router.post("/delivery/messages/{name}/syncAcknoledgment/{last_message_pull}", responses=ERRORS)
async def acknowledge(
    name: str, last_message_pull: int, body: AcknowledgmentsIn, node: NodeDep, who: Signed
) -> dict[str, int]:
    """The user has stored what came in from these contacts up to ``last_message_pull``
    (ms): every node deletes it (DELETE messages of this node's, which replicate)."""
    user = await _own(node.dm3, name, who)
    contacts = [ack.contactAddress for ack in body.acknoledgments]
    return {"deleted": await node.dm3.acknowledge(user, contacts, last_message_pull)}


@router.get("/dm3/profile")
async def delivery_service_profile(request: Request, node: NodeDep) -> dict[str, str]:
    """This node's dm3 delivery service profile. A recipient makes this node one of their
    delivery services by adding the user of its ``publicSigningKey`` to their inbox."""
    return node.dm3.profile(str(request.base_url).rstrip("/"))


async def _known(gateway: Dm3Gateway, name: str) -> bytes:
    """The user behind the name; 404 ``unknown_name`` (node/api/errors.py) if none here."""
    return (await gateway.recipient(name)).user_id


async def _own(gateway: Dm3Gateway, name: str, who: Signed) -> bytes:
    user = await _known(gateway, name)
    as_user(who, user)
    return user
