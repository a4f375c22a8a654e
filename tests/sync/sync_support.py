"""Builders shared by the sync tests: signed records, replica filling, state comparison."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from hypothesis import strategies as st

from store import Hlc, IdentityRecord, MessageKind, MsgV1, Role
from store.authz import new_group
from store.kinds import Claims, reaction_payload
from store.ops import MembershipAction, MembershipOp
from store.records import compute_identity_record_id
from store.signing import key_from_seed, public_key, user_id_from_key
from sync.frames import Domain, Frame, Hello, Transfer, decode_frame
from sync.merkle import MerkleTree
from sync.protocol import SessionRole, State, SyncSession
from sync.replica import DbReplica, MemoryReplica, Record
from sync.scope import Scope
from sync.shards import domain_shards, placement_key, shard_in

KEYS = [key_from_seed(bytes([i + 1]) * 32) for i in range(4)]
USERS = [user_id_from_key(public_key(k)) for k in KEYS]
GROUPS = [new_group(KEYS[0], bytes([0xC0 + i]) * 16) for i in range(3)]  # KEYS[0] created them
CHATS = [group.chat_id() for group in GROUPS]


def engine() -> MemoryReplica:
    """A replica of the sync engine alone: every message stored, members or not."""
    return MemoryReplica(admit_all=True)


@cache
def message(n: int) -> MsgV1:
    """The n-th message of a fixed universe (signing is slow: each is made once)."""
    return MsgV1.create(KEYS[n % len(KEYS)], CHATS[n % len(CHATS)], Hlc(1_000 + n * 7), b"m%d" % n)


@cache
def member(chat: int, user: int, hlc: int, *, remove: bool = False, role: int = 0) -> MembershipOp:
    """An add (or remove) of USERS[user] in CHATS[chat] at Hlc(hlc), signed by the creator."""
    action = MembershipAction.REMOVE if remove else MembershipAction.ADD
    return MembershipOp.create(
        KEYS[0], CHATS[chat], USERS[user], action, Hlc(hlc), Role(role), proof=GROUPS[chat]
    )


@cache
def forged_member(chat: int, user: int, hlc: int) -> MembershipOp:
    """An add signed by USERS[1], who holds no say in any of the groups: well formed, correctly
    signed, and unauthorized."""
    return MembershipOp.create(
        KEYS[1], CHATS[chat], USERS[user], MembershipAction.ADD, Hlc(hlc), proof=GROUPS[chat]
    )


def member_stamp(step: int) -> int:
    """Member op stamps interleave with the messages' (1,000 + 7n): adds, removes and re-adds
    fall before, between and after them."""
    return 990 + 25 * step


def identity(user: int, hlc: int, blob: int) -> IdentityRecord:
    return IdentityRecord(USERS[user], Hlc(hlc), b"identity-%d" % blob)


# Any record of a small universe, so that independent draws collide: the same message twice,
# several member ops on one (chat, user) — adds, removes, re-adds around its messages' stamps
# — and identities of one user with equal stamps.
MEMBER_OPS: st.SearchStrategy[MembershipOp] = st.builds(
    member,
    st.integers(0, 2),  # chat
    st.integers(0, 3),  # user
    st.integers(0, 18).map(member_stamp),
    remove=st.booleans(),
    role=st.integers(0, 1),  # participant, admin
)


@cache
def refers(kind: MessageKind, n: int, by: int, later: int, payload: bytes = b"") -> MsgV1:
    """A message of ``kind`` by USERS[by] about message(n), stamped ``later`` ms after it."""
    target = message(n)
    hlc = Hlc(target.hlc.physical_ms + later)
    return MsgV1.create(KEYS[by], target.chat_id, hlc, payload, kind=kind, ref=target.msg_id)


def delete_of(n: int, by: int, later: int, lie: bool = False) -> MsgV1:
    """A delete of message(n); ``lie``: it claims USERS[by] wrote it."""
    target = message(n)
    claims = Claims(USERS[by], target.hlc, target.kind) if lie else Claims.of(target)
    return refers(MessageKind.DELETE, n, by, later, claims.encode())


def reaction_to(n: int, by: int, later: int, retract: bool = False) -> MsgV1:
    return refers(MessageKind.REACTION, n, by, later, reaction_payload(b"+1", retract=retract))


def receipt_for(n: int, by: int, later: int) -> MsgV1:
    return refers(MessageKind.READ_RECEIPT, n, by, later, message(n).hlc.to_bytes())


def kinds(targets: st.SearchStrategy[int]) -> st.SearchStrategy[MsgV1]:
    """Edits, deletes (true or lying), reactions (or retractions) and receipts of targets."""
    by, later = st.integers(0, 3), st.integers(1, 30)
    return st.one_of(
        st.builds(refers, st.just(MessageKind.EDIT), targets, by, later, st.just(b"edited")),
        st.builds(delete_of, targets, by, later, st.booleans()),
        st.builds(reaction_to, targets, by, later, st.booleans()),
        st.builds(receipt_for, targets, by, later),
    )


KINDS = kinds(st.integers(0, 60))
RECORDS: st.SearchStrategy[Record] = st.one_of(
    st.integers(0, 60).map(message),
    MEMBER_OPS,
    st.builds(identity, st.integers(0, 3), st.integers(1, 6), st.integers(0, 3)),
    KINDS,
)


def domain_of(record: Record) -> Domain:
    if isinstance(record, MsgV1):
        return Domain.DELETES if record.kind is MessageKind.DELETE else Domain.MESSAGES
    if isinstance(record, MembershipOp):
        return Domain.MEMBERS
    return Domain.IDENTITY


def fill(replica: MemoryReplica, records: Iterable[Record]) -> MemoryReplica:
    for record in records:
        replica.apply(domain_of(record), [record])
    return replica


def contents(replica: MemoryReplica) -> tuple[object, ...]:
    return (
        sorted(replica.messages),
        sorted(replica.member_ops),
        sorted(replica.members.items()),
        sorted(replica.identities.items()),
        sorted(replica.visible_ids()),
        sorted(replica.deletes),
        [replica.view(chat) for chat in CHATS],
    )


def roots(replica: object) -> list[tuple[bytes, int]]:
    return [replica.tree(d).root() for d in Domain]  # type: ignore[attr-defined]


def held_keys(replica: Any, domain: Domain) -> dict[bytes, bytes]:
    """Record id -> placement key (its chat; an identity's and the index's: its user) of
    what a memory or RocksDB replica holds in a domain."""
    if isinstance(replica, DbReplica):
        db = replica.db
        pairs = {
            Domain.MESSAGES: db.iter_msg_chats,
            Domain.DELETES: db.iter_delete_chats,
            Domain.MEMBERS: db.members.iter_op_chats,
            Domain.IDENTITY: db.iter_identity_users,
            Domain.INDEX: db.member_index.iter_users,
        }[domain]()
        return dict(pairs)
    if domain is Domain.IDENTITY:
        return {compute_identity_record_id(u, *v): u for u, v in replica.identities.items()}
    rows = {
        Domain.MESSAGES: replica.messages,
        Domain.DELETES: replica.deletes,
        Domain.MEMBERS: replica.member_ops,
        Domain.INDEX: replica.index,
    }[domain]
    return {i: placement_key(domain, r) for i, r in rows.items()}


def in_domain(domain: Domain, key: bytes, scope: Scope) -> bool:
    """A scoped domain's record with placement key ``key`` lies in ``scope``."""
    shards = domain_shards(domain, scope)
    return shards is None or shard_in(domain, key, scope.num_shards) in shards


def assert_trees_match_contents(replica: MemoryReplica) -> None:
    """The incrementally maintained trees equal trees rebuilt from what is stored."""
    for domain in Domain:
        ids = replica.record_ids(domain)
        assert replica.tree(domain) == MerkleTree.from_ids(ids), domain


def decoded(frame: bytes) -> Frame:
    """A frame as its receiver reads it, with limits far above any test's."""
    return decode_frame(frame, max_frame=1 << 24, max_ids=1 << 20)


@dataclass
class Wire:
    """Every frame of a loopback session in order, decoded (pass it as ``on_frame``)."""

    frames: list[tuple[str, Frame]] = field(default_factory=list)

    def __call__(self, sender: str, frame: bytes) -> None:
        self.frames.append((sender, decoded(frame)))

    def transfers(self, sender: str | None = None) -> list[Transfer]:
        return [f for s, f in self.frames if isinstance(f, Transfer) and sender in (None, s)]

    def records(self, sender: str) -> list[bytes]:
        """The record blobs ``sender`` shipped, in order."""
        out = []
        for s, f in self.frames:
            if sender != s:
                continue
            if isinstance(f, Transfer):
                out.extend(r for section in f.sections.values() for r in section.records)
            elif isinstance(f, Hello):  # a closing HELLO carries its pass's last pushes
                out.extend(r for records in f.records.values() for r in records)
        return out


def advance(
    initiator: SyncSession,
    responder: SyncSession,
    state: State,
    role: SessionRole | None = None,
    *,
    now_ms: int = 0,
) -> tuple[SyncSession, bytes]:
    """Run both sessions until one (of ``role``, if given) is about to receive a frame in
    ``state``: that session, and the frame its honest peer sent it (not yet delivered)."""
    frame: bytes | None = initiator.start(now_ms)
    receiver = responder
    while frame is not None:
        if receiver.state is state and role in (None, receiver.role):
            return receiver, frame
        frame = receiver.receive(frame, now_ms)
        receiver = initiator if receiver is responder else responder
    raise AssertionError(f"no frame reached the {role} in state {state}")
