"""The checker: a chaos run's history and the nodes' final states in, counters out (pure).

Every counter is 0 on a correct run:

* ``lost`` — an acknowledged op (201, or 202 after the WriteBatch) missing on a live node
  after heal and quiescence, unless the rules take it away: a message a delete erases
  (the oracle's erased set; without the oracle, the ones the final deletes name, their
  edits and reactions) or an identity a newer one of its user supersedes;
* ``refused_present`` — a refused op (a JSON refusal, or a connection never opened) held
  by some node;
* ``extra`` — a record some node holds that no client submitted;
* ``not_converged`` — nodes whose roots (``/status``, after quiescence) are not node 0's;
* ``oracle_mismatch``, ``wrong_visible``, ``wrong_view`` — with the oracle (the
  simulator's, fed the final op set): nodes whose records per domain, or whose visible
  messages, differ from the oracle's; (node, chat) pairs whose folded view differs;
* ``stream_gaps``, ``stream_dups``, ``stream_rollbacks`` — per client session, events of
  the node's final log (up to what the session read) it never got, at that position or any
  other (the log skips a message hidden when read, and logs it again when it is shown
  after all); events it got twice
  (a position not after the last one); and events it got that the log no longer has at
  that position, or a token the node no longer knew (410 ``unknown_position``);
* ``nonmonotonic_reads`` — a message a session read on its node that a later read of the
  same chat on the same node no longer showed (stamped above the later page's lowest
  stamp, a full page; not erased; not the guest's, whose visibility member ops legitimately
  change).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from chaos.history import (
    ACKED,
    DELETES,
    DOMAINS,
    IDENTITY,
    MEMBERS,
    MESSAGES,
    REFUSED,
    UNKNOWN,
    History,
    OpRecord,
    SessionLog,
)

COUNTERS = (
    "lost",
    "refused_present",
    "extra",
    "not_converged",
    "oracle_mismatch",
    "wrong_visible",
    "wrong_view",
    "stream_gaps",
    "stream_dups",
    "stream_rollbacks",
    "nonmonotonic_reads",
)
EXAMPLES = 5  # examples kept per counter


@dataclass
class NodeState:
    """A node after the run: records per domain (hex ids), identities (user -> packed
    HLC), visible message ids, each chat's view digest, and its roots as ``/status`` gave them."""

    index: int
    ids: dict[str, set[str]]
    identities: dict[str, int]
    visible: set[str] = field(default_factory=set)
    views: dict[str, str] = field(default_factory=dict)
    roots: dict[str, str] | None = None


@dataclass
class Expected:
    """The oracle's final state from the final op set."""

    ids: dict[str, set[str]]
    visible: set[str]
    views: dict[str, str]
    erased: set[str]


@dataclass
class Report:
    counters: dict[str, int]
    stats: dict[str, Any]
    examples: dict[str, list[str]]

    @property
    def ok(self) -> bool:
        return not any(self.counters.values())


class _Tally:
    def __init__(self) -> None:
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.examples: dict[str, list[str]] = {}

    def add(self, counter: str, example: str, n: int = 1) -> None:
        self.counters[counter] += n
        shown = self.examples.setdefault(counter, [])
        if len(shown) < EXAMPLES:
            shown.append(example)


def check(history: History, finals: list[NodeState], expected: Expected | None = None) -> Report:
    tally = _Tally()
    present = _present_anywhere(history.ops, finals)
    final_ops = [op for op in history.ops if op.status == ACKED or op.id in present]
    erased = expected.erased if expected is not None else erased_by(final_ops)
    _check_ops(history.ops, finals, erased, expected, tally)
    _check_extra(history.ops, finals, tally)
    _check_convergence(finals, tally)
    if expected is not None:
        _check_oracle(history, finals, expected, tally)
    shown = {s.index: s.visible | s.ids[DELETES] | s.ids[MEMBERS] for s in finals}
    for session in history.sessions.values():
        _check_session(session, shown.get(session.node, set()), tally)
    _check_reads(history, erased, tally)
    stats = _stats(history, present)
    return Report(tally.counters, stats, tally.examples)


def holds(state: NodeState, op: OpRecord) -> bool:
    """Whether the node holds ``op`` (an identity: it or a newer one of its user)."""
    if op.domain == IDENTITY:
        return state.identities.get(op.user, -1) >= op.hlc
    return op.id in state.ids[op.domain]


def _present_anywhere(ops: list[OpRecord], finals: list[NodeState]) -> set[str]:
    return {op.id for op in ops if any(op.id in s.ids[op.domain] for s in finals)}


def erased_by(ops: list[OpRecord]) -> set[str]:
    """The messages the deletes among ``ops`` take away: each target, its edits by its
    sender, its reactions (MESSAGES.md; the workload deletes only its own messages)."""
    targets = {op.ref for op in ops if op.kind == "delete"}
    senders = {op.id: op.user for op in ops if op.id in targets}
    out = set(targets)
    for op in ops:
        if op.ref in targets and (
            op.kind == "reaction" or (op.kind == "edit" and op.user == senders.get(op.ref))
        ):
            out.add(op.id)
    return out


def _check_ops(
    ops: list[OpRecord],
    finals: list[NodeState],
    erased: set[str],
    expected: Expected | None,
    tally: _Tally,
) -> None:
    for op in ops:
        if op.status == ACKED:
            if op.domain == MESSAGES and op.id in erased:
                continue
            if (
                expected is not None
                and op.domain != IDENTITY
                and op.id not in expected.ids[op.domain]
            ):
                continue  # the rules keep it nowhere (e.g. waiting for ever): not a loss
            missing = [s.index for s in finals if not holds(s, op)]
            if missing:
                tally.add(
                    "lost",
                    f"{op.kind} {op.id[:16]} acked by node {op.node} at {op.done_s:.1f} s, missing on nodes {missing}",
                )
        elif op.status == REFUSED:
            at = [s.index for s in finals if op.id in s.ids[op.domain]]
            if at:
                tally.add(
                    "refused_present",
                    f"{op.kind} {op.id[:16]} refused by node {op.node} ({op.code}), held by nodes {at}",
                )


def _check_extra(ops: list[OpRecord], finals: list[NodeState], tally: _Tally) -> None:
    known = {op.id for op in ops}
    for state in finals:
        for domain in DOMAINS:
            for rid in sorted(state.ids[domain] - known):
                tally.add("extra", f"node {state.index} holds {domain} {rid[:16]} nobody submitted")


def _check_convergence(finals: list[NodeState], tally: _Tally) -> None:
    if not finals:
        return
    first = finals[0].roots
    for state in finals[1:]:
        if state.roots is None or state.roots != first:
            tally.add(
                "not_converged",
                f"node {state.index} roots {state.roots} != node {finals[0].index}'s {first}",
            )
    if first is None:
        tally.add("not_converged", f"node {finals[0].index} gave no roots")


def _check_oracle(
    history: History, finals: list[NodeState], expected: Expected, tally: _Tally
) -> None:
    for state in finals:
        for domain in DOMAINS:
            mine, theirs = state.ids[domain], expected.ids[domain]
            if mine != theirs:
                tally.add(
                    "oracle_mismatch",
                    f"node {state.index} {domain}: {len(mine - theirs)} not expected, {len(theirs - mine)} missing",
                )
        if state.visible != expected.visible:
            tally.add(
                "wrong_visible",
                f"node {state.index}: {len(state.visible - expected.visible)} shown not visible, {len(expected.visible - state.visible)} visible not shown",
            )
        for chat in history.chats:
            if state.views.get(chat) != expected.views.get(chat):
                tally.add("wrong_view", f"node {state.index} chat {chat[:16]}")


def _check_session(session: SessionLog, shown: set[str], tally: _Tally) -> None:
    for epoch in session.epochs:
        if epoch.reason == "unknown_position":
            tally.add(
                "stream_rollbacks",
                f"{session.name} on node {session.node}: token past the log's end at {epoch.start_s:.1f} s",
            )
        last = 0
        for page in epoch.pages:
            for position in page.positions:
                if position <= last:
                    tally.add(
                        "stream_dups",
                        f"{session.name} on node {session.node}: position {position} after {last} at {page.t_s:.1f} s",
                    )
                last = max(last, position)
    if not session.epochs:
        return
    got = {
        p: k
        for page in session.epochs[-1].pages
        for p, k in zip(page.positions, page.keys, strict=True)
    }
    final = dict(zip(session.final_positions, session.final_keys, strict=True))
    top = max(got, default=0)
    for position, key in sorted(got.items()):
        if final.get(position) != key and key.partition(":")[2] in shown:
            tally.add(
                "stream_rollbacks",
                f"{session.name} on node {session.node}: got {key} at {position}, the log now has {final.get(position)}",
            )
    received = set(got.values())
    for position in sorted(p for p in final if p <= top and p not in got):
        if final[position] in received:
            continue  # skipped while hidden, sent again when shown after all: nothing missed
        tally.add(
            "stream_gaps",
            f"{session.name} on node {session.node}: never got position {position} ({final[position]})",
        )


def _check_reads(history: History, erased: set[str], tally: _Tally) -> None:
    guest = {user for user, role in history.users.items() if role == "guest"}
    sender = {op.id: op.user for op in history.ops if op.domain == MESSAGES}
    last: dict[tuple[str, str], Any] = {}
    for read in sorted(history.reads, key=lambda r: r.t_s):
        key = (read.session, read.chat)
        before = last.get(key)
        last[key] = read
        if before is None or before.node != read.node:
            continue
        shown = set(read.ids)
        floor = min(read.hlcs) if read.full and read.hlcs else -1
        for msg_id, hlc in zip(before.ids, before.hlcs, strict=True):
            # at the page's lowest stamp another message with the same HLC may stand in its place
            if msg_id in shown or hlc <= floor or msg_id in erased or sender.get(msg_id) in guest:
                continue
            tally.add(
                "nonmonotonic_reads",
                f"{read.session} on node {read.node}: {msg_id[:16]} read at {before.t_s:.1f} s, gone at {read.t_s:.1f} s",
            )


def _stats(history: History, present: set[str]) -> dict[str, Any]:
    by_status = Counter(op.status for op in history.ops)
    by_kind = Counter(f"{op.kind}:{op.status}" for op in history.ops)
    codes = Counter(op.code for op in history.ops if op.status != ACKED)
    faults = Counter(f.action.split()[0] for f in history.faults)
    return {
        "ops": len(history.ops),
        "acked": by_status[ACKED],
        "refused": by_status[REFUSED],
        "unknown": by_status[UNKNOWN],
        "unknown_present": sum(
            1 for op in history.ops if op.status == UNKNOWN and op.id in present
        ),
        "by_kind": dict(sorted(by_kind.items())),
        "not_acked_codes": dict(codes.most_common()),
        "fault_actions": dict(sorted(faults.items())),
        "fault_actions_failed": sum(1 for f in history.faults if not f.ok),
        "sessions": len(history.sessions),
        "session_epochs": sum(len(s.epochs) for s in history.sessions.values()),
        "events_read": sum(
            len(p.positions) for s in history.sessions.values() for e in s.epochs for p in e.pages
        ),
        "reads": len(history.reads),
        "heal_s": history.heal_s,
        "quiet_s": history.quiet_s,
    }
