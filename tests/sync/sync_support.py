"""Builders shared by the sync tests: signed records, replica filling, state comparison."""

from __future__ import annotations

from functools import cache

from hypothesis import strategies as st

from store import Hlc, IdentityRecord, MemberInfo, MemberRecord, MsgV1, Role
from store.signing import key_from_seed, public_key, user_id_from_key
from sync.frames import Domain
from sync.merkle import MerkleTree
from sync.replica import MemoryReplica, Record

CHATS = [bytes([0xC0 + i]) * 32 for i in range(3)]
KEYS = [key_from_seed(bytes([i + 1]) * 32) for i in range(4)]
USERS = [user_id_from_key(public_key(k)) for k in KEYS]


@cache
def message(n: int) -> MsgV1:
    """The n-th message of a fixed universe (signing is slow: each is made once)."""
    return MsgV1.create(KEYS[n % len(KEYS)], CHATS[n % len(CHATS)], Hlc(1_000 + n * 7), b"m%d" % n)


def member(chat: int, user: int, added: int, removed: int, role: int) -> MemberRecord:
    info = MemberInfo(Role(role), Hlc(added), Hlc(removed) if removed else None)
    return MemberRecord(CHATS[chat], USERS[user], info)


def identity(user: int, hlc: int, blob: int) -> IdentityRecord:
    return IdentityRecord(USERS[user], Hlc(hlc), b"identity-%d" % blob)


# Any record of a small universe, so that independent draws collide: the same message twice,
# several member ops on one (chat, user) row, identities of one user with equal stamps.
RECORDS: st.SearchStrategy[Record] = st.one_of(
    st.integers(0, 60).map(message),
    st.builds(
        member,
        st.integers(0, 2),  # chat
        st.integers(0, 3),  # user
        st.integers(1, 6),  # added_at
        st.integers(0, 6),  # removed_at (0: none)
        st.integers(0, 1),  # role: participant, admin
    ),
    st.builds(identity, st.integers(0, 3), st.integers(1, 6), st.integers(0, 3)),
)


def domain_of(record: Record) -> Domain:
    if isinstance(record, MsgV1):
        return Domain.MESSAGES
    if isinstance(record, MemberRecord):
        return Domain.MEMBERS
    return Domain.IDENTITY


def fill(replica: MemoryReplica, records: list[Record]) -> MemoryReplica:
    for record in records:
        replica.apply(domain_of(record), [record])
    return replica


def contents(replica: MemoryReplica) -> tuple[object, ...]:
    return (
        sorted(replica.messages),
        sorted(replica.members.items()),
        sorted(replica.identities.items()),
    )


def roots(replica: object) -> list[tuple[bytes, int]]:
    return [replica.tree(d).root() for d in Domain]  # type: ignore[attr-defined]


def assert_trees_match_contents(replica: MemoryReplica) -> None:
    """The incrementally maintained trees equal trees rebuilt from what is stored."""
    for domain in Domain:
        ids = replica.record_ids(domain)
        assert replica.tree(domain) == MerkleTree.from_ids(ids), domain
