"""Builders shared by the node tests."""

from __future__ import annotations

from pathlib import Path

from store import ChatDb, ChatDbConfig, Hlc, MsgV1
from store.authz import new_group
from store.ops import MembershipAction, MembershipOp, make_identity
from store.records import Role
from store.signing import key_from_seed, public_key, user_id_from_key

KEYS = [key_from_seed(bytes([i + 11]) * 32) for i in range(3)]
USERS = [user_id_from_key(public_key(k)) for k in KEYS]
PROOF = new_group(KEYS[0], b"node-tests-chat!")  # KEYS[0] created the chat
CHAT = PROOF.chat_id()


def small_db(path: Path) -> ChatDb:
    return ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=path)


def messages(start: int, count: int, *, author: int = 0) -> list[MsgV1]:
    return [
        MsgV1.create(KEYS[author], CHAT, Hlc(1_000 + i), b"n%d" % i)
        for i in range(start, start + count)
    ]


def add(user: int, hlc: int) -> MembershipOp:
    return MembershipOp.create(
        KEYS[0], CHAT, USERS[user], MembershipAction.ADD, Hlc(hlc), Role.ADMIN, proof=PROOF
    )


def identity(user: int, hlc: int):  # type: ignore[no-untyped-def]
    return make_identity(KEYS[user], bytes([user]) * 32, Hlc(hlc))
