"""A small synchronous client of the node's HTTP API (httpx), used by the CLI and the tests.

Every method maps one endpoint. A refusal (4xx/5xx) raises ``ChatsyncClientError``
with the server's ``code`` and ``message``; a node that cannot be reached raises it
with ``code="unreachable"`` and status 0. Records that come back are rebuilt and
checked (a message's signature and id, an identity's self-certification), so a
client need not trust the node it talks to.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from nacl.signing import SigningKey

from store.authz import AdminGrant, ChatProof, DmProof, GroupProof
from store.errors import InvalidInput
from store.hlc import Hlc, HlcClock
from store.kinds import Tombstone, edit_applies
from store.messages import DEFAULT_PAGE_LIMIT
from store.ops import (
    IdentityDoc,
    MembershipAction,
    MembershipOp,
    Op,
    OpKind,
    decode_membership_op,
    decode_op,
    encode_op,
    op_kind,
    verify_identity,
)
from store.records import IdentityRecord, MessageKind, MsgV1, Role
from store.signing import user_id_from_key


@dataclass(frozen=True)
class Posted:
    new: list[bool]  # per op: was it new to the node
    waiting: list[bool]  # per op: a message held until a member op admits its sender


class ChatsyncClientError(Exception):
    """The node refused a request (``status`` 4xx/5xx) or could not be reached (status 0)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}" + (f" (HTTP {status})" if status else ""))
        self.status = status
        self.code = code
        self.message = message


def b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii")


def b64decode(value: str) -> bytes:
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))


def hlc_of(value: dict[str, int]) -> Hlc:
    return Hlc(value["physical_ms"], value["logical"])


@dataclass(frozen=True)
class Message:
    msg: MsgV1  # rebuilt from the JSON; its signature and id were checked
    seq: int
    edit: MsgV1 | None = None  # the author's latest edit (checked: it applies to ``msg``)
    reactions: dict[bytes, tuple[bytes, ...]] = field(default_factory=dict)  # key -> users
    reply_state: str | None = None

    @property
    def id(self) -> bytes:
        return self.msg.msg_id

    @property
    def payload(self) -> bytes:
        """What readers see: the latest edit's payload, or the message's own."""
        return self.edit.payload if self.edit is not None else self.msg.payload


@dataclass(frozen=True)
class HistoryPage:
    messages: list[Message]
    next_cursor: str | None
    tombstones: list[Tombstone] = field(default_factory=list)


@dataclass(frozen=True)
class SignedPage:
    ops: list[Op]  # each decoded, its signature checked, in the chat asked for
    next_cursor: str | None


@dataclass(frozen=True)
class Member:
    user_id: bytes
    role: Role
    added_at: Hlc


def proof_from_json(chat_id: bytes, item: dict[str, Any]) -> ChatProof:
    """Rebuild a chat's proof from the API's JSON; InvalidInput unless it derives ``chat_id``."""
    proof: ChatProof
    try:
        if item["kind"] == "group":
            proof = GroupProof(bytes.fromhex(item["creator_key"]), bytes.fromhex(item["nonce"]))
        else:
            user_a, user_b = (bytes.fromhex(u) for u in item["users"])
            proof = DmProof(user_a, user_b)
        derived = proof.chat_id()
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInput(f"the node sent a malformed chat proof: {exc}") from None
    if derived != chat_id:  # a node could claim anyone controls the chat
        raise InvalidInput("the node sent a chat proof that does not derive this chat id")
    return proof


def message_from_json(item: dict[str, Any]) -> Message:
    """Rebuild a MsgV1 from the API's JSON; InvalidInput if it is forged or altered."""
    ref = item.get("ref")
    try:
        msg = MsgV1(
            chat_id=bytes.fromhex(item["chat_id"]), sender=bytes.fromhex(item["sender"]),
            hlc=hlc_of(item["hlc"]), kind=MessageKind(item["kind"]),
            payload=b64decode(item["payload"]), ref=None if ref is None else bytes.fromhex(ref),
            author_key=bytes.fromhex(item["author_key"]), sig=b64decode(item["sig"]),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInput(f"the node sent a malformed message: {exc}") from None
    msg.verify()
    if msg.msg_id.hex() != item["id"]:
        raise InvalidInput("the node sent a message whose id does not match its content")
    edit = None if item.get("edit") is None else message_from_json(item["edit"]).msg
    if edit is not None and not (edit.ref == msg.msg_id and edit_applies(edit, msg)):
        raise InvalidInput("the node sent an edit that does not apply to its message")
    try:
        reactions = {
            b64decode(k): tuple(bytes.fromhex(u) for u in users)
            for k, users in item.get("reactions", {}).items()
        }
    except (AttributeError, TypeError, ValueError) as exc:
        raise InvalidInput(f"the node sent malformed reactions: {exc}") from None
    return Message(msg, int(item["seq"]), edit, reactions, item.get("reply_state"))


@dataclass(frozen=True)
class Event:
    position: str  # a token: go on after this event
    type: str  # message, delete, member, hidden
    chat_id: bytes
    msg: MsgV1 | None = None  # message, delete (checked)
    member_op: MembershipOp | None = None  # member (checked)
    msg_id: bytes | None = None  # hidden: the message no longer shown; truncated: its id
    truncated: bool = False  # a message too big for the stream: ``ChatsyncClient.message``


@dataclass(frozen=True)
class Events:
    events: list[Event]
    next: str  # since= for the next call


def event_from_json(item: dict[str, Any]) -> Event:
    """Rebuild an event; InvalidInput if its record is forged or malformed."""
    try:
        chat = bytes.fromhex(item["chat_id"])
        msg = None if item.get("message") is None else message_from_json(item["message"]).msg
        member_op = None
        if item.get("member_op") is not None:
            member_op = decode_membership_op(b64decode(item["member_op"]))
            member_op.verify()  # BadSignature (InvalidInput) if forged
        hidden = None if item.get("msg_id") is None else bytes.fromhex(item["msg_id"])
        truncated = bool(item.get("truncated", False))
        return Event(
            str(item["position"]), str(item["type"]), chat, msg, member_op, hidden, truncated
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInput(f"the node sent a malformed event: {exc}") from None


def original_from_b64(chat_id: bytes, kind: OpKind, data: Any) -> Op:
    """A signed op the node returned as it was signed; InvalidInput if forged, malformed, of
    another kind or of another chat."""
    try:
        op = decode_op(kind, b64decode(data))
    except (TypeError, ValueError, AttributeError) as exc:
        raise InvalidInput(f"the node sent a malformed op: {exc}") from None
    if isinstance(op, MsgV1) and op.kind is not MessageKind.DELETE:
        raise InvalidInput(f"the node sent a {op.kind.name} message among the deletes")
    if not isinstance(op, MsgV1 | MembershipOp) or op.chat_id != chat_id:
        raise InvalidInput("the node sent an op of another chat")
    op.verify()  # BadSignature (InvalidInput) if forged
    return op


def tombstone_from_json(item: dict[str, Any]) -> Tombstone:
    try:
        return Tombstone(
            bytes.fromhex(item["id"]), hlc_of(item["hlc"]), bytes.fromhex(item["sender"]),
            bytes.fromhex(item["deleted_by"]), hlc_of(item["deleted_at"]),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInput(f"the node sent a malformed tombstone: {exc}") from None


class ChatsyncClient:
    """``key``: the user's, to sign in with (lazily, when a call needs a token: the chat list,
    history, members, read state, events); ``device`` names this client in its delivery
    state; ``admin_token``: the node's, for the partition switch."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 10.0,
        key: SigningKey | None = None,
        device: str = "default",
        admin_token: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout)
        self.clock = HlcClock()
        self.key, self.device, self.admin_token = key, device, admin_token
        self._token: str | None = None
        self._token_expires_ms = 0

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ChatsyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing ---

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ChatsyncClientError(
                0, "unreachable", f"cannot reach the node at {self.base_url}: {exc}"
            ) from None
        if response.is_success:
            if response.headers.get("content-type", "").startswith("application/json"):
                return response.json()
            return response.text
        try:
            body = response.json()
            code, message = str(body["code"]), str(body["message"])
        except (ValueError, KeyError, TypeError):
            code, message = "http_error", response.text[:200] or response.reason_phrase
        raise ChatsyncClientError(response.status_code, code, message)

    def sign_in(self) -> str:
        """A token for ``key``'s user: sign this node's challenge (``node/auth.py``)."""
        if self.key is None:
            raise ChatsyncClientError(0, "no_key", "this call needs the user's key (--key)")
        public = bytes(self.key.verify_key)
        user = user_id_from_key(public)
        issued = self._request("POST", "/auth/challenge", json={"user_id": user.hex()})
        signature = self.key.sign(b64decode(issued["challenge"])).signature
        body = {
            "user_id": user.hex(), "public_key": public.hex(), "challenge": issued["challenge"],
            "signature": b64encode(signature), "device": self.device,
        }  # fmt: skip
        result = self._request("POST", "/auth/token", json=body)
        self._token, self._token_expires_ms = result["token"], int(result["expires_ms"])
        return self._token

    def token(self) -> str:
        """A token good for at least another 30 s (signing in when there is none)."""
        if self._token is None or self._token_expires_ms < time.time() * 1000 + 30_000:
            return self.sign_in()
        return self._token

    def forget_token(self) -> None:
        """Sign in again on the next call (the node refused the token)."""
        self._token = None

    def _signed(self, method: str, path: str, **kwargs: Any) -> Any:
        """``_request`` with the user's token; signs in again once if the node forgot it (a
        restart with a new secret) or it expired."""
        for attempt in (1, 2):
            headers = {"authorization": f"Bearer {self.token()}"}
            try:
                return self._request(method, path, headers=headers, **kwargs)
            except ChatsyncClientError as exc:
                if attempt == 2 or exc.code not in ("bad_token", "token_expired"):
                    raise
                self.forget_token()
        raise AssertionError("unreachable")

    def _admin(self, method: str, path: str, **kwargs: Any) -> Any:
        if self.admin_token is None:
            raise ChatsyncClientError(0, "no_token", "this call needs the node's admin token")
        headers = {"authorization": f"Bearer {self.admin_token}"}
        return self._request(method, path, headers=headers, **kwargs)

    def now(self) -> Hlc:
        """The next stamp of this client's HLC (wall clock)."""
        return self.clock.now(int(time.time() * 1000))

    # --- writes ---

    def post(self, ops: list[Op]) -> Posted:
        """Submit signed ops: per op, whether it was new to the node, and whether it is a
        message the node holds until a member op admits its sender."""
        body = {"ops": [{"kind": int(op_kind(op)), "data": b64encode(encode_op(op))} for op in ops]}
        result = self._request("POST", "/ops", json=body)
        return Posted([bool(x) for x in result["new"]], [bool(x) for x in result["waiting"]])

    def post_ops(self, ops: list[Op]) -> list[bool]:
        """Submit signed ops; per op, whether it was new to the node."""
        return self.post(ops).new

    def send_message(
        self,
        key: SigningKey,
        chat_id: bytes,
        payload: bytes,
        *,
        kind: MessageKind = MessageKind.NEW,
        ref: bytes | None = None,
        extra_ops: list[Op] | None = None,
    ) -> MsgV1:
        """Sign ``payload`` as a message of ``key``'s user in ``chat_id`` and post it.

        ``extra_ops`` (identity, memberships) go first, in the same request.
        """
        msg = MsgV1.create(key, chat_id, self.now(), payload, kind=kind, ref=ref)
        self.post([*(extra_ops or []), msg])
        return msg

    def membership_op(
        self,
        key: SigningKey,
        chat_id: bytes,
        user_id: bytes,
        action: MembershipAction = MembershipAction.ADD,
        role: Role = Role.PARTICIPANT,
        *,
        proof: ChatProof,
        grant: AdminGrant | None = None,
    ) -> MembershipOp:
        """A signed op; ``proof`` shows who controls the chat (store.authz)."""
        return MembershipOp.create(
            key, chat_id, user_id, action, self.now(), role, proof=proof, grant=grant
        )

    def put_identity(self, record: IdentityRecord) -> bool:
        result = self._request(
            "PUT", f"/identity/{record.user_id.hex()}", json={"data": b64encode(record.encode())}
        )
        return bool(result["new"])

    def mark_read(self, key: SigningKey, target: MsgV1) -> dict[str, Any]:
        """Sign a read receipt up to ``target`` (a message of its chat) and PUT it: the
        user's read position, which syncs to every node like a message."""
        stamp = self.clock.update(target.hlc, int(time.time() * 1000))  # after the target
        receipt = MsgV1.create(
            key, target.chat_id, stamp, target.hlc.to_bytes(),
            kind=MessageKind.READ_RECEIPT, ref=target.msg_id,
        )  # fmt: skip
        path = f"/users/{receipt.sender.hex()}/chats/{target.chat_id.hex()}/read"
        result: dict[str, Any] = self._signed(
            "PUT", path, json={"receipt": b64encode(receipt.encoded)}
        )
        return result

    # --- reads ---

    def history(
        self,
        chat_id: bytes,
        *,
        cursor: str | None = None,
        limit: int = DEFAULT_PAGE_LIMIT,
        direction: str = "backward",
        raw: bool = False,
        kind: int | None = None,
    ) -> HistoryPage:
        """A page as readers see it, or (``raw``) the op log: every edit, reaction and
        receipt as a row of its own, as signed; ``kind``: the op log's messages of one kind."""
        params: dict[str, Any] = {"limit": limit, "direction": direction, "raw": raw}
        if kind is not None:
            params["kind"] = kind
        if cursor is not None:
            params["cursor"] = cursor
        result = self._signed("GET", f"/chats/{chat_id.hex()}/messages", params=params)
        return HistoryPage(
            [message_from_json(item) for item in result["messages"]],
            result["next_cursor"],
            [tombstone_from_json(item) for item in result.get("tombstones", [])],
        )

    def hidden_grants(self, chat_id: bytes) -> list[MsgV1]:
        """The chat's key grants that it hides (stamped while their sender was, as it turned
        out, no member), every sender's, oldest first."""
        result = self._signed("GET", f"/chats/{chat_id.hex()}/hidden-grants")
        return [message_from_json(item).msg for item in result["messages"]]

    def member_ops(
        self, chat_id: bytes, *, cursor: str | None = None, limit: int = DEFAULT_PAGE_LIMIT
    ) -> SignedPage:
        """A page of the chat's signed member ops (each checked)."""
        return self._originals(chat_id, "member-ops", OpKind.MEMBERSHIP, cursor, limit)

    def deletes(
        self, chat_id: bytes, *, cursor: str | None = None, limit: int = DEFAULT_PAGE_LIMIT
    ) -> SignedPage:
        """A page of the chat's signed DELETE messages (each checked)."""
        return self._originals(chat_id, "deletes", OpKind.PUT_MESSAGE, cursor, limit)

    def _originals(
        self, chat_id: bytes, what: str, kind: OpKind, cursor: str | None, limit: int
    ) -> SignedPage:
        params: dict[str, Any] = {"limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        result = self._signed("GET", f"/chats/{chat_id.hex()}/{what}", params=params)
        ops = [original_from_b64(chat_id, kind, data) for data in result["ops"]]
        return SignedPage(ops, result["next_cursor"])

    def message(self, chat_id: bytes, msg_id: bytes) -> MsgV1 | None:
        """One message of the chat as stored (checked), or None if the node does not hold it."""
        path = f"/chats/{chat_id.hex()}/messages/{msg_id.hex()}"
        try:
            item = self._signed("GET", path)
        except ChatsyncClientError as exc:
            if exc.status == 404:
                return None
            raise
        msg = message_from_json(item).msg
        if msg.msg_id != msg_id or msg.chat_id != chat_id:
            raise InvalidInput("the node sent another message than the one asked for")
        return msg

    def chats(
        self, user_id: bytes, *, cursor: str | None = None, limit: int = DEFAULT_PAGE_LIMIT
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        result: dict[str, Any] = self._signed("GET", f"/users/{user_id.hex()}/chats", params=params)
        return result

    def read_state(self, user_id: bytes, chat_id: bytes) -> dict[str, Any]:
        """The user's read position in the chat and their unread count."""
        result: dict[str, Any] = self._signed(
            "GET", f"/users/{user_id.hex()}/chats/{chat_id.hex()}/read"
        )
        return result

    def members(self, chat_id: bytes) -> list[bytes]:
        result = self._signed("GET", f"/chats/{chat_id.hex()}/members")
        return [bytes.fromhex(m["user_id"]) for m in result["members"]]

    def member_list(self, chat_id: bytes) -> list[Member]:
        """The active members with their role and when they were added."""
        result = self._signed("GET", f"/chats/{chat_id.hex()}/members")
        return [
            Member(bytes.fromhex(m["user_id"]), Role[m["role"].upper()], hlc_of(m["added_at"]))
            for m in result["members"]
        ]

    def chat_proof(self, chat_id: bytes) -> ChatProof | None:
        """Who controls the chat (checked: it derives ``chat_id``); None: the node knows no
        member op of it."""
        try:
            result = self._request("GET", f"/chats/{chat_id.hex()}/proof")
        except ChatsyncClientError as exc:
            if exc.code == "unknown_chat":
                return None
            raise
        return proof_from_json(chat_id, result)

    def get_identity(self, user_id: bytes) -> IdentityRecord | None:
        """The user's identity record as the node has it (None: the node has none)."""
        try:
            result = self._request("GET", f"/identity/{user_id.hex()}")
        except ChatsyncClientError as exc:
            if exc.status == 404:
                return None
            raise
        return IdentityRecord(user_id, hlc_of(result["hlc"]), b64decode(result["blob"]))

    def identity_doc(self, user_id: bytes) -> IdentityDoc | None:
        """The user's verified identity document (keys); BadSignature if the node's is forged."""
        record = self.get_identity(user_id)
        return None if record is None else verify_identity(record)

    def events(self, user_id: bytes, since: str | None = None, limit: int = 100) -> Events:
        """The user's events after ``since`` (a ``next`` of an earlier call), in the order the
        node committed them; each record rebuilt and checked."""
        params: dict[str, Any] = {"limit": limit}
        if since is not None:
            params["since"] = since
        result = self._signed("GET", f"/users/{user_id.hex()}/events", params=params)
        return Events([event_from_json(e) for e in result["events"]], result["next"])

    def block(self, peer_id: str) -> list[str]:
        """Partition switch: the node drops this peer's traffic (admin token)."""
        return list(self._admin("POST", "/admin/block", json={"peer_id": peer_id})["blocked"])

    def unblock(self, peer_id: str) -> list[str]:
        return list(self._admin("POST", "/admin/unblock", json={"peer_id": peer_id})["blocked"])

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", "/status")
        return result

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", "/health")
        return result

    def metrics(self) -> str:
        return str(self._request("GET", "/metrics"))
