"""The dm3 delivery service of a node: envelopes in by JSON-RPC, kept in the recipient's
inbox chat (replicated like any chat), fetched from any node, deleted when acknowledged.

The rules are the chat rules every replica already applies (``dm3/names.py``): this node
posts each accepted envelope as a message signed by its own dm3 key (``dm3.key`` beside the
database, 0600), which replicas accept because the recipient made that key an admin of their
inbox; it deletes acknowledged envelopes with DELETE messages, valid because it is an admin.
A sender is known by a token from dm3's sign-in (``challenge``/``sign_in``: the sender's
key signs a challenge of this node's), and must be the envelope's ``from``, whose key signs
the envelope's metadata.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from nacl.signing import SigningKey

from dm3 import rpc
from dm3.crypto import SCHEME, Dm3CryptoError, b64, encryption_keys, unb64
from dm3.envelope import (
    Delivered,
    EnvelopeError,
    add_postmark,
    check_sender,
    envelope_size,
    open_delivery_information,
    parse_envelope,
    unwrap,
    wrap,
)
from dm3.names import UnknownName, inbox_proof, name_of, user_of, user_or_none
from node.auth import Authenticator, AuthRefused, Principal, load_or_create_file
from node.intake import Submitted
from node.limits import StorageFull, TokenBuckets
from store.chatdb import ChatDb
from store.errors import InvalidInput
from store.hlc import HlcClock
from store.kinds import Claims
from store.messages import MAX_PAGE_LIMIT, Direction
from store.ops import Op, decode_identity_doc
from store.records import MessageKind, MsgV1, Role
from store.signing import user_id_from_key

KEY_FILE = "dm3.key"
CHALLENGE_PREFIX = "chatsync dm3 sign-in: "
POSTMARK_ROOM = 4096  # bytes the postmark and the wrapping add to an envelope
MESSAGE_TYPES = [
    "NEW", "DELETE_REQUEST", "EDIT", "REPLY", "REACTION", "READ_OPENED", "READ_RECEIVED",
    "RESEND_REQUEST",
]  # fmt: skip
MAX_PENDING = 10_000  # remembered challenges
MAX_FETCH = 1000  # envelopes per fetch: acknowledge them to get the next


@dataclass(frozen=True, slots=True)
class Recipient:
    user_id: bytes
    sign_key: bytes
    box_key: bytes

    @property
    def inbox(self) -> bytes:
        return inbox_proof(self.sign_key).chat_id()


def load_or_create_key(data: Path) -> SigningKey:
    seed = load_or_create_file(data / KEY_FILE, lambda: os.urandom(32).hex())
    return SigningKey(bytes.fromhex(seed))


class Dm3Gateway:
    def __init__(
        self,
        key: SigningKey,
        db: ChatDb,
        auth: Authenticator,
        submit: Callable[[list[Op]], Awaitable[Submitted]],
        *,
        now_ms: Callable[[], int],
        max_payload: int,
        retention_days: float,
        sender_ops_per_s: float = 20.0,
        random: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self.key, self.box = key, encryption_keys(key)
        self.user_id = user_id_from_key(bytes(key.verify_key))
        self._db, self._auth, self._submit = db, auth, submit
        self._now_ms, self._random = now_ms, random
        self._clock = HlcClock()
        self.size_limit = max_payload - POSTMARK_ROOM
        self.message_ttl_days = (
            int(retention_days) if retention_days.is_integer() else retention_days
        )
        self._challenges: dict[bytes, str] = {}  # user -> the last challenge given, in order
        self._senders = TokenBuckets(sender_ops_per_s, 5 * sender_ops_per_s)

    # --- what a dm3 client asks first ---

    def profile(self, url: str) -> dict[str, str]:
        """The delivery service profile (seed 001 §2.1.2) — what ENS would hold. The
        chatsync user a recipient adds is the hash of ``publicSigningKey``, as for anyone."""
        return {
            "publicSigningKey": b64(bytes(self.key.verify_key)),
            "publicEncryptionKey": b64(self.box.public),
            "url": url,
        }

    def properties(self) -> dict[str, Any]:
        """``dm3_getDeliveryServiceProperties``: messageTTL 0 = kept until acknowledged."""
        return {
            "messageTTL": self.message_ttl_days, "sizeLimit": self.size_limit,
            "notificationChannel": [],
        }  # fmt: skip

    async def profile_extension(self, name: str) -> dict[str, Any]:
        await self.recipient(name)
        return {"encryptionScheme": [SCHEME], "supportedMessageTypes": MESSAGE_TYPES}

    async def recipient(self, name: str) -> Recipient:
        """The user behind a dm3 name, by their replicated identity; RpcError if none."""
        try:
            user = user_of(name)
        except UnknownName as exc:
            raise rpc.RpcError(rpc.NOT_FOUND, str(exc)) from None
        found = await trio.to_thread.run_sync(self._db.get_identity, user)
        if found is None:
            raise rpc.RpcError(rpc.NOT_FOUND, f"no identity of {name_of(user)} on this node")
        doc = decode_identity_doc(found[1])  # verified when it was written
        return Recipient(user, doc.sign_key, doc.box_key)

    # --- sign-in (dm3-lib-delivery-api auth-http: GET then POST /auth/{name}) ---

    def challenge(self, name: str) -> str:
        """The text the user's dm3 signing key signs (dm3 signs text, chatsync bytes). dm3's
        client answers with the signature alone, so the last one given is remembered."""
        user = _user(name)
        text = CHALLENGE_PREFIX + self._auth.challenge(user).data.hex()
        self._challenges.pop(user, None)
        self._challenges[user] = text
        while len(self._challenges) > MAX_PENDING:  # bounded like the Authenticator's
            self._challenges.pop(next(iter(self._challenges)))
        return text

    async def sign_in(
        self, name: str, challenge: str | None, signature: str
    ) -> tuple[str, Principal]:
        found = await self.recipient(name)
        user = found.user_id
        if challenge is None:
            challenge = self._challenges.pop(user, None)
            if challenge is None:
                raise AuthRefused(401, "challenge_unknown", "ask for a challenge first")
        try:
            data = bytes.fromhex(challenge.removeprefix(CHALLENGE_PREFIX))
        except ValueError:
            raise AuthRefused(401, "bad_challenge", "not a challenge of this node's") from None
        try:
            raw_signature = unb64(signature, "signature")
        except Dm3CryptoError:
            raise AuthRefused(401, "bad_signature", "the signature is not base64") from None
        return self._auth.sign_in(
            user, found.sign_key, data, raw_signature, "dm3", signed=challenge.encode()
        )

    # --- dm3_submitMessage ---

    async def submit(self, params: list[Any]) -> str:
        if len(params) != 2 or not all(isinstance(p, str) for p in params):
            raise rpc.RpcError(rpc.INVALID_PARAMS, "params: [envelope JSON string, token]")
        try:
            sender = self._auth.verify(params[1])
        except AuthRefused as exc:
            raise rpc.RpcError(rpc.UNAUTHORIZED, f"Unauthorized: {exc}") from None
        if not self._senders.take(sender.user_id, 1, self._now_ms() / 1000):  # before any work
            raise rpc.RpcError(rpc.LIMIT_EXCEEDED, "Limit exceeded: too many envelopes, slow down")
        try:
            envelope = parse_envelope(params[0])
        except EnvelopeError as exc:
            raise rpc.RpcError(rpc.INVALID_PARAMS, f"Invalid params: {exc}") from None
        if envelope_size(envelope) > self.size_limit:
            raise rpc.RpcError(rpc.TOO_BIG, f"Too big: the limit is {self.size_limit} bytes")
        try:
            info = open_delivery_information(self.box, envelope)
        except EnvelopeError as exc:
            raise rpc.RpcError(rpc.INVALID_INPUT, f"Invalid input: {exc}") from None
        if user_or_none(info.sender) != sender.user_id:
            raise rpc.RpcError(rpc.UNAUTHORIZED, "Unauthorized: the token is not the sender's")
        sent_by, to = await self.recipient(info.sender), await self.recipient(info.to)
        try:
            check_sender(envelope, sent_by.sign_key)
        except EnvelopeError as exc:
            raise rpc.RpcError(rpc.UNAUTHORIZED, f"Unauthorized: {exc}") from None
        await self._check_service_of(to)
        now = self._now_ms()
        postmarked = add_postmark(envelope, self.key, to.box_key, now, self._random(44))
        payload = wrap(Delivered(postmarked, info, now))
        msg = MsgV1.create(self.key, to.inbox, self._clock.now(now), payload)
        await self._write([msg])
        return "success"

    async def _check_service_of(self, to: Recipient) -> None:
        info = await trio.to_thread.run_sync(self._db.get_member_info, to.inbox, self.user_id)
        if info is None or not info.active or info.role != Role.ADMIN:
            raise rpc.RpcError(
                rpc.UNAVAILABLE,
                f"this node is not a delivery service of {name_of(to.user_id)}: "
                "the recipient adds it (chatsync dm3 register)",
            )

    async def _write(self, ops: list[Op]) -> None:
        try:
            await self._submit(ops)
        except trio.WouldBlock:
            raise rpc.RpcError(rpc.LIMIT_EXCEEDED, "Limit exceeded: busy, retry") from None
        except StorageFull as exc:
            raise rpc.RpcError(rpc.UNAVAILABLE, f"Resource unavailable: {exc}") from None
        except InvalidInput as exc:
            code = rpc.LIMIT_EXCEEDED if exc.reason == "rate_limited" else rpc.INVALID_INPUT
            raise rpc.RpcError(code, f"{exc.reason}: {exc}") from None

    # --- the recipient fetches and acknowledges (dm3-lib-delivery-api messaging-http) ---

    async def kept(self, user_id: bytes, contact: str | None = None) -> list[Delivered]:
        """The envelopes waiting in the user's inbox, oldest first (at most ``MAX_FETCH``);
        those of ``contact`` only, if given."""
        to = await self.recipient(name_of(user_id))
        senders = None if contact is None else {user_or_none(contact)}
        found = await self._kept(to, senders, until_ms=None, limit=MAX_FETCH)
        return [kept for _, kept in found]

    async def acknowledge(self, user_id: bytes, contacts: list[str], until_ms: int) -> int:
        """Delete the envelopes of these contacts that came in at or before ``until_ms``:
        DELETE messages of this node's, which erase them on every node — valid only from a
        delivery service of the user (an admin of the inbox): RpcError UNAVAILABLE here if not."""
        to = await self.recipient(name_of(user_id))
        await self._check_service_of(to)
        found = await self._kept(to, {user_or_none(c) for c in contacts}, until_ms, limit=None)
        deletes: list[Op] = [
            MsgV1.create(
                self.key, m.chat_id, self._clock.update(m.hlc, self._now_ms()),
                Claims.of(m).encode(), kind=MessageKind.DELETE, ref=m.msg_id,
            )
            for m, _ in found
        ]  # fmt: skip
        if deletes:
            await self._write(deletes)
        return len(deletes)

    async def _kept(
        self,
        to: Recipient,
        senders: set[bytes | None] | None,
        until_ms: int | None,
        limit: int | None,
    ) -> list[tuple[MsgV1, Delivered]]:
        def wanted(kept: Delivered) -> bool:
            return (senders is None or user_or_none(kept.info.sender) in senders) and (
                until_ms is None or kept.incoming_ms <= until_ms
            )

        return await trio.to_thread.run_sync(kept_envelopes, self._db, to.inbox, wanted, limit)


def kept_envelopes(
    db: ChatDb,
    inbox: bytes,
    wanted: Callable[[Delivered], bool] = lambda _: True,
    limit: int | None = None,
) -> list[tuple[MsgV1, Delivered]]:
    """The envelopes kept in the inbox that are ``wanted``, oldest first, up to ``limit``: the
    NEW messages an admin of the inbox (a delivery service, or the user) posted, at their
    stamp, that are kept envelopes — a function of the replicated messages, deletes and
    member ops (any member may post there, and what a delete erased is gone)."""
    admins = db.admins(inbox)
    out: list[tuple[MsgV1, Delivered]] = []
    cursor: str | None = None
    while limit is None or len(out) < limit:
        page = db.range(inbox, cursor, MAX_PAGE_LIMIT, Direction.FORWARD)
        for item in page.items:
            msg = item.msg
            if msg.kind == MessageKind.NEW and admins(msg.sender, msg.hlc):
                kept = unwrap(msg.payload)
                if kept is not None and wanted(kept):
                    out.append((msg, kept))
        cursor = page.next_cursor
        if cursor is None:
            break
    return out[:limit]


def _user(name: str) -> bytes:
    try:
        return user_of(name)
    except UnknownName as exc:
        raise AuthRefused(404, "unknown_name", str(exc)) from None
