"""CRDT merge rules, pure: no I/O, no clock reads.

Members (seed 002): a (chat, user) row carries ``added_at`` and ``removed_at``
and is active iff ``removed_at`` is absent or strictly older than ``added_at``.
Merging takes the maximum of each stamp, and the role that goes with the
greater ``added_at``.

Tie-break. The seed says "local wins on tie" for the role when both sides have
the same ``added_at``. That is not commutative: replica A keeps its role,
replica B keeps its own, and they never agree. Here the role is taken from the
greater ``(added_at, role)`` pair instead, so on a tie the higher role wins.
The state is then a pair of max-registers over total orders — a join
semilattice — which makes the merge commutative, associative and idempotent,
and any delivery order, duplication or regrouping of ops ends in one state.
(Two adds with one HLC stamp can only come from one author's clock, so the tie
is a corner case; what matters is that every replica breaks it the same way.)

Identity: last writer wins by HLC; equal stamps with different blobs are
broken by the blob's bytes (greater wins) — again a total order, so the
winner does not depend on arrival order.

ChatMeta: ``last_msg_*`` follow the newest message by ``(hlc, msg_id)``, a
total order; ``members`` and ``membership_hash`` are functions of the active
member set. Only ``last_seq`` (and the seq in message keys) depends on
arrival order: it is a local counter, not replicated state.
"""

from __future__ import annotations

from dataclasses import replace

from store.hlc import HLC_ZERO, LOGICAL_BITS, Hlc
from store.records import ChatMeta, MemberInfo, Role, make_chat_meta


def _or_zero(stamp: Hlc | None) -> Hlc:
    return stamp if stamp is not None else HLC_ZERO


def merge_member_states(local: MemberInfo | None, remote: MemberInfo | None) -> MemberInfo | None:
    """Join of two member states (either may be absent). Commutative, associative, idempotent.

    Each side is a max-register over a total order: (added_at, role, add_proof) and
    (removed_at, remove_proof). The proofs — the signed ops behind the stamps — travel
    with the stamp that wins, and only break ties between equal stamps.
    """
    if local is None:
        return remote
    if remote is None:
        return local
    added_at, role, add_proof = max(
        (local.added_at, local.role, local.add_proof or b""),
        (remote.added_at, remote.role, remote.add_proof or b""),
    )
    removed, remove_proof = max(
        (_or_zero(local.removed_at), local.remove_proof or b""),
        (_or_zero(remote.removed_at), remote.remove_proof or b""),
    )
    if removed == HLC_ZERO:
        return MemberInfo(Role(role), added_at, None, add_proof or None, None)
    return MemberInfo(Role(role), added_at, removed, add_proof or None, remove_proof or None)


def add_op_state(role: Role, hlc: Hlc, proof: bytes | None = None) -> MemberInfo:
    """The state an Add op contributes: merged in, it advances added_at only."""
    return MemberInfo(role, hlc, None, proof, None)


def remove_op_state(hlc: Hlc, proof: bytes | None = None) -> MemberInfo:
    """The state a Remove op contributes: a tombstone-only placeholder (added_at = ZERO)."""
    return MemberInfo(Role.PARTICIPANT, HLC_ZERO, hlc, None, proof)


def identity_wins(incoming: tuple[Hlc, bytes], stored: tuple[Hlc, bytes] | None) -> bool:
    """LWW: should ``incoming`` (hlc, blob) replace ``stored``? Ties broken by blob bytes."""
    return stored is None or incoming > stored


def meta_after_message(meta: ChatMeta, msg_id: bytes, hlc: Hlc) -> ChatMeta:
    """ChatMeta after storing one new message: next local seq, newest message by (hlc, id)."""
    return meta_after_messages(meta, meta.last_seq + 1, hlc.pack(), msg_id)


def meta_after_messages(
    meta: ChatMeta, last_seq: int, newest_hlc: int, newest_id: bytes
) -> ChatMeta:
    """ChatMeta after storing several new messages at once (one put_messages batch).

    ``last_seq`` is the last seq given out; (``newest_hlc`` packed, ``newest_id``)
    the greatest (hlc, id) among the new messages. The result equals folding
    ``meta_after_message`` over them one by one: the seq counts up, and a running
    maximum of (hlc, id) ends at the maximum of the old newest and the batch's.
    """
    # Every field spelled out (make_chat_meta), not dataclasses.replace: this runs on every
    # put and replace costs several times more (tests/store/test_fast_codecs.py: the same).
    last_msg_ts = meta.last_msg_ts
    # (newest_hlc, newest_id) > (last_msg_ts, last_msg_id), without building the tuples
    if newest_hlc > last_msg_ts or (newest_hlc == last_msg_ts and newest_id > meta.last_msg_id):
        last_ts, last_msg_id, last_msg_ts = newest_hlc >> LOGICAL_BITS, newest_id, newest_hlc
    else:
        last_ts, last_msg_id = meta.last_ts, meta.last_msg_id
    return make_chat_meta(
        last_ts,
        last_seq,
        last_msg_id,
        meta.members,
        last_msg_ts,
        meta.last_announced_ms,
        meta.identity,
        meta.membership_hash,
    )


def meta_after_membership(meta: ChatMeta, user_id: bytes, active: bool) -> ChatMeta:
    """ChatMeta with ``user_id`` in or out of the active member set."""
    members = set(meta.members)
    if (user_id in members) == active:
        return meta
    members.symmetric_difference_update({user_id})
    mask = int.from_bytes(meta.membership_hash, "big") ^ int.from_bytes(user_id, "big")
    return replace(meta, members=tuple(sorted(members)), membership_hash=mask.to_bytes(32, "big"))
