"""A user's chat list and read progress (local conveniences of this node).

Read progress is not signed, not synced, not authenticated: a convenience for the
clients of this node, counted in this node's local seqs. It is still written by the
node's writer, like everything else.
"""

from __future__ import annotations

import trio
from fastapi import APIRouter, Query

from node.api.decode import chat_param, user_param
from node.api.errors import ERRORS
from node.api.interface import NodeDep
from node.api.models import ChatsOut, ReadIn, ReadOut, chat_entry_out
from node.writer import ReadProgress
from store.chatdb import ChatDb
from store.messages import DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT

router = APIRouter()


@router.get("/users/{user_id}/chats", responses=ERRORS)
async def chats(
    user_id: str,
    node: NodeDep,
    cursor: str | None = Query(None, max_length=128, description="next_cursor of a page"),
    limit: int = Query(DEFAULT_PAGE_LIMIT, description=f"1..{MAX_PAGE_LIMIT}"),
) -> ChatsOut:
    """The user's chats, most recent first, with unread counts (local to this node)."""
    user = user_param(user_id)
    page = await trio.to_thread.run_sync(lambda: node.db.list_user_chats(user, cursor, limit))
    return ChatsOut(
        user_id=user.hex(),
        chats=[chat_entry_out(item) for item in page.items],
        next_cursor=page.next_cursor,
    )


@router.get("/users/{user_id}/chats/{chat_id}/read", responses=ERRORS)
async def get_read(user_id: str, chat_id: str, node: NodeDep) -> ReadOut:
    """How far the user has read in the chat (local seq; a convenience of this node)."""
    user, chat = user_param(user_id), chat_param(chat_id)
    progress = await trio.to_thread.run_sync(read_progress, node.db, user, chat)
    return read_out(user, chat, progress, moved=None)


@router.put("/users/{user_id}/chats/{chat_id}/read", responses=ERRORS)
async def put_read(user_id: str, chat_id: str, body: ReadIn, node: NodeDep) -> ReadOut:
    """Move the read progress forward (never back; capped at the chat's last seq).

    Read progress is local to this node: not signed, not synced, not authenticated —
    a convenience for the clients of this node, counted in this node's local seqs.
    """
    user, chat = user_param(user_id), chat_param(chat_id)
    progress = await node.move_read_progress(user, chat, body.seq)
    return read_out(user, chat, progress, moved=progress.moved)


def read_progress(db: ChatDb, user: bytes, chat: bytes) -> ReadProgress:
    meta = db.get_chat_meta(chat)
    last_seq = meta.last_seq if meta is not None else 0
    return ReadProgress(db.get_user_read_progress(user, chat), last_seq, moved=False)


def read_out(user: bytes, chat: bytes, progress: ReadProgress, *, moved: bool | None) -> ReadOut:
    return ReadOut(
        user_id=user.hex(), chat_id=chat.hex(), seq=progress.seq, last_seq=progress.last_seq,
        unread=progress.unread, moved=moved,
    )  # fmt: skip
