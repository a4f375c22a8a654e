"""Sign-in (``POST /auth/challenge``, ``POST /auth/token``) and who may call what.

A user's token (``Authorization: Bearer <token>``, or ``?access_token=`` where a client
cannot set headers, as browsers opening a WebSocket) opens that user's chat list, read
state, events and delivery state, and the history and members of the chats they may read
(``Feeds.may_read``). The admin token (``admin.token`` beside the database) opens
``/admin/*`` and ``/debug/*``. Open to all: ``POST /ops`` (every op is signed and judged on
its own), identities, a chat's proof (who controls it, which a client needs to sign member
ops), ``/status``, ``/metrics``, ``/health`` and the schema. Refusals: 401 ``no_token``,
``bad_token``, ``token_expired`` and the sign-in codes (``node/auth.py``); 403 ``wrong_user``,
``not_a_member``, ``not_admin``.
"""

from __future__ import annotations

from typing import Annotated

import trio
from fastapi import APIRouter, Depends, Request
from fastapi.requests import HTTPConnection

from node.api.decode import b64decode, parse_id, user_param
from node.api.errors import ERRORS
from node.api.interface import NodeApi, NodeDep
from node.api.models import ChallengeIn, ChallengeOut, TokenIn, TokenOut, b64encode
from node.auth import AuthRefused, Principal, check_admin
from node.intake import outside_scope
from store.signing import PUBLIC_KEY_LEN

router = APIRouter()


@router.post("/auth/challenge", responses=ERRORS)
async def challenge(body: ChallengeIn, node: NodeDep) -> ChallengeOut:
    """Bytes for the user's key to sign: bound to this node and user, good once, for a minute."""
    got = node.auth.challenge(user_param(body.user_id))
    return ChallengeOut(challenge=b64encode(got.data), expires_ms=got.expires_ms)


@router.post("/auth/token", responses=ERRORS)
async def token(body: TokenIn, node: NodeDep) -> TokenOut:
    """A short-lived token for the user's signature over a challenge of this node's."""
    user = user_param(body.user_id)
    public_key = parse_id(body.public_key, PUBLIC_KEY_LEN, "public key")
    issued, who = node.auth.sign_in(
        user, public_key, b64decode(body.challenge), b64decode(body.signature), body.device
    )
    return TokenOut(token=issued, user_id=user.hex(), device=who.device, expires_ms=who.expires_ms)


def bearer(connection: HTTPConnection) -> str | None:
    header = connection.headers.get("authorization")
    if header is not None:
        scheme, _, value = header.partition(" ")
        return value.strip() if scheme.lower() == "bearer" else None
    return connection.query_params.get("access_token")


def principal_of(connection: HTTPConnection, node: NodeApi) -> Principal:
    given = bearer(connection)
    if given is None:
        raise AuthRefused(401, "no_token", "sign in first: Authorization: Bearer <token>")
    return node.auth.verify(given)


async def _principal(request: Request, node: NodeDep) -> Principal:
    return principal_of(request, node)


async def _admin(request: Request, node: NodeDep) -> None:
    check_admin(node.admin_token, bearer(request))


Signed = Annotated[Principal, Depends(_principal)]
ADMIN = [Depends(_admin)]


def as_user(who: Principal, user: bytes) -> None:
    """403 ``wrong_user`` unless the token is ``user``'s."""
    if who.user_id != user:
        raise AuthRefused(403, "wrong_user", "this token is another user's")


async def as_reader(node: NodeApi, who: Principal, chat: bytes) -> None:
    """403 ``not_a_member`` unless the token's user may read the chat."""
    if not await trio.to_thread.run_sync(node.reads.may_read, chat, who.user_id):
        raise AuthRefused(403, "not_a_member", "only the chat's members read it")


async def held_here(node: NodeApi, who: Principal, chat: bytes) -> None:
    """421 (naming nodes that hold it) if the chat lies outside this node's scope — its
    messages and member ops alike, so whether the token's user may read it is the holders'
    to say — else as ``as_reader``."""
    if not node.holds_chat(chat):
        raise outside_scope(chat, node.config.network_shards)
    await as_reader(node, who, chat)
