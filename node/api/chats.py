"""A chat's history, members, signed originals and proof (reads, in a worker thread: RocksDB
calls block).

History, members and the signed originals (member ops, deletes: what an export re-submits)
are for those who may read the chat (a token: ``node/api/auth.py``);
the proof is open — a client needs it to sign member ops before it is a member."""

from __future__ import annotations

from collections.abc import Callable

import trio
from fastapi import APIRouter, Query

from node.api.auth import Signed, held_here
from node.api.decode import chat_param, msg_id_param
from node.api.errors import ERRORS, NotFound
from node.api.interface import NodeApi, NodeDep
from node.api.models import (
    DmProofOut,
    GroupProofOut,
    HistoryOut,
    MembersOut,
    MessageOut,
    OriginalsOut,
    b64encode,
    folded_out,
    member_out,
    message_out,
    proof_out,
    tombstone_out,
)
from node.auth import Principal
from node.intake import outside_scope
from store.chat_reads import ChatReads
from store.messages import DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT, Direction
from store.originals import OriginalsPage
from store.records import MessageKind

router = APIRouter()
CURSOR = Query(None, max_length=128, description="next_cursor of a page")
LIMIT = Query(DEFAULT_PAGE_LIMIT, description=f"1..{MAX_PAGE_LIMIT}")


@router.get("/chats/{chat_id}/messages", responses=ERRORS)
async def history(
    chat_id: str,
    node: NodeDep,
    who: Signed,
    cursor: str | None = CURSOR,
    limit: int = LIMIT,
    direction: Direction = Query(Direction.BACKWARD, description="backward: newest first"),
    raw: bool = Query(False, description="the op log: edits, reactions, receipts as rows"),
    kind: MessageKind | None = Query(None, description="the op log's messages of this kind only"),
) -> HistoryOut:
    """One page of a chat's history in (HLC, local seq) order: as readers see it (MESSAGES.md:
    messages with their latest edit, reactions and reply state; tombstones), or ``raw`` (or
    of one ``kind``: a client gathers a group's key grants with ``kind=6``)."""
    chat = chat_param(chat_id)
    await held_here(node, who, chat)
    reads = node.reads
    if raw or kind is not None:
        kinds = None if kind is None else frozenset({kind})
        page = await trio.to_thread.run_sync(
            lambda: reads.range(chat, cursor, limit, direction, kinds=kinds)
        )
        return HistoryOut(
            chat_id=chat.hex(),
            messages=[message_out(item.msg, item.seq) for item in page.items],
            next_cursor=page.next_cursor,
        )
    folded = await trio.to_thread.run_sync(
        lambda: reads.folded_range(chat, cursor, limit, direction)
    )
    return HistoryOut(
        chat_id=chat.hex(),
        messages=[folded_out(folded.view(item), item.seq) for item in folded.items],
        tombstones=[tombstone_out(t) for t in folded.tombstones],
        next_cursor=folded.next_cursor,
    )


@router.get("/chats/{chat_id}/messages/{msg_id}", responses=ERRORS)
async def one_message(chat_id: str, msg_id: str, node: NodeDep, who: Signed) -> MessageOut:
    """One message of the chat as stored (signed: a client checks it), e.g. to quote its
    sender, stamp and kind in a delete. 404 ``not_found``: not held here (or erased)."""
    chat, wanted = chat_param(chat_id), msg_id_param(msg_id)
    await held_here(node, who, chat)
    msg = await trio.to_thread.run_sync(node.reads.get_message, wanted)
    if msg is None or msg.chat_id != chat:
        raise NotFound("not_found", f"this node holds no message {msg_id} in chat {chat_id}")
    return message_out(msg, 0)


@router.get("/chats/{chat_id}/hidden-grants", responses=ERRORS)
async def hidden_grants(chat_id: str, node: NodeDep, who: Signed) -> HistoryOut:
    """The chat's key grants that it hides, every sender's, oldest first (the newest 200):
    stamped while, as the member ops showed later, their sender was no member. Each boxes
    keys to its recipients only, keys of valid messages that no other grant may carry
    (SECURITY.md, "Hand-overs")."""
    chat = chat_param(chat_id)
    await held_here(node, who, chat)
    items = await trio.to_thread.run_sync(node.reads.hidden_grants, chat)
    return HistoryOut(
        chat_id=chat.hex(),
        messages=[message_out(item.msg, item.seq) for item in items],
        next_cursor=None,
    )


@router.get("/chats/{chat_id}/members", responses=ERRORS)
async def members(chat_id: str, node: NodeDep, who: Signed) -> MembersOut:
    """The chat's active members (the CRDT rows whose last add beats their last remove)."""
    chat = chat_param(chat_id)
    await held_here(node, who, chat)
    rows = await trio.to_thread.run_sync(node.reads.list_members_with_info, chat)
    return MembersOut(chat_id=chat.hex(), members=[member_out(user, info) for user, info in rows])


@router.get("/chats/{chat_id}/member-ops", responses=ERRORS)
async def member_ops(
    chat_id: str, node: NodeDep, who: Signed, cursor: str | None = CURSOR, limit: int = LIMIT
) -> OriginalsOut:
    """The chat's signed member ops, every one this node holds (the members list folds them
    into rows): what an export re-submits elsewhere."""
    return await originals(node, who, chat_id, lambda db, chat: db.member_ops_page(chat, cursor, limit))  # fmt: skip


@router.get("/chats/{chat_id}/deletes", responses=ERRORS)
async def deletes(
    chat_id: str, node: NodeDep, who: Signed, cursor: str | None = CURSOR, limit: int = LIMIT
) -> OriginalsOut:
    """The chat's signed DELETE messages (the history shows them as tombstones): what an
    export re-submits elsewhere."""
    return await originals(node, who, chat_id, lambda db, chat: db.deletes_page(chat, cursor, limit))  # fmt: skip


async def originals(
    node: NodeApi,
    who: Principal,
    chat_id: str,
    read: Callable[[ChatReads, bytes], OriginalsPage],
) -> OriginalsOut:
    """Member ops and deletes alike follow the chat's shard."""
    chat = chat_param(chat_id)
    await held_here(node, who, chat)
    page = await trio.to_thread.run_sync(read, node.reads, chat)
    return OriginalsOut(
        chat_id=chat.hex(), ops=[b64encode(op) for op in page.originals],
        next_cursor=page.next_cursor,
    )  # fmt: skip


@router.get("/chats/{chat_id}/proof", responses=ERRORS)
async def proof(chat_id: str, node: NodeDep) -> GroupProofOut | DmProofOut:
    """Who controls the chat (store.authz): the group's creator key and nonce, or the DM's two
    users — what a client needs to sign member ops. 404 ``unknown_chat``: no member op here;
    421 outside this node's scope (its member ops follow the chat)."""
    chat = chat_param(chat_id)
    if not node.holds_chat(chat):
        raise outside_scope(chat, node.config.network_shards)
    found = await trio.to_thread.run_sync(node.reads.chat_proof, chat)
    if found is None:
        raise NotFound("unknown_chat", f"this node holds no member op of chat {chat.hex()}")
    return proof_out(found)
