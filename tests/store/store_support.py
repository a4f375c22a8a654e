"""Strategies and helpers shared by the store tests (a plain module next to them).

Everything here builds real objects: real ed25519 keys (made once, reused: signing is the
slow part), real ChatDb instances on RocksDB in temporary directories.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Iterator
from functools import reduce
from typing import Any

from hypothesis import strategies as st

from store import ChatDb, ChatDbConfig, Hlc, MemberInfo, MessageKind, MsgV1, Role
from store.authz import new_group
from store.hlc import HLC_ZERO, MAX_LOGICAL, MAX_PHYSICAL
from store.merge import add_op_state, merge_member_states, remove_op_state
from store.ops import MembershipAction, MembershipOp
from store.records import (
    STANDALONE,
    blake3_id,
    compute_identity_record_id,
    compute_member_record_id,
    decode_identity_value,
    decode_member_info,
)
from store.rocks import COLUMN_FAMILIES
from store.signing import key_from_seed, public_key, user_id_from_key

# Three authors, created once for the whole session.
KEYS = tuple(key_from_seed(bytes([i + 1]) * 32) for i in range(3))
AUTHOR_IDS = tuple(user_id_from_key(public_key(k)) for k in KEYS)

# Chat ids include both ends of the key space (all-0xff has no prefix_end).
CHATS = (bytes(32), bytes([0x42]) * 32, b"\xff" * 32)
# Plain 20-byte user ids for members, identity, inbox and read progress.
USERS = tuple(bytes([0x10 + i]) * 20 for i in range(4))

BIG = 1 << 40  # a byte budget nothing reaches

# A group created by KEYS[0], and signed ops on it (each made once: signing is the slow part).
GROUP = new_group(KEYS[0], b"store-test-group")
GROUP_CHAT = GROUP.chat_id()


@functools.cache
def group_op(
    user: int, hlc: int, *, remove: bool = False, role: Role = Role.PARTICIPANT
) -> MembershipOp:
    """The creator's add (or remove) of AUTHOR_IDS[user] in GROUP_CHAT at Hlc(hlc)."""
    action = MembershipAction.REMOVE if remove else MembershipAction.ADD
    return MembershipOp.create(
        KEYS[0], GROUP_CHAT, AUTHOR_IDS[user], action, Hlc(hlc), role, proof=GROUP
    )


def small_config(path: str, **overrides: Any) -> ChatDbConfig:
    return ChatDbConfig(path=path, block_cache_mb=8, memtable_mb=8, **overrides)


# Property tests open a database per example: a tmpfs, where there is one, spares them the
# fsyncs of RocksDB's open and close (it is still a real RocksDB in a temporary directory).
TMP_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@contextlib.contextmanager
def fresh_db(**overrides: Any) -> Iterator[ChatDb]:
    """A new ChatDb in its own temporary directory (usable inside @given examples)."""
    with tempfile.TemporaryDirectory(prefix="chatdb-test-", dir=TMP_ROOT) as tmp:
        db = ChatDb(small_config(tmp, **overrides))
        try:
            yield db
        finally:
            db.close()


def make_msg(
    chat_id: bytes,
    hlc: Hlc,
    payload: bytes = b"payload",
    *,
    author: int = 0,
    kind: MessageKind = MessageKind.NEW,
    ref: bytes | None = None,
    max_payload: int | None = None,
) -> MsgV1:
    extra = {} if max_payload is None else {"max_payload": max_payload}
    return MsgV1.create(KEYS[author], chat_id, hlc, payload, kind=kind, ref=ref, **extra)


def receipt_of(read: MsgV1, stamp: Hlc, *, author: int = 0) -> MsgV1:
    """A read receipt of ``KEYS[author]``'s user up to ``read``, stamped ``stamp``."""
    position = read.hlc.to_bytes()
    kind = MessageKind.READ_RECEIPT
    return make_msg(read.chat_id, stamp, position, author=author, kind=kind, ref=read.msg_id)


# --- strategies ---------------------------------------------------------------------------

hlcs = st.builds(Hlc, st.integers(0, MAX_PHYSICAL), st.integers(0, MAX_LOGICAL))


def small_hlcs(max_physical: int = 4, max_logical: int = 2) -> st.SearchStrategy[Hlc]:
    """Stamps from a tiny range, so ties are common."""
    return st.builds(Hlc, st.integers(0, max_physical), st.integers(0, max_logical))


def removal_stamps(max_physical: int = 4, max_logical: int = 2) -> st.SearchStrategy[Hlc]:
    """Stamps a Remove can carry: never ZERO ("never removed" is written None)."""
    return small_hlcs(max_physical, max_logical).filter(lambda h: h != HLC_ZERO)


roles = st.sampled_from(Role)
member_infos = st.builds(MemberInfo, roles, small_hlcs(), st.none() | removal_stamps())
optional_member_infos = st.none() | member_infos

# One member op: ("add", role, hlc) | ("remove", hlc) | ("record", MemberInfo).
member_ops = st.one_of(
    st.tuples(st.just("add"), roles, small_hlcs()),
    st.tuples(st.just("remove"), removal_stamps()),
    st.tuples(st.just("record"), member_infos),
)


def op_state(op: tuple[Any, ...]) -> MemberInfo:
    """The MemberInfo an op contributes to the join."""
    if op[0] == "add":
        return add_op_state(op[1], op[2])
    if op[0] == "remove":
        return remove_op_state(op[1])
    info: MemberInfo = op[1]
    return info


def fold_members(states: list[MemberInfo]) -> MemberInfo | None:
    return reduce(merge_member_states, states, None)


msg_kinds = st.sampled_from(MessageKind)


@st.composite
def messages(
    draw: st.DrawFn,
    chats: tuple[bytes, ...] = CHATS,
    stamps: st.SearchStrategy[Hlc] | None = None,
) -> MsgV1:
    """A real signed message (any kind; all but NEW and KEYS carry a ref)."""
    kind = draw(msg_kinds)
    ref = None if kind in STANDALONE else draw(st.binary(min_size=32, max_size=32))
    return make_msg(
        draw(st.sampled_from(chats)),
        draw(stamps if stamps is not None else hlcs),
        draw(st.binary(max_size=64)),
        author=draw(st.integers(0, len(KEYS) - 1)),
        kind=kind,
        ref=ref,
    )


# --- reading a ChatDb back ----------------------------------------------------------------


def dump_all(db: ChatDb) -> dict[str, dict[bytes, bytes]]:
    """Every key and value of every column family: compare before/after to prove no write."""
    return {cf: dict(db.iter_all(cf)) for cf in COLUMN_FAMILIES}


def dump_logged(db: ChatDb) -> dict[str, dict[bytes, Any]]:
    """``dump_all`` with the event log as its events (position -> kind, key), not its rows:
    one write's events are one row (store/events.py), so stores that wrote the same events
    in other batches agree here."""
    state: dict[str, dict[bytes, Any]] = dict(dump_all(db))
    state["events"] = {
        position.to_bytes(8, "big"): (kind, ref)
        for position, kind, ref in db.events.events_after(0, 1 << 62)
    }
    return state


def msg_ids(db: ChatDb) -> list[bytes]:
    out: list[bytes] = []
    db.for_each_msg_id(lambda msg_id, _physical: out.append(msg_id))
    return out


def member_record_ids(db: ChatDb) -> list[bytes]:
    out: list[bytes] = []
    db.for_each_member_record_id(out.append)
    return out


def identity_record_ids(db: ChatDb) -> list[bytes]:
    out: list[bytes] = []
    db.for_each_identity_record_id(out.append)
    return out


def member_rows(db: ChatDb) -> dict[tuple[bytes, bytes], MemberInfo]:
    """Every (chat, user) row of CF members, tombstones included."""
    return {(k[:32], k[32:]): decode_member_info(v) for k, v in db.iter_all("members")}


def member_row_ids(rows: dict[tuple[bytes, bytes], MemberInfo]) -> set[bytes]:
    return {
        compute_member_record_id(chat, user, i.role, i.added_at, i.removed_at)
        for (chat, user), i in rows.items()
    }


def identity_row_ids(db: ChatDb) -> set[bytes]:
    return {
        compute_identity_record_id(user, *decode_identity_value(raw))
        for user, raw in db.iter_all("identity")
    }


def replicated_state(db: ChatDb) -> dict[str, Any]:
    """Everything sync ships, read back through the sync helpers and the raw CFs."""
    ids = msg_ids(db)
    encoded, more = db.get_messages_cbor_batch(ids, BIG)
    assert not more
    member_ids = member_record_ids(db)
    member_encoded, more = db.get_member_records_batch(member_ids, BIG)
    assert not more
    identity_ids = identity_record_ids(db)
    identity_encoded, more = db.get_identity_records_batch(identity_ids, BIG)
    assert not more
    seen_msg = dict(db.iter_all("seen_msg"))
    return {
        "messages": {blake3_id(e): e for e in encoded},
        # the seen_msg value is the local message key; only its chat and HLC are replicated
        "seen_msg": {m: (k[:32], k[32:40]) for m, k in seen_msg.items()},
        "members": dict(db.iter_all("members")),
        "member_records": sorted(member_encoded),
        "seen_member": dict(db.iter_all("seen_member")),
        "identity": dict(db.iter_all("identity")),
        "identity_records": sorted(identity_encoded),
        "seen_identity": dict(db.iter_all("seen_identity")),
    }
