"""What the HTTP handlers decode from a request: path ids, URL-safe base64, op bodies.

Each raises the store's ``InvalidInput`` with a reason (``bad_id``, ``bad_base64``,
``user_mismatch``, or a decoder's) that ``node/api/errors.py`` turns into a 4xx. The
fuzz target ``http`` (tests/fuzz/fuzz_http.py) runs these on millions of inputs.
"""

from __future__ import annotations

import base64
import binascii

from node.api.models import IdentityIn, OpsIn, ReadIn
from store.errors import InvalidInput
from store.keys import CHAT_ID_LEN, MSG_ID_LEN, USER_ID_LEN
from store.ops import Op, decode_op
from store.records import IdentityRecord, MessageKind, MsgV1, decode_identity_record, decode_msg


def b64decode(value: str) -> bytes:
    """Strict URL-safe base64 (padding optional); InvalidInput ``bad_base64`` otherwise."""
    try:
        raw = value.encode("ascii")
        return base64.b64decode(raw + b"=" * (-len(raw) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError) as exc:  # not ASCII, not base64
        raise InvalidInput(f"not URL-safe base64: {exc}", reason="bad_base64") from None


def parse_id(value: str, length: int, what: str) -> bytes:
    """A hex id of exactly ``length`` bytes from a path; InvalidInput ``bad_id`` otherwise."""
    if len(value) != 2 * length:
        raise InvalidInput(
            f"{what} must be {2 * length} hex digits ({length} bytes), got {len(value)} characters",
            reason="bad_id",
        )
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise InvalidInput(f"{what} is not hex", reason="bad_id") from None
    if len(raw) != length:  # fromhex skips whitespace: "00 00 ..." is 2·length chars, fewer bytes
        raise InvalidInput(f"{what} must be {length} bytes of hex, got {len(raw)}", reason="bad_id")
    return raw


def chat_param(chat_id: str) -> bytes:
    return parse_id(chat_id, CHAT_ID_LEN, "chat id")


def user_param(user_id: str) -> bytes:
    return parse_id(user_id, USER_ID_LEN, "user id")


def msg_id_param(msg_id: str) -> bytes:
    return parse_id(msg_id, MSG_ID_LEN, "message id")


def decode_ops_in(body: OpsIn, *, max_payload: int) -> list[Op]:
    """The ops of a ``POST /ops`` body; InvalidInput (``bad_base64``, a decode reason) if any is bad."""
    return [decode_op(op.kind, b64decode(op.data), max_payload=max_payload) for op in body.ops]


def decode_identity_in(user: bytes, body: IdentityIn) -> IdentityRecord:
    """The record of a ``PUT /identity/{user}`` body; InvalidInput unless it decodes and is ``user``'s."""
    record = decode_identity_record(b64decode(body.data))
    if record.user_id != user:
        raise InvalidInput(
            f"the record is for user {record.user_id.hex()}, not {user.hex()}",
            reason="user_mismatch",
        )
    return record


def decode_receipt_in(user: bytes, chat: bytes, body: ReadIn, *, max_payload: int) -> MsgV1:
    """The receipt of a ``PUT /users/{user}/chats/{chat}/read`` body; InvalidInput unless it
    decodes, is a READ_RECEIPT, is for ``chat`` and is ``user``'s (its signature and position
    are the intake's to check, as for any message)."""
    msg = decode_msg(b64decode(body.receipt), max_payload=max_payload)
    if msg.kind is not MessageKind.READ_RECEIPT:
        raise InvalidInput(
            f"a {msg.kind.name} message is not a read receipt", reason="not_a_receipt"
        )
    if msg.chat_id != chat:
        raise InvalidInput(f"the receipt is for chat {msg.chat_id.hex()}", reason="wrong_chat")
    if msg.sender != user:
        raise InvalidInput(
            f"the receipt is user {msg.sender.hex()}'s, not {user.hex()}'s",
            reason="not_your_receipt",
        )
    return msg
