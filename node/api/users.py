"""A user's chat list and read position.

The read position and the unread counts come from the user's signed READ_RECEIPTs, which
sync like any message: they are the same on every node (MESSAGES.md, "READ_RECEIPT").
"""

from __future__ import annotations

import trio
from fastapi import APIRouter, Query, Response

from node.api.auth import Signed, as_user
from node.api.decode import chat_param, decode_receipt_in, user_param
from node.api.errors import ERRORS
from node.api.interface import NodeDep
from node.api.models import ChatsOut, HlcOut, ReadIn, ReadOut, chat_entry_out
from store.chat_reads import ChatReads
from store.hlc import Hlc
from store.messages import DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT

router = APIRouter()


@router.get("/users/{user_id}/chats", responses=ERRORS)
async def chats(
    user_id: str,
    node: NodeDep,
    who: Signed,
    cursor: str | None = Query(None, max_length=128, description="next_cursor of a page"),
    limit: int = Query(DEFAULT_PAGE_LIMIT, description=f"1..{MAX_PAGE_LIMIT}"),
) -> ChatsOut:
    """The user's chats, most recent first, with unread counts."""
    user = user_param(user_id)
    as_user(who, user)
    await node.settle_chat_lists()  # the API writes nothing itself: the writer does
    page = await trio.to_thread.run_sync(lambda: node.reads.read_user_chats(user, cursor, limit))
    return ChatsOut(
        user_id=user.hex(),
        chats=[chat_entry_out(item) for item in page.items],
        next_cursor=page.next_cursor,
    )


@router.get("/users/{user_id}/chats/{chat_id}/read", responses=ERRORS)
async def get_read(user_id: str, chat_id: str, node: NodeDep, who: Signed) -> ReadOut:
    """How far the user has read in the chat, by their receipts, and what is unread."""
    user, chat = user_param(user_id), chat_param(chat_id)
    as_user(who, user)
    position, unread = await trio.to_thread.run_sync(read_state, node.reads, user, chat)
    return read_out(user, chat, position, unread, moved=None)


@router.put("/users/{user_id}/chats/{chat_id}/read", responses={**ERRORS, 202: {"model": ReadOut}})
async def put_read(
    user_id: str, chat_id: str, body: ReadIn, node: NodeDep, who: Signed, response: Response
) -> ReadOut:
    """Move the read position: a READ_RECEIPT signed by the user, stored and synced like any
    message. Refused: another user's receipt (403 ``not_your_receipt``), one not ahead of
    the known position (409 ``receipt_backwards``). 202 if the user is not known to be a member
    yet (the receipt waits for the member op, as a post does)."""
    user, chat = user_param(user_id), chat_param(chat_id)
    as_user(who, user)
    receipt = decode_receipt_in(user, chat, body, max_payload=node.max_payload)
    submitted = await node.submit_ops([receipt], wait_for_room=False)
    if submitted.waiting[0]:
        response.status_code = 202
    position, unread = await trio.to_thread.run_sync(read_state, node.reads, user, chat)
    # the intake let it through only if it reads past the known position; a receipt it
    # already held, or one that waits for its member op, moved nothing
    return read_out(user, chat, position, unread, moved=submitted.new[0])


def read_state(reads: ChatReads, user: bytes, chat: bytes) -> tuple[Hlc | None, int]:
    position = reads.read_position(chat, user)
    return position, reads.unread_count(chat, user, position)


def read_out(
    user: bytes, chat: bytes, position: Hlc | None, unread: int, *, moved: bool | None
) -> ReadOut:
    return ReadOut(
        user_id=user.hex(), chat_id=chat.hex(),
        position=None if position is None else HlcOut.of(position), unread=unread, moved=moved,
    )  # fmt: skip
