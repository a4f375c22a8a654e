"""Fuzz target ``sync_session``: a peer's frames fed to a ``SyncSession`` in every live state.

Two small ``MemoryReplica``s under the message rule (a message is stored once a member
op admits its sender) that differ in every domain (signed messages, signed member ops —
a leave on one side, a re-add on the other —, identity documents; two of one side's
messages share a bucket, so the id-list path runs too) sync once per config — plain (the
responder lists its small sets whole), by a descent, and authenticated with a retention cutoff. Before every frame of those honest sessions the receiving side is
saved: that is a *checkpoint*, one per (config, role, state, step).

Input: ``[checkpoint index][frame](SEP[frame])*`` — the session of that checkpoint,
restored with its replica, receives the frames in order (up to ``MAX_FRAMES``).

Properties: ``receive`` raises nothing but ``RemoteProtocolError``, after which the
session is ABORTED with that reason; a reply is a frame we can decode; ``None`` only
when the session is over; and the replica stays valid — every tree equals the tree
rebuilt from what is stored, every stored id is its record's id, every message is
signed by its sender and admitted by the stored member ops (none is both stored and
waiting), every member row and history is the fold of its (chat, user)'s ops, with
``authenticate`` every member op and identity verifies, and nothing stored before is
lost.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass

from fuzz_support import NOW_MS, instrumented, main

with instrumented(__name__ == "__main__"):
    from store.access import MemberHistory, admissible
    from store.authz import new_group
    from store.hlc import Hlc
    from store.keys import bucket_of
    from store.merge import merge_member_states
    from store.ops import MembershipAction, MembershipOp, make_identity, verify_identity
    from store.records import (
        IdentityRecord,
        MemberInfo,
        MessageKind,
        MsgV1,
        blake3_id,
        compute_identity_record_id,
    )
    from store.signing import key_from_seed, public_key, user_id_from_key
    from sync.errors import RemoteProtocolError
    from sync.frames import Domain, decode_frame
    from sync.merkle import MerkleTree
    from sync.protocol import SessionRole, State, SyncConfig, SyncSession
    from sync.replica import MemoryReplica, Record

TARGET = "sync_session"
SEP = b"\xfe\xed\xfa\xce"
MAX_FRAMES = 4
CUTOFF_MS = NOW_MS - 3_600_000  # messages at or before it are neither shipped nor taken
# plain (small sets: whole listings), by a descent, authenticated with a cutoff
CONFIGS = [
    SyncConfig(),
    SyncConfig(listings=False),
    SyncConfig(authenticate=True, cutoff_ms=CUTOFF_MS),
]
DECODE_LIMITS = {"max_frame": 1 << 26, "max_ids": 1 << 22}


# --- the two replicas ---------------------------------------------------------------------


def _records() -> tuple[list[Record], list[Record]]:
    """What the initiator's and the responder's replicas hold (deterministic)."""
    keys = [key_from_seed(bytes([i + 1]) * 32) for i in range(3)]
    users = [user_id_from_key(public_key(k)) for k in keys]
    group = new_group(keys[0], b"fuzz-sync-group!")
    chat = group.chat_id()
    base = NOW_MS - 60_000

    def msg(n: int, ms: int) -> MsgV1:
        return MsgV1.create(keys[n % 3], chat, Hlc(ms), b"message %d" % n)

    # Two messages in one bucket, both on the initiator only: an impure cell, an id list.
    by_bucket: dict[int, MsgV1] = {}
    n = 100
    while True:
        m = msg(n, base + n)
        if bucket_of(m.msg_id) in by_bucket:
            pair = [by_bucket[bucket_of(m.msg_id)], m]
            break
        by_bucket[bucket_of(m.msg_id)] = m
        n += 1
    both = [msg(i, base + i) for i in range(3)]
    only_a = [msg(3, base + 3), msg(4, CUTOFF_MS - 10), *pair]
    only_b = [msg(5, base + 5), msg(6, CUTOFF_MS - 20), msg(7, base + 55)]  # 7: user 1, hidden

    def op(user: int, ms: int, action: MembershipAction = MembershipAction.ADD) -> MembershipOp:
        signer = keys[user] if action is MembershipAction.LEAVE else keys[0]  # 0 created it
        return MembershipOp.create(signer, chat, users[user], action, Hlc(ms), proof=group)

    # Every author added before its oldest message (stamps before the cutoff: member ops
    # have none); then user 1 leaves (on B only) and is added again (on A only): stored
    # everywhere, message 7 (user 1, between the two) is shown nowhere.
    joined = [op(n, CUTOFF_MS - 1_000 + n) for n in range(3)]
    members_a = [*joined, op(1, base + 60)]
    members_b = [*joined, op(1, base + 50, MembershipAction.LEAVE)]
    ident = [make_identity(k, bytes([i]) * 32, Hlc(base + i)) for i, k in enumerate(keys)]
    newer = make_identity(keys[1], b"\x09" * 32, Hlc(base + 99))
    # member ops first: a message applied before the op admitting it would wait
    a: list[Record] = [*members_a, *both, *only_a, ident[0], ident[1]]
    b: list[Record] = [*members_b, *both, *only_b, ident[0], newer, ident[2]]
    return a, b


def _domain(record: Record) -> Domain:
    if isinstance(record, MsgV1):
        return Domain.DELETES if record.kind is MessageKind.DELETE else Domain.MESSAGES
    return Domain.MEMBERS if isinstance(record, MembershipOp) else Domain.IDENTITY


def _replica(records: list[Record]) -> MemoryReplica:
    replica = MemoryReplica()
    for record in records:
        replica.apply(_domain(record), [record])
    return replica


def _stored(replica: MemoryReplica) -> list[Record]:
    """Every record a replica holds, as records (to rebuild an equal replica): member ops
    first, so that every message is admitted again."""
    out: list[Record] = list(replica.member_ops.values())
    out += replica.messages.values()
    out += replica.deletes.values()
    out += [IdentityRecord(u, hlc, blob) for u, (hlc, blob) in replica.identities.items()]
    return out


def check_replica(replica: MemoryReplica, config: SyncConfig, before: set[bytes]) -> None:
    """The replica is internally consistent and holds only authenticated records."""
    ids = {
        Domain.MESSAGES: set(replica.messages),
        Domain.MEMBERS: {blake3_id(op.encode()) for op in replica.member_ops.values()},
        Domain.IDENTITY: {compute_identity_record_id(u, *v) for u, v in replica.identities.items()},
        Domain.DELETES: set(replica.deletes),
        Domain.INDEX: {blake3_id(op.encode()) for op in replica.index.values()},
    }
    for domain in Domain:
        if set(replica.record_ids(domain)) != ids[domain]:
            raise AssertionError(f"{domain.name}: index and stored rows disagree")
        if replica.tree(domain) != MerkleTree.from_ids(ids[domain]):
            raise AssertionError(f"{domain.name}: tree differs from the tree of the stored ids")
    if set(replica.member_ops) != ids[Domain.MEMBERS] or set(replica.index) != ids[Domain.INDEX]:
        raise AssertionError("a member op stored under another id")
    for msg_id, msg in replica.messages.items():
        if msg.msg_id != msg_id:
            raise AssertionError("a message stored under another id")
        msg.verify()  # BadSignature here is a crash: a forged message was applied
        if not admissible(msg, replica.access(msg.chat_id, msg.sender)):
            raise AssertionError("a message stored that no member op admits")
    if any(m.msg_id in replica.messages for m in replica.waiting.waiting()):
        raise AssertionError("a message both stored and waiting")
    _check_member_folds(replica)
    if config.authenticate:
        for op in replica.member_ops.values():
            op.verify()
            op.authorize()
        for user, (hlc, blob) in replica.identities.items():
            verify_identity(IdentityRecord(user, hlc, blob))
    if not before <= set(replica.messages) | set(replica.member_ops):
        raise AssertionError("records were lost")


def _check_member_folds(replica: MemoryReplica) -> None:
    """Each (chat, user)'s row and history are the fold of its ops, whatever their order."""
    rows: dict[tuple[bytes, bytes], MemberInfo | None] = {}
    stamps: dict[tuple[bytes, bytes], list[tuple[Hlc, bool]]] = {}
    for op in replica.member_ops.values():
        key = (op.chat_id, op.user_id)
        rows[key] = merge_member_states(rows.get(key), op.state())
        stamps.setdefault(key, []).append((op.hlc, op.action is MembershipAction.ADD))
    if replica.members != rows:
        raise AssertionError("member rows differ from the fold of their ops")
    if replica.histories != {k: MemberHistory.of(v) for k, v in stamps.items()}:
        raise AssertionError("member histories differ from their ops' stamps")


# --- checkpoints --------------------------------------------------------------------------


@dataclass
class Checkpoint:
    config: SyncConfig
    role: SessionRole
    state: State
    saved: bytes  # the session's attributes but its replica, pickled before ``frames[0]``
    records: list[Record]  # what its replica held then
    frames: list[bytes]  # the honest frames this session received from here on
    replica: MemoryReplica | None = None  # the working copy (rebuilt when an input changed it)
    fingerprint: tuple[object, ...] = ()


def _fingerprint(replica: MemoryReplica) -> tuple[object, ...]:
    """What the replica holds: its trees, and the messages waiting for their member op."""
    waiting = sorted(m.msg_id for m in replica.waiting.waiting())
    return (*(replica.tree(d).root() for d in Domain), *waiting)


def checkpoints() -> list[Checkpoint]:
    """Every state of two honest sessions (one per config), from each side."""
    a_records, b_records = _records()
    out: list[Checkpoint] = []
    for config in CONFIGS:
        a, b = _replica(a_records), _replica(b_records)
        init = SyncSession(
            SessionRole.INITIATOR, a, now_ms=NOW_MS, salt_seed=b"fuzz", config=config
        )
        resp = SyncSession(SessionRole.RESPONDER, b, now_ms=NOW_MS, config=config)
        frames: list[bytes] = []
        saved: list[Checkpoint] = []
        replica_of = {id(init): a, id(resp): b}
        frame: bytes | None = init.start(NOW_MS)
        receiver = resp
        while frame is not None:
            state = pickle.dumps({k: v for k, v in vars(receiver).items() if k != "replica"})
            saved.append(
                Checkpoint(
                    config,
                    receiver.role,
                    receiver.state,
                    state,
                    _stored(replica_of[id(receiver)]),
                    [],
                )
            )
            frames.append(frame)
            frame = receiver.receive(frame, NOW_MS)
            receiver = init if receiver is resp else resp
        for step, checkpoint in enumerate(saved):  # frames alternate: this side gets every other
            checkpoint.frames = frames[step::2]
        out += saved
    return out


_CHECKPOINTS: list[Checkpoint] = []


def _restore(checkpoint: Checkpoint) -> tuple[SyncSession, MemoryReplica]:
    if checkpoint.replica is None:
        checkpoint.replica = _replica(checkpoint.records)
        checkpoint.fingerprint = _fingerprint(checkpoint.replica)
    # The session exactly as it was at the checkpoint (a copy: unpickled, not re-run).
    session = SyncSession.__new__(SyncSession)
    vars(session).update(pickle.loads(checkpoint.saved))
    session.replica = checkpoint.replica
    return session, checkpoint.replica


def one_input(data: bytes) -> None:
    if not _CHECKPOINTS:
        _CHECKPOINTS.extend(checkpoints())
    if not data:
        return
    checkpoint = _CHECKPOINTS[data[0] % len(_CHECKPOINTS)]
    session, replica = _restore(checkpoint)
    before = set(replica.messages) | set(replica.member_ops)
    try:
        for frame in data[1:].split(SEP)[:MAX_FRAMES]:
            if session.finished:
                break
            _receive(session, frame)
    finally:
        if _fingerprint(replica) != checkpoint.fingerprint:  # records were applied
            checkpoint.replica = None  # the next input starts from a fresh copy
            check_replica(replica, checkpoint.config, before)


def _receive(session: SyncSession, frame: bytes) -> None:
    try:
        reply = session.receive(frame, NOW_MS)
    except RemoteProtocolError as exc:
        if session.state is not State.ABORTED or session.error != exc.reason:
            raise AssertionError(f"session not aborted with {exc.reason!r}") from exc
        decode_frame(session.abort_frame(), **DECODE_LIMITS)
        return
    if reply is None:
        if not session.finished:
            raise AssertionError("no reply, but the session goes on")
        return
    decode_frame(reply, **DECODE_LIMITS)  # our own frames are always valid


def seeds() -> dict[str, bytes]:
    """Per checkpoint: the honest next frame, and the honest next two (a deeper start)."""
    out: dict[str, bytes] = {}
    for index, checkpoint in enumerate(checkpoints()):
        name = f"{index:02d}-{checkpoint.role.value}-{checkpoint.state.value}"
        out[name] = bytes([index]) + checkpoint.frames[0]
        if len(checkpoint.frames) > 1:
            out[name + "-2"] = bytes([index]) + checkpoint.frames[0] + SEP + checkpoint.frames[1]
    return out


if __name__ == "__main__":
    main(TARGET, one_input, seeds)
