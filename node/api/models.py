"""The HTTP API's request and response bodies (pydantic), and how stored things become them.

Ids are lowercase hex; bytes are URL-safe base64 (``node/api/decode.py``).
"""

from __future__ import annotations

import base64
from typing import Literal

from pydantic import BaseModel, Field

from store.authz import ChatProof, GroupProof
from store.feed import DeliveryState
from store.hlc import Hlc
from store.inbox import ChatListItem
from store.kinds import MessageView, Tombstone
from store.reads import UNREAD_CAP
from store.records import ChatKind, MemberInfo, MsgV1, Role

MAX_OPS_PER_REQUEST = 1024
UNREAD_DESCRIPTION = (
    "content messages by others after the user's read position, the same on every node; "
    f"counted up to {UNREAD_CAP} (that many or more)"
)


class OpIn(BaseModel):
    kind: int = Field(
        description="1 PutMessage (MsgV1), 2 MembershipOp, 3 PutIdentity (IdentityRecord)"
    )
    data: str = Field(description="the op's canonical CBOR, URL-safe base64")


class OpsIn(BaseModel):
    ops: list[OpIn] = Field(max_length=MAX_OPS_PER_REQUEST)


class OpsOut(BaseModel):
    accepted: int = Field(description="ops in the request (all valid, all written)")
    new: list[bool] = Field(description="per op: did it change this node's store")
    waiting: list[bool] = Field(
        description="per op: a message held until a member op admitting its sender arrives"
    )


class PeerIn(BaseModel):
    peer_id: str = Field(max_length=100)


class HlcOut(BaseModel):
    physical_ms: int
    logical: int

    @classmethod
    def of(cls, hlc: Hlc) -> HlcOut:
        return cls(physical_ms=hlc.physical_ms, logical=hlc.logical)


class MessageOut(BaseModel):
    id: str = Field(description="message id: BLAKE3 of the record, hex")
    chat_id: str
    sender: str = Field(description="user id, hex")
    hlc: HlcOut
    kind: int = Field(description="0 new, 1 edit, 2 reply, 3 reaction, 4 read receipt, 5 delete")
    payload: str = Field(description="opaque (for DMs: encrypted) bytes, URL-safe base64")
    ref: str | None = Field(description="id of the message referred to, hex (null for new)")
    seq: int = Field(description="this node's local sequence number in the chat")
    author_key: str = Field(description="ed25519 public key of the sender, hex")
    sig: str = Field(description="ed25519 signature, URL-safe base64")
    # the folded view (MESSAGES.md); absent from the raw op log
    edit: MessageOut | None = Field(
        default=None, description="the author's latest edit (signed, checkable): show its payload"
    )
    reactions: dict[str, list[str]] = Field(
        default_factory=dict, description="reaction key (URL-safe base64) -> user ids (hex)"
    )
    reply_state: str | None = Field(
        default=None, description="a reply's target: present, deleted, unknown"
    )


class TombstoneOut(BaseModel):
    """Where a deleted message was; its payload is gone from every replica."""

    id: str
    hlc: HlcOut
    sender: str = Field(description="who wrote it, as the delete states")
    deleted_by: str
    deleted_at: HlcOut


class HistoryOut(BaseModel):
    chat_id: str
    messages: list[MessageOut]
    tombstones: list[TombstoneOut] = Field(
        default_factory=list, description="folded view: deleted messages within this page"
    )
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null: done")


class OriginalsOut(BaseModel):
    chat_id: str
    ops: list[str] = Field(
        description="signed ops as their signers made them: canonical CBOR, URL-safe base64 "
        "(POST /ops takes them back)"
    )
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null: done")


class ChatEntryOut(BaseModel):
    chat_id: str
    kind: str = Field(description="dm, group or channel")
    last_ts: int = Field(description="physical ms of the newest message")
    last_msg_id: str
    last_sender: str
    last_seq: int
    preview: str
    unread: int = Field(description=UNREAD_DESCRIPTION)


class ChatsOut(BaseModel):
    user_id: str
    chats: list[ChatEntryOut]
    next_cursor: str | None


class ReadIn(BaseModel):
    receipt: str = Field(
        description="the user's signed READ_RECEIPT (MsgV1) for the chat: canonical CBOR, "
        "URL-safe base64"
    )


class ReadOut(BaseModel):
    user_id: str
    chat_id: str
    position: HlcOut | None = Field(
        description="the stamp of the newest message the user has read (null: none yet), "
        "from their signed receipts"
    )
    unread: int = Field(description=UNREAD_DESCRIPTION)
    moved: bool | None = Field(default=None, description="PUT only: did the position move")


class MemberOut(BaseModel):
    user_id: str
    role: str
    added_at: HlcOut


class MembersOut(BaseModel):
    chat_id: str
    members: list[MemberOut]


class GroupProofOut(BaseModel):
    kind: Literal["group"] = "group"
    creator_key: str = Field(description="the creator's ed25519 public key, hex")
    nonce: str = Field(description="16 bytes, hex: chat id = BLAKE3(tag, creator_key, nonce)")
    creator: str = Field(description="the creator's user id, hex")


class DmProofOut(BaseModel):
    kind: Literal["dm"] = "dm"
    users: list[str] = Field(description="the two parties' user ids, hex")


class IdentityIn(BaseModel):
    data: str = Field(description="the signed IdentityRecord's canonical CBOR, URL-safe base64")


class IdentityOut(BaseModel):
    user_id: str
    hlc: HlcOut
    blob: str = Field(description="the IdentityDoc (keys + signature), URL-safe base64")


class IdentityPutOut(BaseModel):
    user_id: str
    new: bool = Field(description="did the record replace what this node had")


class ChallengeIn(BaseModel):
    user_id: str = Field(description="who signs in, hex")


class ChallengeOut(BaseModel):
    challenge: str = Field(description="the bytes to sign with the user's key, URL-safe base64")
    expires_ms: int


class TokenIn(BaseModel):
    user_id: str
    public_key: str = Field(description="the user's ed25519 public key, hex")
    challenge: str = Field(description="as POST /auth/challenge gave it", max_length=256)
    signature: str = Field(description="ed25519 over the challenge's bytes, base64", max_length=128)
    device: str = Field("default", max_length=32, description="names this client (delivery)")


class TokenOut(BaseModel):
    token: str = Field(description="Authorization: Bearer <token> (or ?access_token=)")
    user_id: str
    device: str
    expires_ms: int


class EventOut(BaseModel):
    position: str = Field(description="resume after this event: ?since=<position>")
    type: Literal["message", "delete", "member", "hidden"]
    chat_id: str
    message: MessageOut | None = Field(None, description="message, delete: the signed record")
    member_op: str | None = Field(None, description="member: the signed op, base64 (POST /ops)")
    msg_id: str | None = Field(
        None, description="hidden: the message no longer shown; truncated: the message's id"
    )
    truncated: bool = Field(
        False, description="a message too big for the stream: GET /chats/{chat}/messages/{id}"
    )


class EventsOut(BaseModel):
    events: list[EventOut]
    next: str = Field(description="the token to go on from (?since=)")


class DeliveryOut(BaseModel):
    user_id: str
    devices: dict[str, str] = Field(description="device -> the token it acknowledged last")


class RecipientOut(BaseModel):
    user_id: str
    state: DeliveryState
    devices: dict[str, bool] = Field(
        description="the user's devices on this node: delivered to each"
    )


class MessageDeliveryOut(BaseModel):
    msg_id: str
    recipients: list[RecipientOut]


class ErrorOut(BaseModel):
    code: str
    message: str


def b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii")


def message_out(m: MsgV1, seq: int) -> MessageOut:
    return MessageOut(
        id=m.msg_id.hex(), chat_id=m.chat_id.hex(), sender=m.sender.hex(), hlc=HlcOut.of(m.hlc),
        kind=int(m.kind), payload=b64encode(m.payload), ref=None if m.ref is None else m.ref.hex(),
        seq=seq, author_key=m.author_key.hex(), sig=b64encode(m.sig),
    )  # fmt: skip


def folded_out(view: MessageView, seq: int) -> MessageOut:
    out = message_out(view.msg, seq)
    out.edit = None if view.edit is None else message_out(view.edit, 0)
    out.reactions = {b64encode(k): [u.hex() for u in users] for k, users in view.reactions.items()}
    out.reply_state = view.reply_state
    return out


def tombstone_out(t: Tombstone) -> TombstoneOut:
    return TombstoneOut(
        id=t.msg_id.hex(), hlc=HlcOut.of(t.hlc), sender=t.sender.hex(),
        deleted_by=t.deleted_by.hex(), deleted_at=HlcOut.of(t.deleted_at),
    )  # fmt: skip


def member_out(user: bytes, info: MemberInfo) -> MemberOut:
    return MemberOut(
        user_id=user.hex(), role=Role(info.role).name.lower(), added_at=HlcOut.of(info.added_at)
    )


def proof_out(proof: ChatProof) -> GroupProofOut | DmProofOut:
    if isinstance(proof, GroupProof):
        return GroupProofOut(
            creator_key=proof.creator_key.hex(),
            nonce=proof.nonce.hex(),
            creator=proof.creator.hex(),
        )
    return DmProofOut(users=[proof.user_a.hex(), proof.user_b.hex()])


def chat_entry_out(item: ChatListItem) -> ChatEntryOut:
    e = item.entry
    return ChatEntryOut(
        chat_id=e.chat_id.hex(), kind=ChatKind(e.kind).name.lower(), last_ts=e.last_ts,
        last_msg_id=e.last_msg_id.hex(), last_sender=e.last_sender.hex(), last_seq=e.last_seq,
        preview=e.last_text_preview, unread=item.unread,
    )  # fmt: skip
