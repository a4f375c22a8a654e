"""The storage layer: HLC, keys, records (CBOR), CRDT merge rules — all pure — and ChatDb on rocksdict.

Pure modules (no I/O, importable anywhere, no rocksdict): ``hlc``, ``keys``,
``records``, ``merge``, ``signing``, ``ops``, ``ingress``, ``errors``. ``ChatDb`` (the composition root
of the row stores), ``ChatReads`` (the HTTP API's read-only facade) and their result types
are loaded on first use, so ``import store`` stays pure for sync/ and sim/.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from store.errors import (
    BadSignature,
    ChatsyncError,
    ClockDriftError,
    DecodeError,
    InvalidInput,
    TooLarge,
)
from store.hlc import HLC_ZERO, Hlc, HlcClock
from store.merge import identity_wins, merge_member_states
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

# name -> module, for the parts that need rocksdict
_LAZY = {
    "ChatDb": "store.chatdb",
    "ChatDbConfig": "store.rocks",
    "ChatReads": "store.chat_reads",
    "IdentityChange": "store.identity",
    "ChatListItem": "store.inbox",
    "ChatListPage": "store.inbox",
    "MemberChange": "store.members",
    "Direction": "store.messages",
    "PutResult": "store.messages",
    "RangePage": "store.messages",
    "StoredMessage": "store.messages",
}

if TYPE_CHECKING:
    from store.chat_reads import ChatReads
    from store.chatdb import ChatDb
    from store.identity import IdentityChange
    from store.inbox import ChatListItem, ChatListPage
    from store.members import MemberChange
    from store.messages import Direction, PutResult, RangePage, StoredMessage
    from store.rocks import ChatDbConfig


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'store' has no attribute {name!r}")


__all__ = [
    "HLC_ZERO",
    "BadSignature",
    "ChatDb",
    "ChatDbConfig",
    "ChatKind",
    "ChatListItem",
    "ChatListPage",
    "ChatMeta",
    "ChatReads",
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
