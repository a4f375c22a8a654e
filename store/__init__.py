"""The storage layer: HLC, keys, records (CBOR), CRDT merge rules — all pure — and ChatDb on rocksdict.

Pure modules (no I/O, importable anywhere): ``hlc``, ``keys``, ``records``,
``merge``, ``signing``, ``errors``. ``ChatDb`` is the only one that touches disk.
"""

from store.chatdb import ChatDb
from store.errors import (
    BadSignature,
    ChatsyncError,
    ClockDriftError,
    DecodeError,
    InvalidInput,
    TooLarge,
)
from store.hlc import HLC_ZERO, Hlc, HlcClock
from store.identity import IdentityChange
from store.inbox import ChatListItem, ChatListPage
from store.members import MemberChange
from store.merge import identity_wins, merge_member_states
from store.messages import Direction, PutResult, RangePage, StoredMessage
from store.records import (
    ChatKind,
    ChatMeta,
    IdentityRecord,
    InboxEntry,
    MemberInfo,
    MemberRecord,
    MessageKind,
    MsgV1,
    OversizeRecord,
    Role,
)
from store.rocks import ChatDbConfig

__all__ = [
    "HLC_ZERO",
    "BadSignature",
    "ChatDb",
    "ChatDbConfig",
    "ChatKind",
    "ChatListItem",
    "ChatListPage",
    "ChatMeta",
    "ChatsyncError",
    "ClockDriftError",
    "DecodeError",
    "Direction",
    "Hlc",
    "HlcClock",
    "IdentityChange",
    "IdentityRecord",
    "InboxEntry",
    "InvalidInput",
    "MemberChange",
    "MemberInfo",
    "MemberRecord",
    "MessageKind",
    "MsgV1",
    "OversizeRecord",
    "PutResult",
    "RangePage",
    "Role",
    "StoredMessage",
    "TooLarge",
    "identity_wins",
    "merge_member_states",
]
