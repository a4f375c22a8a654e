"""A chat's history, members and proof (reads, in a worker thread: RocksDB calls block)."""

from __future__ import annotations

import trio
from fastapi import APIRouter, Query

from node.api.decode import chat_param
from node.api.errors import ERRORS, NotFound
from node.api.interface import NodeDep
from node.api.models import (
    DmProofOut,
    GroupProofOut,
    HistoryOut,
    MembersOut,
    member_out,
    message_out,
    proof_out,
)
from store.messages import DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT, Direction

router = APIRouter()


@router.get("/chats/{chat_id}/messages", responses=ERRORS)
async def history(
    chat_id: str,
    node: NodeDep,
    cursor: str | None = Query(None, max_length=128, description="next_cursor of a page"),
    limit: int = Query(DEFAULT_PAGE_LIMIT, description=f"1..{MAX_PAGE_LIMIT}"),
    direction: Direction = Query(Direction.BACKWARD, description="backward: newest first"),
) -> HistoryOut:
    """One page of a chat's history in (HLC, local seq) order."""
    chat = chat_param(chat_id)
    page = await trio.to_thread.run_sync(lambda: node.db.range(chat, cursor, limit, direction))
    return HistoryOut(
        chat_id=chat.hex(),
        messages=[message_out(item) for item in page.items],
        next_cursor=page.next_cursor,
    )


@router.get("/chats/{chat_id}/members", responses=ERRORS)
async def members(chat_id: str, node: NodeDep) -> MembersOut:
    """The chat's active members (the CRDT rows whose last add beats their last remove)."""
    chat = chat_param(chat_id)
    rows = await trio.to_thread.run_sync(node.db.list_members_with_info, chat)
    return MembersOut(chat_id=chat.hex(), members=[member_out(user, info) for user, info in rows])


@router.get("/chats/{chat_id}/proof", responses=ERRORS)
async def proof(chat_id: str, node: NodeDep) -> GroupProofOut | DmProofOut:
    """Who controls the chat (store.authz): the group's creator key and nonce, or the DM's two
    users — what a client needs to sign member ops. 404 ``unknown_chat``: no member op here."""
    chat = chat_param(chat_id)
    found = await trio.to_thread.run_sync(node.db.chat_proof, chat)
    if found is None:
        raise NotFound("unknown_chat", f"this node holds no member op of chat {chat.hex()}")
    return proof_out(found)
