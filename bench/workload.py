"""The store benchmark's workload: signed messages and their precomputed bytes, made before timing.

Every figure of ``chatsync bench store`` comes from the same messages. They are
signed, encoded and hashed here, once, so no timed loop pays for signing or
CBOR; each store then gets the same records in the shape it takes:

- ChatDb: the ``MsgV1`` objects (``encoded`` and ``msg_id`` already cached);
- raw rocksdict: (messages key, encoded, msg_id, chat_id) rows, with the key
  ChatDb will build (chat | hlc | per-chat seq) and per-chat ChatMeta bytes;
- SQLite: RFC-0005 ``messages`` rows whose id is a ULID-layout string made
  from the HLC and the message id.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from store import ChatMeta, Hlc, MessageKind, MsgV1
from store.authz import new_group
from store.hlc import VIRTUAL_EPOCH_MS
from store.ops import MembershipAction, MembershipOp
from store.records import blake3_id
from store.signing import SigningKey, key_from_seed, public_key, user_id_from_key

USERS = 16  # authors and chat members
MEMBERS_PER_CHAT = 5
MAX_UNREAD = 50  # each member has read all but 0..49 of a chat's newest messages
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

RawRow = tuple[bytes, bytes, bytes, bytes]  # messages key, encoded MsgV1, msg_id, chat_id
SqlRow = tuple[str, str, str, int, bytes, int, int, int, int]  # RFC-0005 messages columns


@dataclass(frozen=True)
class Workload:
    msgs: list[MsgV1]
    raw_rows: list[RawRow]
    sql_rows: list[SqlRow]
    chat_ids: list[bytes]
    member_ops: list[MembershipOp]  # every chat's members added before its first message
    users: list[bytes]
    members: dict[bytes, list[bytes]]  # chat -> member user ids
    meta_bytes: dict[bytes, bytes]  # chat -> encoded ChatMeta of the size ChatDb writes
    timestamps: dict[bytes, list[int]]  # chat -> server_timestamp of seq 1, 2, ...

    def read_seq(self, chat_index: int, member_index: int) -> int:
        """The seq a member has read up to: all but 0..49 of the chat's messages."""
        last_seq = len(self.timestamps[self.chat_ids[chat_index]])
        return max(0, last_seq - (chat_index * 7 + member_index * 13) % MAX_UNREAD)


def ulid_like(hlc: Hlc, msg_id: bytes) -> str:
    """26 Crockford base32 chars, ULID layout: 48-bit ms, then HLC logical + 64 bits of msg id."""
    value = (hlc.pack() << 64) | int.from_bytes(msg_id[:8], "big")
    return "".join(CROCKFORD[(value >> (5 * i)) & 31] for i in reversed(range(26)))


def sql_row(msg: MsgV1) -> SqlRow:
    physical_ms = msg.hlc.physical_ms
    return (
        ulid_like(msg.hlc, msg.msg_id),
        msg.chat_id.hex(),
        msg.sender.hex(),
        physical_ms * 1000,  # server_timestamp, microseconds
        msg.encoded,  # the same bytes RocksDB stores
        len(msg.encoded),
        0,  # message_type: application
        0,  # epoch
        physical_ms // 1000,  # created_at, seconds
    )


def make_workload(
    messages: int,
    chats: int,
    payload: int,
    *,
    seed: int = 1,
    advance: Callable[[int], None] = lambda n: None,
) -> Workload:
    """``messages`` signed messages over ``chats`` chats, HLCs increasing; ``advance`` reports progress."""
    rng = random.Random(seed)
    keys = author_keys()
    users = [user_id_from_key(public_key(key)) for key in keys]
    # group chats created by the first user, so that their members' adds are authorized
    groups = [
        new_group(keys[0], blake3_id(b"bench-chat", i.to_bytes(4, "big"))[:16])
        for i in range(chats)
    ]
    chat_ids = [group.chat_id() for group in groups]
    member_idx = {
        c: [(n + 3 * j) % USERS for j in range(MEMBERS_PER_CHAT)] for n, c in enumerate(chat_ids)
    }
    before = Hlc(VIRTUAL_EPOCH_MS - 1)
    member_ops = [
        MembershipOp.create(
            keys[0], group.chat_id(), users[i], MembershipAction.ADD, before, proof=group
        )
        for group in groups
        for i in member_idx[group.chat_id()]
    ]
    msgs: list[MsgV1] = []
    raw_rows: list[RawRow] = []
    timestamps: dict[bytes, list[int]] = {chat: [] for chat in chat_ids}
    for i in range(messages):
        chat = chat_ids[rng.randrange(chats)]
        author = keys[rng.choice(member_idx[chat])]
        msg = MsgV1.create(author, chat, Hlc(VIRTUAL_EPOCH_MS + i), rng.randbytes(payload))
        timestamps[chat].append(msg.hlc.physical_ms * 1000)
        seq = len(timestamps[chat])
        key = chat + msg.hlc.to_bytes() + seq.to_bytes(4, "big")
        msgs.append(msg)
        raw_rows.append((key, msg.encoded, msg.msg_id, chat))
        if i % 1000 == 999 or i == messages - 1:
            advance(i % 1000 + 1)
    return Workload(
        msgs=msgs,
        raw_rows=raw_rows,
        sql_rows=[sql_row(msg) for msg in msgs],
        chat_ids=chat_ids,
        member_ops=member_ops,
        users=users,
        members={chat: [users[i] for i in idx] for chat, idx in member_idx.items()},
        meta_bytes=_meta_bytes(msgs, timestamps),
        timestamps=timestamps,
    )


def author_keys() -> list[SigningKey]:
    return [key_from_seed(blake3_id(b"bench-user", bytes([i]))) for i in range(USERS)]


def about_messages(
    wl: Workload, kind: MessageKind, every: int, payload: Callable[[MsgV1], bytes]
) -> list[MsgV1]:
    """For every ``every``-th workload message, a message of ``kind`` about it by its author,
    stamped one logical tick after it."""
    keys = keys_by_user()
    return [about(keys[m.sender], m, kind, payload(m)) for m in wl.msgs[::every]]


def about(key: SigningKey, target: MsgV1, kind: MessageKind, payload: bytes) -> MsgV1:
    """``key``'s message of ``kind`` about ``target``, stamped one logical tick after it."""
    hlc = Hlc(target.hlc.physical_ms, target.hlc.logical + 1)
    return MsgV1.create(key, target.chat_id, hlc, payload, kind=kind, ref=target.msg_id)


def keys_by_user() -> dict[bytes, SigningKey]:
    return {user_id_from_key(public_key(k)): k for k in author_keys()}


def _meta_bytes(msgs: list[MsgV1], timestamps: dict[bytes, list[int]]) -> dict[bytes, bytes]:
    """Each chat's final ChatMeta, encoded: what ChatDb writes to chats_meta, byte for byte in size."""
    last = {msg.chat_id: msg for msg in msgs}
    return {
        chat: ChatMeta(
            last_ts=msg.hlc.physical_ms,
            last_seq=len(timestamps[chat]),
            last_msg_id=msg.msg_id,
            last_msg_ts=msg.hlc.pack(),
        ).encode()
        for chat, msg in last.items()
    }
