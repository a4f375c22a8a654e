"""A user's history out of a node and back in, as dm3 storage containers (``dm3.containers``).

Export reads, signed in as the user, every chat the user may read: its signed member ops and
deletes (``GET /chats/{chat}/member-ops``, ``/deletes``) and its op log (the raw history:
every message, edit, reaction, reply and receipt as signed), and the user's identity record.
Import re-submits those very ops through ``POST /ops`` — the identity and the member ops
first (they admit the messages and make the admins' deletes valid), then the messages by
stamp, the read receipts last by position (a node refuses a receipt that does not move its
reader forward) — in batches; a node keeps one copy of each op, so a second import adds
nothing. ``chatsync export`` / ``import`` are in ``client/backup_commands.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

from nacl.signing import SigningKey

from client.http import ChatsyncClient, ChatsyncClientError
from dm3.containers import MAX_FILE_BYTES, ContainerError, History
from store.kinds import decode_receipt
from store.messages import MAX_PAGE_LIMIT
from store.ops import Op, encode_op, verify_identity
from store.records import MessageKind, MsgV1
from store.signing import public_key, user_id_from_key

MAX_BATCH_OPS = 500
MAX_BATCH_BYTES = 3 << 20  # of signed ops: the request (base64, JSON) stays under 8 MiB
RETRY_CODES = frozenset({"rate_limited", "busy"})  # the node asks to slow down: wait, retry
RETRIES = 8


# --- export: from the node ---


def user_chat_ids(client: ChatsyncClient, user_id: bytes) -> list[bytes]:
    chats: list[bytes] = []
    cursor = None
    while True:
        page = client.chats(user_id, cursor=cursor, limit=MAX_PAGE_LIMIT)
        chats += [bytes.fromhex(entry["chat_id"]) for entry in page["chats"]]
        if (cursor := page["next_cursor"]) is None:
            return chats


def chat_ops(client: ChatsyncClient, chat_id: bytes) -> list[Op]:
    """Every signed op of the chat the node shows the user, each checked by the client."""
    ops: list[Op] = []
    for read in (client.member_ops, client.deletes):
        cursor = None
        while True:
            signed = read(chat_id, cursor=cursor, limit=MAX_PAGE_LIMIT)
            ops += signed.ops
            if (cursor := signed.next_cursor) is None:
                break
    cursor = None
    while True:
        page = client.history(
            chat_id, cursor=cursor, limit=MAX_PAGE_LIMIT, direction="forward", raw=True
        )
        ops += [item.msg for item in page.messages]
        if (cursor := page.next_cursor) is None:
            return ops


def fetch_history(
    client: ChatsyncClient, key: SigningKey, on_chat: Callable[[int, int], None]
) -> History:
    """The user's identity and every op of their chats; ``on_chat(done, total)`` after each."""
    user_id = user_id_from_key(public_key(key))
    identity = client.get_identity(user_id)
    if identity is not None:
        verify_identity(identity)  # BadSignature if the node's is forged
    history = History(user_id, identity)
    chat_ids = user_chat_ids(client, user_id)
    on_chat(0, len(chat_ids))
    for done, chat_id in enumerate(chat_ids, 1):
        history.chats[chat_id] = chat_ops(client, chat_id)
        on_chat(done, len(chat_ids))
    return history


# --- the directory ---


def check_empty_dir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ContainerError(f"{out} is not an empty directory: export into a new or empty one")


def write_containers(out: Path, files: dict[str, bytes], on_file: Callable[[], None]) -> None:
    check_empty_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (out / name).write_bytes(data)
        on_file()


def read_containers(source: Path) -> dict[str, bytes]:
    """The ``*.json`` files of an export; a file over the limit is refused before it is read."""
    if not source.is_dir():
        raise ContainerError(f"{source} is not a directory")
    files: dict[str, bytes] = {}
    for path in sorted(source.glob("*.json")):
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ContainerError(f"{path.name}: over {MAX_FILE_BYTES:,} bytes")
        files[path.name] = path.read_bytes()
    return files


# --- import: into the node ---


def submission_order(history: History) -> list[list[Op]]:
    """The ops in phases a node accepts them in (see the module's docstring): the identity
    and the member ops, then the messages. Never in one request: a node judges a delete
    against the admins it holds, not those the same request brings."""
    members: list[Op] = [] if history.identity is None else [history.identity]
    messages: list[MsgV1] = []
    receipts: list[MsgV1] = []
    for ops in history.chats.values():
        for op in ops:
            if not isinstance(op, MsgV1):
                members.append(op)
            elif op.kind is MessageKind.READ_RECEIPT:
                receipts.append(op)
            else:
                messages.append(op)
    messages.sort(key=lambda msg: msg.hlc)
    receipts.sort(key=lambda msg: (msg.chat_id, msg.sender, decode_receipt(msg), msg.hlc))
    return [sorted(members, key=lambda op: op.hlc), [*messages, *receipts]]


def batches(ops: list[Op]) -> Iterator[list[Op]]:
    batch: list[Op] = []
    size = 0
    for op in ops:
        data = len(encode_op(op))
        if batch and (len(batch) == MAX_BATCH_OPS or size + data > MAX_BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(op)
        size += data
    if batch:
        yield batch


def submit(
    client: ChatsyncClient,
    phases: list[list[Op]],
    on_batch: Callable[[int], None],
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Post each phase in batches, in order; how many ops were new to the node.
    ``on_batch(ops in it)`` after each batch."""
    new = 0
    for ops in phases:
        for batch in batches(ops):
            new += sum(post_patiently(client, batch, sleep))
            on_batch(len(batch))
    return new


def post_patiently(
    client: ChatsyncClient, batch: list[Op], sleep: Callable[[float], None]
) -> list[bool]:
    """``post_ops``, waiting and trying again while the node says it is too busy."""
    for attempt in range(RETRIES):
        try:
            return client.post_ops(batch)
        except ChatsyncClientError as exc:
            if exc.code not in RETRY_CODES or attempt == RETRIES - 1:
                raise
            sleep(0.25 * 2**attempt)
    raise AssertionError("unreachable")
