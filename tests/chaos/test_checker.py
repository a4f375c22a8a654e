"""The checker over synthetic histories: a clean one passes, and each kind of violation is
counted by its own counter (and by no other)."""

from __future__ import annotations

import copy

from chaos.checker import COUNTERS, Expected, NodeState, check
from chaos.history import (
    ACKED,
    DELETES,
    IDENTITY,
    MEMBERS,
    MESSAGES,
    REFUSED,
    UNKNOWN,
    Epoch,
    EventPage,
    History,
    OpRecord,
    ReadRecord,
    SessionLog,
)

ALICE, GUEST, CHAT = "a1" * 20, "9e" * 20, "c0" * 32


def op(
    i: str,
    kind: str = "new",
    status: str = ACKED,
    *,
    user: str = ALICE,
    ref: str = "",
    hlc: int = 1,
) -> OpRecord:
    domain = {"delete": DELETES, "member": MEMBERS, "identity": IDENTITY}.get(kind, MESSAGES)
    return OpRecord(i, domain, kind, 1, "", user, CHAT, ref, hlc, 0, 0, 1.0, 1.5, status, "")


def world() -> tuple[History, list[NodeState], Expected]:
    """Two nodes that agree: m1, m2 (m2 deleted by d1, with its edit e2), a member op, an
    identity; a refused message; an unknown one that landed; one session and two reads."""
    h = History(nodes=2, seed=1, users={ALICE: "member", GUEST: "guest"}, chats=[CHAT])
    h.ops = [
        op("m1"), op("m2"), op("e2", "edit", ref="m2"), op("d1", "delete", ref="m2"),
        op("o1", "member"), op("i1", "identity", hlc=5), op("x1", status=REFUSED),
        op("u1", status=UNKNOWN), op("g1", user=GUEST),
    ]  # fmt: skip
    ids = {MESSAGES: {"m1", "u1", "g1"}, DELETES: {"d1"}, MEMBERS: {"o1"}, IDENTITY: {"i1"}}
    states = [
        NodeState(n, copy.deepcopy(ids), {ALICE: 5}, {"m1", "u1"}, {CHAT: "v"}, {"messages": "r"})
        for n in range(2)
    ]
    h.sessions["s0"] = SessionLog(
        "s0", ALICE, 0,
        epochs=[Epoch(0.0, [EventPage(1.0, [1, 2], ["member:o1", "message:m1"]), EventPage(2.0, [3], ["message:m2"])])],
        final_positions=[1, 2, 4], final_keys=["member:o1", "message:m1", "delete:d1"],
    )  # fmt: skip
    h.reads = [
        ReadRecord("s0", 0, 1.0, CHAT, ["g1", "m2", "m1"], [9, 8, 7], False),
        ReadRecord("s0", 0, 2.0, CHAT, ["m1"], [7], False),
    ]
    expected = Expected(copy.deepcopy(ids), {"m1", "u1"}, {CHAT: "v"}, {"m2", "e2"})
    return h, states, expected


def nonzero(report_counters: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in report_counters.items() if v}


def test_a_clean_history_passes_with_and_without_the_oracle() -> None:
    h, states, expected = world()
    for exp in (expected, None):
        report = check(h, states, exp)
        assert report.ok, report.examples
        assert set(report.counters) == set(COUNTERS)
    assert check(h, states).stats["unknown_present"] == 1


def test_an_acked_op_missing_on_one_node_is_lost() -> None:
    h, states, expected = world()
    states[1].ids[MESSAGES].discard("m1")
    assert nonzero(check(h, states).counters) == {"lost": 1}
    assert nonzero(check(h, states, expected).counters) == {
        "lost": 1, "oracle_mismatch": 1,
    }  # fmt: skip


def test_an_identity_superseded_is_not_lost_but_an_older_one_is() -> None:
    h, states, _ = world()
    states[0].identities[ALICE] = 9
    assert check(h, states).ok
    states[1].identities[ALICE] = 2
    assert nonzero(check(h, states).counters) == {"lost": 1}


def test_a_refused_op_on_a_node_is_counted() -> None:
    h, states, _ = world()
    states[0].ids[MESSAGES].add("x1")
    assert nonzero(check(h, states).counters) == {"refused_present": 1}


def test_a_record_nobody_submitted_is_extra() -> None:
    h, states, _ = world()
    states[1].ids[DELETES].add("zz")
    assert nonzero(check(h, states).counters) == {"extra": 1}


def test_nodes_with_other_roots_have_not_converged() -> None:
    h, states, _ = world()
    states[1].roots = {"messages": "other"}
    assert nonzero(check(h, states).counters) == {"not_converged": 1}
    states[1].roots = None  # no answer after the heal
    assert nonzero(check(h, states).counters) == {"not_converged": 1}


def test_the_oracle_finds_wrong_visibility_and_wrong_views() -> None:
    h, states, expected = world()
    states[0].visible.add("g1")
    states[1].views[CHAT] = "w"
    assert nonzero(check(h, states, expected).counters) == {"wrong_visible": 1, "wrong_view": 1}


def test_stream_gaps_duplicates_and_rollbacks() -> None:
    h, states, _ = world()
    session = h.sessions["s0"]
    session.final_positions = [1, 2, 3, 4]
    session.final_keys = ["member:o1", "message:m1", "message:g9", "delete:d1"]
    session.epochs[0].pages[1] = EventPage(2.0, [4], ["delete:d1"])  # 3 never came
    assert nonzero(check(h, states).counters) == {"stream_gaps": 1}
    session.epochs[0].pages.append(EventPage(3.0, [4], ["delete:d1"]))  # 4 again
    assert nonzero(check(h, states).counters) == {"stream_gaps": 1, "stream_dups": 1}


def test_an_event_gone_from_the_log_while_its_record_is_shown_is_a_rollback() -> None:
    h, states, _ = world()
    session = h.sessions["s0"]
    session.final_keys[1] = "message:u1"  # position 2 reused for another event (m1 still shown)
    assert nonzero(check(h, states).counters) == {"stream_rollbacks": 1}
    h, states, _ = world()
    h.sessions["s0"].epochs.append(Epoch(5.0, [], reason="unknown_position"))
    h.sessions["s0"].final_positions, h.sessions["s0"].final_keys = [], []
    assert nonzero(check(h, states).counters) == {"stream_rollbacks": 1}


def test_a_message_read_then_gone_on_the_same_node_is_a_nonmonotonic_read() -> None:
    h, states, _ = world()
    h.reads.append(ReadRecord("s0", 0, 3.0, CHAT, [], [], False))  # m1 read at 2.0, gone now
    assert nonzero(check(h, states).counters) == {"nonmonotonic_reads": 1}
    h.reads[-1] = ReadRecord("s0", 0, 3.0, CHAT, ["n1", "n2"], [20, 10], True)
    assert check(h, states).ok  # m1 is below a full page's window: not a violation
    h.reads[-1] = ReadRecord("s0", 1, 3.0, CHAT, [], [], False)
    assert check(h, states).ok  # another node: no promise


def test_a_message_skipped_while_hidden_and_sent_again_is_no_gap() -> None:
    h, states, _ = world()
    session = h.sessions["s0"]
    session.final_positions = [1, 2, 3, 4, 5]
    session.final_keys = ["member:o1", "message:m1", "message:g1", "hidden:g1", "message:g1"]
    session.epochs[0].pages[1] = EventPage(2.0, [4, 5], ["hidden:g1", "message:g1"])
    assert check(h, states).ok  # position 3 was skipped (g1 hidden then), g1 came at 5


def test_a_message_at_the_page_floor_may_give_way_to_another_with_the_same_stamp() -> None:
    h, states, _ = world()
    h.reads.append(ReadRecord("s0", 0, 3.0, CHAT, ["n1", "n2"], [20, 7], True))
    assert check(h, states).ok  # m1 (stamp 7) sorts after n2 (stamp 7): off the page
