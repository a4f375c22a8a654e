"""Group keys in the simulator (issue 34): the generator's senders (``sim.sender_keys``) keep the
client's rule, their KEYS messages are in every trace, and the oracle's count
(``sim.key_oracle``) is 0 on a healthy trace and sees a sender that does not rotate."""

from __future__ import annotations

from pathlib import Path

import pytest

import client.group_e2e as ge
from sim import sender_keys as sk
from sim.bugs import Bug
from sim.group_payloads import group_message, keys_message, read_group_message, read_keys
from sim.key_oracle import KEYS, NEW, count_keys
from sim.key_oracle import Row as KeyRow
from store import trace as tr
from store.hlc import Hlc
from store.ops import decode_op
from store.records import MessageKind, MsgV1

from sim_support import brute_force_keys, small_trace


def test_the_restated_rotation_rule_is_the_client_s() -> None:
    assert (sk.EPOCH_MESSAGES, sk.EPOCH_MS) == (ge.EPOCH_MESSAGES, ge.EPOCH_MS)
    members = frozenset({1, 2})
    ids = {1: b"\x01" * 20, 2: b"\x02" * 20, 3: b"\x03" * 20}
    client = ge.new_epoch(frozenset(ids[u] for u in members), Hlc(1_000))
    ours = sk.Epoch(b"k" * 16, members, 1_000)
    for now, seen, sent in [
        (2_000, members, 0),
        (2_000, {1, 2, 3}, 0),  # an add
        (2_000, {1}, 0),  # a removal
        (2_000, members, ge.EPOCH_MESSAGES),
        (1_000 + ge.EPOCH_MS, members, 0),
    ]:
        theirs = ge.Epoch(client.key, client.recipients, client.started, sent)
        want = ge.needs_new_epoch(theirs, frozenset(ids[u] for u in seen), Hlc(now))
        mine = sk.Epoch(ours.key_id, ours.recipients, ours.started_ms, sent)
        assert sk.needs_new_epoch(mine, frozenset(seen), now) == want, (now, seen, sent)
    assert sk.needs_new_epoch(None, members, 0)
    # a change in the removals seen starts an epoch too, as the client's
    gone = frozenset({(3, 1_500)})
    seen_gone = ge.Epoch(client.key, client.recipients, client.started, removed=frozenset({(ids[3], Hlc(1_500))}))  # fmt: skip
    assert ge.needs_new_epoch(seen_gone, client.recipients, Hlc(2_000))  # it saw one, now none
    assert sk.needs_new_epoch(ours, members, 2_000, gone)
    assert not sk.needs_new_epoch(sk.Epoch(b"k" * 16, members, 1_000, 0, removed=gone), members, 2_000, gone)  # fmt: skip
    # the planted bug: a removal alone keeps the epoch, an add still rotates
    assert not sk.needs_new_epoch(ours, frozenset({1}), 2_000, notice_removals=False)
    assert sk.needs_new_epoch(ours, frozenset({1, 2, 3}), 2_000, notice_removals=False)


def test_the_stand_in_payloads_read_back_and_others_read_as_none() -> None:
    a, b = b"a" * 20, b"b" * 20
    keys = keys_message([(b"k" * 16, frozenset({b, a}))], [(b"k" * 16, b, 7)])
    grants = read_keys(keys)
    assert grants is not None
    assert grants.epochs == ((b"k" * 16, frozenset({a, b})),) and grants.messages
    for junk in (b"", b"\xff" * 40, b"hello", keys_message([], [])[:-1]):
        assert read_keys(junk) is None and read_group_message(junk) is None


def _rows(path: Path) -> list[tuple[int, MsgV1]]:
    trace = tr.read_trace(path)
    out = []
    for row in trace.table.select(["t_ms", "kind", "op"]).to_pylist():
        if row["kind"] == tr.MSG:
            msg = decode_op(tr.OP_CODES[tr.MSG], row["op"])
            assert isinstance(msg, MsgV1)
            out.append((row["t_ms"], msg))
    return out


def test_a_trace_seals_group_messages_and_grants_their_keys(tmp_path: Path) -> None:
    msgs = _rows(small_trace(3, tmp_path / "t.parquet"))
    sealed = [m for _, m in msgs if m.kind in sk.SEALED]
    keys = [m for _, m in msgs if m.kind is MessageKind.KEYS]
    assert sealed and keys and all(m.ref is None for m in keys)
    granted: set[tuple[bytes, bytes]] = set()
    late = 0
    for m in keys:
        grants = read_keys(m.payload)
        assert grants is not None
        granted |= {(m.sender, key_id) for key_id, _ in grants.epochs}
        late += len(grants.messages)
    assert late > 0  # adds a sender learnt of late
    plain = [m for m in sealed if m.payload.startswith(b"plain ")]
    assert 0 < len(plain) < len(sealed) / 2  # posts of senders who knew they were no member
    for m in sealed:
        envelope = read_group_message(m.payload)
        assert (envelope is None) == (m in plain)
        # every key id a sender seals under is one it granted (but a far-ahead clock's)
        assert (
            envelope is None
            or (m.sender, envelope.key_id) in granted
            or envelope.key_id == sk.NO_KEY
        )
    assert any(e.removed_seen for m in sealed if (e := read_group_message(m.payload)) is not None)


def test_the_oracle_counts_nothing_on_healthy_traces_and_sees_the_lazy_sender(
    tmp_path: Path,
) -> None:
    for seed in (1, 2, 3):
        healthy = brute_force_keys(small_trace(seed, tmp_path / f"h{seed}.parquet"))
        assert healthy.group_messages > 100 and healthy.keys_messages > 50
        assert healthy.undecryptable_for_member == 0 and healthy.readable_by_removed == 0
        lazy = small_trace(seed, tmp_path / f"l{seed}.parquet", plant=Bug.NO_ROTATE_ON_REMOVE.value)
        assert brute_force_keys(lazy).readable_by_removed > 0
    # seed 1's trace has a removed sender whose key a member must hand over
    idle = small_trace(1, tmp_path / "n1.parquet", plant=Bug.NO_HAND_OVER.value)
    assert brute_force_keys(idle).undecryptable_for_member > 0


A, B, C = b"a" * 20, b"b" * 20, b"c" * 20
K1, K2 = b"1" * 16, b"2" * 16


def _sealed(sender: bytes, hlc: int, key: bytes, seen: dict[bytes, int] | None = None) -> KeyRow:
    return (False, sender, hlc, NEW, group_message(key, (seen or {}).items(), b"x"))


@pytest.mark.parametrize(
    ("rows", "want"),
    [
        # b removed at 20, a knew it and kept b's epoch: b reads what it should not
        (
            [(True, B, 20, 0, None), (False, A, 30, KEYS, keys_message([(K1, frozenset({A, B}))], [])),
             _sealed(A, 31, K1, {B: 20})],
            {"readable_by_removed": 1},
        ),
        # ... a removal a did not know of (or another one) does not count
        (
            [(True, B, 20, 0, None), (False, A, 30, KEYS, keys_message([(K1, frozenset({A, B}))], [])),
             _sealed(A, 31, K1)],
            {},
        ),
        # c added at 25, a's epoch left it out: undecryptable, until a message grant
        (
            [(True, C, 25, 1, None), (False, A, 10, KEYS, keys_message([(K1, frozenset({A, B}))], [])),
             _sealed(A, 31, K1)],
            {"undecryptable_for_member": 1},
        ),
        (
            [(True, C, 25, 1, None), (False, A, 10, KEYS, keys_message([(K1, frozenset({A, B}))], [])),
             _sealed(A, 31, K1), (False, A, 40, KEYS, keys_message([], [(K1, C, 31)]))],
            {},
        ),
        # ... a grant sent when a was (unknown to it) no member is stored, hidden, and read
        (
            [(True, C, 25, 1, None), (False, A, 10, KEYS, keys_message([(K1, frozenset({A, B}))], [])),
             _sealed(A, 31, K1), (True, A, 35, 0, None),
             (False, A, 40, KEYS, keys_message([], [(K1, C, 31)]))],
            {},
        ),
        # ... but not one of someone never added (a replica holds none of theirs)
        (
            [(True, C, 25, 1, None), (False, A, 10, KEYS, keys_message([(K1, frozenset({A, B}))], [])),
             _sealed(A, 31, K1), (False, b"d" * 20, 40, KEYS, keys_message([], [(K1, C, 31)]))],
            {"undecryptable_for_member": 1},
        ),
        # ... which b hands over
        (
            [(True, C, 25, 1, None), (False, A, 10, KEYS, keys_message([(K1, frozenset({A, B}))], [])),
             _sealed(A, 31, K1), (True, A, 35, 0, None),
             (False, B, 41, KEYS, keys_message([], [(K1, C, 31)]))],
            {},
        ),
        # ... a hand-over from someone who does not hold the epoch is worthless
        (
            [(True, C, 25, 1, None), (False, A, 10, KEYS, keys_message([(K1, frozenset({A, B}))], [])),
             _sealed(A, 31, K1), (True, A, 35, 0, None),
             (False, C, 41, KEYS, keys_message([], [(K1, C, 31)]))],
            {"undecryptable_for_member": 1},
        ),
        # ... an epoch grant hidden (a removed at 5 and re-added at 8, unknown to it): its
        # recipients read a's valid message under it, also with a and b removed since
        (
            [(True, A, 5, 0, None), (False, A, 6, KEYS, keys_message([(K1, frozenset({A, B}))], [])),
             (True, A, 8, 1, None), _sealed(A, 31, K1), (True, A, 35, 0, None),
             (True, B, 36, 0, None)],
            {},
        ),
        # ... and a hidden grant is no loophole: b, removed at 4 as a's message says a saw,
        # reads it through the hidden epoch grant that still named b
        (
            [(True, A, 5, 0, None), (True, B, 4, 0, None),
             (False, A, 6, KEYS, keys_message([(K1, frozenset({A, B}))], [])),
             (True, A, 8, 1, None), _sealed(A, 31, K1, {B: 4})],
            {"readable_by_removed": 1},
        ),
        # a key for another epoch, an edit, a non-member's message (not counted)
        (
            [(False, A, 10, KEYS, keys_message([(K2, frozenset({A, B}))], [])), _sealed(A, 31, K1),
             (False, C, 32, NEW, _sealed(C, 32, K1)[4])],
            {"undecryptable_for_member": 2},
        ),
    ],
)  # fmt: skip
def test_the_key_oracle_on_small_chats(rows: list[KeyRow], want: dict[str, int]) -> None:
    ops: list[KeyRow] = [(True, A, 1, 1, None), (True, B, 2, 1, None)]
    counts = count_keys(ops + rows)
    got = {
        name: getattr(counts, name)
        for name in ("undecryptable_for_member", "readable_by_removed")
        if getattr(counts, name)
    }
    assert got == want
