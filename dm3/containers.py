"""A chatsync user's history as dm3 storage containers (Message Storage Protocol). Pure.

Three kinds of container, each stored as the file ``<key>.json``: the dm3 sealed JSON
(``crypto.encrypt`` under the user's storage key, a fresh nonce each) of the plaintext
container. ``sha256`` is dm3's (``0x`` + hex of the UTF-8 bytes' digest); a conversation is a
chatsync chat (a DM or a group, named by its id in hex), not an ENS partner.

==============  ==================================================  ===========================
container       key                                                 plaintext
==============  ==================================================  ===========================
root            sha256(sign(user id hex))                           {"conversations": [chat],
                                                                     "identity": entry | null,
                                                                     "user": user id hex}
conversation    sha256(root key + chat id hex)                      {"chunks": [{"id": n,
                                                                     "timestamp": ms}]}
chunk           sha256(conversation key + stringify(chunk id))      {"messages": [entry]}
==============  ==================================================  ===========================

An entry is one signed op as its signer made it — ``{"kind": "new" | "edit" | "reply" |
"reaction" | "read_receipt" | "delete" | "member" | "identity", "op": OpKind, "data": base64
of its canonical CBOR, "timestamp": its HLC's ms}`` — so a dm3 reader sees a time-sorted
list, and an import re-submits the very bytes (ids unchanged). A chat's entries are sorted
by stamp and cut into chunks: a chunk is closed when the next entry would take its *file*
over ``max_chunk_bytes`` (500 kB..10 MB, dm3's recommendation).

``open_containers`` checks everything before anyone writes anything: every file there,
every container opens (the AEAD tag catches a flipped or cut byte), every shape, every op's
encoding and signature (``store.ingress.validate_op``), the chunk list and the time order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from nacl.signing import SigningKey

from dm3.crypto import (
    NONCE_LEN,
    PAD_BLOCK,
    Dm3CryptoError,
    b64,
    decrypt,
    encrypt,
    sha256_hex,
    sign_text,
    storage_key,
    stringify,
    unb64,
)
from store.errors import InvalidInput
from store.ingress import validate_op
from store.keys import CHAT_ID_LEN
from store.ops import MembershipOp, Op, OpKind, decode_op, encode_op, op_kind
from store.records import IdentityRecord, MessageKind, MsgV1
from store.signing import public_key, user_id_from_key

MIN_CHUNK_BYTES = 500_000
MAX_CHUNK_BYTES = 10_000_000
DEFAULT_CHUNK_BYTES = 1 << 20
MAX_FILE_BYTES = MAX_CHUNK_BYTES  # what a reader accepts for any container
AEAD_TAG_LEN = 16
ENTRY_KEYS = frozenset({"kind", "op", "data", "timestamp"})
MEMBER, IDENTITY = "member", "identity"
LABELS = {MEMBER, IDENTITY, *(kind.name.lower() for kind in MessageKind)}


class ContainerError(ValueError):
    """A container that is missing, altered, truncated, another user's or malformed."""


@dataclass(frozen=True)
class History:
    """What an export holds: the user's identity and, per chat, its signed ops."""

    user_id: bytes
    identity: IdentityRecord | None
    chats: dict[bytes, list[Op]] = field(default_factory=dict)

    @property
    def op_count(self) -> int:
        return sum(map(len, self.chats.values())) + (self.identity is not None)


# --- keys ---


def root_key(user: SigningKey) -> str:
    """dm3: sha256(signature(own name)); ours is the user id in hex."""
    return sha256_hex(sign_text(user, user_hex(user)))


def conversation_key(root: str, chat_id: bytes) -> str:
    return sha256_hex(root + chat_id.hex())


def chunk_key(conversation: str, chunk_id: dict[str, int]) -> str:
    return sha256_hex(conversation + stringify(chunk_id))


def file_name(key: str) -> str:
    return key + ".json"


def user_hex(user: SigningKey) -> str:
    return user_id_from_key(public_key(user)).hex()


# --- sizes ---


def sealed_size(plaintext_bytes: int) -> int:
    """The file size of a container whose plaintext JSON has this many UTF-8 bytes: padded
    (sodium_pad always adds at least a byte), tagged, base64'd, wrapped."""
    padded = (plaintext_bytes // PAD_BLOCK + 1) * PAD_BLOCK
    ciphertext = -(-(padded + AEAD_TAG_LEN) // 3) * 4
    return len(stringify({"ciphertext": "", "nonce": "0x"})) + ciphertext + 2 * NONCE_LEN


def check_chunk_limit(max_chunk_bytes: int) -> None:
    if not MIN_CHUNK_BYTES <= max_chunk_bytes <= MAX_CHUNK_BYTES:
        raise ContainerError(
            f"the chunk size must be {MIN_CHUNK_BYTES:,}..{MAX_CHUNK_BYTES:,} bytes "
            f"(dm3's recommendation), got {max_chunk_bytes:,}"
        )


# --- building ---


def entry_of(op: Op) -> str:
    """One op as a chunk entry, stringified (keys sorted: its bytes are its size)."""
    return stringify(
        {"kind": label_of(op), "op": int(op_kind(op)), "data": b64(encode_op(op)),
         "timestamp": op.hlc.physical_ms}
    )  # fmt: skip


def label_of(op: Op) -> str:
    if isinstance(op, MsgV1):
        return op.kind.name.lower()
    return MEMBER if isinstance(op, MembershipOp) else IDENTITY


def chunk_entries(entries: list[str], max_chunk_bytes: int) -> list[list[str]]:
    """Cut a time-sorted chat into chunks: the next entry goes into a new chunk when it
    would take the current one's file over ``max_chunk_bytes``."""
    empty = len(stringify({"messages": []}))
    chunks: list[list[str]] = []
    current: list[str] = []
    size = empty
    for entry in entries:
        grown = size + len(entry) + (1 if current else 0)  # the comma before it
        if current and sealed_size(grown) > max_chunk_bytes:
            chunks.append(current)
            current, grown = [], empty + len(entry)
        if sealed_size(grown) > max_chunk_bytes:  # ops are <= 256 KiB: cannot happen
            raise ContainerError(f"an op of {len(entry):,} bytes does not fit in a chunk")
        current.append(entry)
        size = grown
    return [*chunks, current] if current else chunks


def build_containers(
    user: SigningKey,
    history: History,
    nonce: Callable[[int], bytes],
    max_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> dict[str, bytes]:
    """Every container of ``history`` as file name -> file bytes; ``nonce`` gives a fresh
    nonce of the length asked per container (the shell passes ``os.urandom``)."""
    check_chunk_limit(max_chunk_bytes)
    key, root = storage_key(user), root_key(user)
    files: dict[str, bytes] = {}

    def seal(name: str, plaintext: str) -> None:
        files[file_name(name)] = stringify(encrypt(key, plaintext, nonce(NONCE_LEN))).encode()
        if len(files[file_name(name)]) > MAX_FILE_BYTES:
            raise ContainerError(f"container {name} is over {MAX_FILE_BYTES:,} bytes")

    conversations = []
    for chat_id, ops in history.chats.items():
        if not ops:
            continue  # dm3: empty conversations are not stored
        conversation = conversation_key(root, chat_id)
        entries = [entry_of(op) for op in sorted(ops, key=_stamp_order)]
        chunk_ids = []
        for number, chunk in enumerate(chunk_entries(entries, max_chunk_bytes)):
            chunk_id = {"id": number, "timestamp": json.loads(chunk[0])["timestamp"]}
            chunk_ids.append(chunk_id)
            seal(chunk_key(conversation, chunk_id), '{"messages":[' + ",".join(chunk) + "]}")
        seal(conversation, stringify({"chunks": chunk_ids}))
        conversations.append(chat_id.hex())
    identity = None if history.identity is None else json.loads(entry_of(history.identity))
    root_plain = {"conversations": conversations, "identity": identity, "user": user_hex(user)}
    seal(root, stringify(root_plain))
    return files


def _stamp_order(op: Op) -> tuple[int, bytes]:
    return op.hlc.pack(), encode_op(op)


# --- opening ---


@dataclass(frozen=True)
class Opened:
    history: History
    containers: int
    chunks: int
    bytes: int


def open_containers(files: Mapping[str, bytes], user: SigningKey) -> Opened:
    """The history in ``files`` (name -> bytes), every container and op checked; else
    ContainerError naming the file and what is wrong with it."""
    reader = _Reader(files, storage_key(user))
    root = root_key(user)
    plain = reader.open(root, {"conversations", "identity", "user"})
    if plain["user"] != user_hex(user):
        raise ContainerError(f"{file_name(root)}: the export of another user")
    history = History(user_id_from_key(public_key(user)), _identity(root, plain["identity"]))
    if history.identity is not None and history.identity.user_id != history.user_id:
        raise ContainerError(f"{file_name(root)}: the identity is another user's")
    for chat_hex in _conversation_ids(root, plain["conversations"]):
        chat_id = bytes.fromhex(chat_hex)
        history.chats[chat_id] = list(reader.conversation(conversation_key(root, chat_id), chat_id))
    return Opened(history, reader.opened, reader.chunks, reader.bytes)


class _Reader:
    def __init__(self, files: Mapping[str, bytes], key: bytes) -> None:
        self.files, self.key = files, key
        self.opened = self.chunks = self.bytes = 0

    def open(self, key: str, keys: set[str]) -> dict[str, Any]:
        """The plaintext container stored under ``key``, with exactly ``keys``."""
        name = file_name(key)
        data = self.files.get(name)
        if data is None:
            raise ContainerError(
                f"{name}: missing" + (" (a wrong key?)" if not self.opened else "")
            )
        if len(data) > MAX_FILE_BYTES:
            raise ContainerError(f"{name}: {len(data):,} bytes, over {MAX_FILE_BYTES:,}")
        sealed = _json(name, data, "not a sealed JSON container (truncated?)")
        try:
            text = decrypt(self.key, sealed)
        except Dm3CryptoError as exc:
            raise ContainerError(f"{name}: {exc} (altered, truncated, or another key's)") from None
        plain = _json(name, text, "the container inside is not JSON")
        if not isinstance(plain, dict) or set(plain) != keys:
            raise ContainerError(f"{name}: not a container with the fields {sorted(keys)}")
        self.opened += 1
        self.bytes += len(data)
        return plain

    def conversation(self, key: str, chat_id: bytes) -> Iterator[Op]:
        chunk_ids = self.open(key, {"chunks"})["chunks"]
        if not isinstance(chunk_ids, list) or not chunk_ids:
            raise ContainerError(f"{file_name(key)}: no chunk list")
        last = 0
        for number, chunk_id in enumerate(chunk_ids):
            if not _is_chunk_id(chunk_id, number) or chunk_id["timestamp"] < last:
                raise ContainerError(f"{file_name(key)}: chunk {number}'s identifier is wrong")
            name = chunk_key(key, chunk_id)
            for op in self.chunk(name, chat_id, chunk_id["timestamp"]):
                last = op.hlc.physical_ms
                yield op

    def chunk(self, key: str, chat_id: bytes, first_ms: int) -> list[Op]:
        entries = self.open(key, {"messages"})["messages"]
        if not isinstance(entries, list) or not entries:
            raise ContainerError(f"{file_name(key)}: no messages")
        self.chunks += 1
        ops = [_op_of(f"{file_name(key)}: entry {i}", e) for i, e in enumerate(entries)]
        stamps = [op.hlc.physical_ms for op in ops]
        if stamps[0] != first_ms or stamps != sorted(stamps):
            raise ContainerError(
                f"{file_name(key)}: its messages are not time-sorted from its identifier's stamp"
            )
        for i, op in enumerate(ops):
            if not isinstance(op, MsgV1 | MembershipOp) or op.chat_id != chat_id:
                raise ContainerError(f"{file_name(key)}: entry {i} is not of chat {chat_id.hex()}")
        return ops


def _json(name: str, text: bytes | str, what: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise ContainerError(f"{name}: {what}") from None


def _is_chunk_id(value: Any, number: int) -> bool:
    return (
        isinstance(value, dict)
        and set(value) == {"id", "timestamp"}
        and type(value["id"]) is int
        and value["id"] == number
        and type(value["timestamp"]) is int
    )


def _conversation_ids(root: str, value: Any) -> list[str]:
    where = f"{file_name(root)}: conversations"
    if not isinstance(value, list) or len(set(map(str, value))) != len(value):
        raise ContainerError(f"{where} is not a list of distinct chat ids")
    for chat in value:
        try:
            ok = isinstance(chat, str) and len(bytes.fromhex(chat)) == CHAT_ID_LEN
        except ValueError:
            ok = False
        if not ok or chat != chat.lower():
            raise ContainerError(f"{where}: {str(chat)[:80]!r} is not a chat id")
    return value


def _identity(root: str, value: Any) -> IdentityRecord | None:
    if value is None:
        return None
    op = _op_of(f"{file_name(root)}: identity", value)
    if not isinstance(op, IdentityRecord):
        raise ContainerError(f"{file_name(root)}: identity is not an identity record")
    return op


def _op_of(where: str, entry: Any) -> Op:
    """The signed op an entry carries, checked as a node checks it (but for clock drift:
    the node's business), and that its label and timestamp tell the truth."""
    if not isinstance(entry, dict) or set(entry) != ENTRY_KEYS:
        raise ContainerError(f"{where}: not an entry {sorted(ENTRY_KEYS)}")
    kind, label, stamp = entry["op"], entry["kind"], entry["timestamp"]
    if type(kind) is not int or kind not in OpKind.__members__.values() or label not in LABELS:
        raise ContainerError(f"{where}: unknown op kind or label")
    try:
        op = decode_op(kind, unb64(entry["data"], "data"))
        validate_op(op, now_ms=op.hlc.physical_ms, max_offset_ms=0)
    except (InvalidInput, Dm3CryptoError) as exc:
        raise ContainerError(f"{where}: {exc}") from None
    if label_of(op) != label or stamp != op.hlc.physical_ms:
        raise ContainerError(f"{where}: its kind or timestamp does not match its op")
    return op
