"""``chatsync sim generate``: a synthetic trace of real signed ops and a fault schedule.

Two phases. The *plan* walks virtual time once, in one process: it draws every
op (kind, author, chat, origin node), runs each node's ``HlcClock`` on its own
(possibly skewed) physical clock to stamp the op, and lays out the faults. The
*signing* phase builds the real records — ``MsgV1.create``, ``MembershipOp.create``,
``make_identity``, each with the author's ed25519 key from ``key_from_seed`` over
(seed, user) — in parallel worker processes, one chunk of origin nodes each
(the plan signs the messages others refer to once itself, to know their ids: an
Ed25519 signature is deterministic). Same parameters and seed, same file, byte for byte.

Group messages are sealed, and KEYS messages granted, by each sender as it saw the chat's
members (``sim.sender_keys``).

Deliberate corner cases (``tie_rate``): an identity put and a member add/remove
pair whose twin carries the *same* HLC stamp from another device, so that the
tie-breaks (blob bytes, remove-wins) are exercised and a broken tie-break shows.
"""

from __future__ import annotations

import bisect
import heapq
import math
import os
import random
import shlex
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from sim import kind_plays, scenarios
from sim.bugs import Bug
from sim.opspec import OpSpec
from sim.rand import derive
from sim.scopes import ChatEvent, ScopeParams, plan_scopes
from sim.sender_keys import SEALED, SenderKeys
from store import trace as tr
from store.authz import NONCE_LEN, GroupProof, grant_admin, new_group
from store.hlc import DEFAULT_MAX_OFFSET_MS, VIRTUAL_EPOCH_MS, Hlc, HlcClock
from store.kinds import CONTENT
from store.ops import MembershipAction, MembershipOp, make_identity
from store.records import MessageKind, MsgV1, Role
from store.signing import key_from_seed, public_key, user_id_from_key
from sync.scope import shard_of as scope_shard_of
from sync.scope import user_shard_of

DAY_MS = 86_400_000
FAULTS = ("partition", "oneway", "drop", "dup", "delay", "crash", "skew", "far-future", "gc")
OP_WEIGHTS = {
    tr.MSG: 0.70,  # plain posts; edits, deletes, reactions and receipts: kind_plays.WEIGHTS
    tr.MEMBER_ADD: 0.04,
    tr.MEMBER_REMOVE: 0.03,
    tr.MEMBER_LEAVE: 0.02,
    tr.IDENTITY: 0.05,
}


FIRST_MEMBER_POSTS = 0.15  # share of plain posts by a chat's first members, removed or not


def parse_faults(text: str) -> frozenset[str]:
    """``all``, ``none`` or a comma-separated subset of FAULTS."""
    text = text.strip().lower()
    if text in ("all", ""):
        return frozenset(FAULTS) if text == "all" else frozenset()
    if text == "none":
        return frozenset()
    kinds = frozenset(k.strip() for k in text.split(",") if k.strip())
    unknown = kinds - set(FAULTS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; choose from {', '.join(FAULTS)}")
    return kinds


@dataclass
class GenParams:
    nodes: int
    users: int
    chats: int
    ops: int
    seed: int = 1
    faults: frozenset[str] = field(default_factory=lambda: frozenset(FAULTS))
    duration_s: float = 600.0
    retention_s: float | None = None  # default: a third of the duration when GC is on
    anti_entropy_ms: int = 10_000
    flush_ms: int = 1_000
    tie_rate: float = 0.05
    payload_min: int = 48
    payload_max: int = 160
    quiesce_rounds: int | None = None  # default: log2(nodes) + 6
    workers: int | None = None
    plant: str | None = None  # test only: a planted bug of the generator's (sim/bugs.py)
    scope_shards: int = 0  # partial replication (sim/scopes.py): a network of S shards; 0 full
    replication: int = 3  # each shard pinned on R nodes (rendezvous)

    def command(self, out: Path) -> str:
        parts = [
            "chatsync sim generate",
            f"--nodes {self.nodes}",
            f"--users {self.users}",
            f"--chats {self.chats}",
            f"--ops {self.ops}",
            f"--faults {','.join(sorted(self.faults)) or 'none'}",
            f"--duration-s {self.duration_s:g}",
            f"--seed {self.seed}",
        ]
        if self.retention_s is not None:
            parts.append(f"--retention-s {self.retention_s:g}")
        if self.tie_rate != 0.05:
            parts.append(f"--tie-rate {self.tie_rate:g}")
        if self.plant:
            parts.append(f"--plant {self.plant}")
        if self.scope_shards:
            parts.append(f"--scope-shards {self.scope_shards} --replication {self.replication}")
        parts.append(f"-o {shlex.quote(str(out))}")
        return " ".join(parts)


# --- keys and ids, derived from (seed, index) ----------------------------------------------


def user_key(seed: int, user: int) -> SigningKey:
    return key_from_seed(derive(seed, "user-key", user))


def chat_proof(seed: int, chat: int, creator: int) -> GroupProof:
    """A group chat: its id commits to its creator's key and a nonce (store.authz)."""
    return new_group(user_key(seed, creator), derive(seed, "chat-nonce", chat)[:NONCE_LEN])


# --- the plan -----------------------------------------------------------------------------


@dataclass
class Fault:
    t_ms: int
    kind: str
    node: int = -1
    args: dict[str, Any] = field(default_factory=dict)


class _Planner:
    def __init__(self, p: GenParams) -> None:
        self.p = p
        self.rng = random.Random(int.from_bytes(derive(p.seed, "plan"), "big"))
        self.start = VIRTUAL_EPOCH_MS
        self.heal = VIRTUAL_EPOCH_MS + int(p.duration_s * 1000)
        # Push-pull anti-entropy with one random peer per node and round spreads a record to
        # all nodes in about log3(N) + a few rounds; log2(N) + 6 leaves a margin.
        rounds = p.quiesce_rounds or math.ceil(math.log2(max(2, p.nodes))) + 6 + _scope_rounds(p)
        self.end = self.heal + rounds * p.anti_entropy_ms
        self.max_offset = DEFAULT_MAX_OFFSET_MS
        self.faults: list[Fault] = []
        # (faults when made, times, the cuts in time order, heal times): _cut_list
        self._cuts: tuple[int, list[int], list[Fault], list[int]] | None = None
        self.down: dict[int, list[tuple[int, int]]] = {n: [] for n in range(p.nodes)}
        self.offsets: dict[int, list[tuple[int, int]]] = {n: [] for n in range(p.nodes)}
        self.poisoned: dict[int, tuple[int, int]] = {}  # node -> (clock jumped, clock fixed)
        self.members = self._initial_members()
        self.strangers = [p.users + i for i in range(scenarios.STRANGERS)]
        self.specs: list[OpSpec] = []
        self.steps: list[tuple[int, int, Callable[[int], object]]] = []  # (t, seq, step)
        self._step_seq = 0
        self.roster: list[set[int]] = [set() for _ in range(p.chats)]  # members, as planned
        self.admins: list[set[int]] = [set() for _ in range(p.chats)]  # admin adds, as planned
        self.creators = [members[0] for members in self.members]
        self.posts: list[list[OpSpec]] = [[] for _ in range(p.chats)]  # NEW and REPLY, in order
        self.last_post: dict[tuple[int, int], OpSpec] = {}  # (node, chat) -> newest post there
        self._ids: dict[int, bytes] = {}  # spec index -> message id, for referenced messages
        self.clocks: list[HlcClock] = []
        self.keys = SenderKeys(
            self,
            p.seed,
            notice_removals=p.plant != Bug.NO_ROTATE_ON_REMOVE.value,
            hand_over=p.plant != Bug.NO_HAND_OVER.value,
        )

    def _initial_members(self) -> list[list[int]]:
        members = []
        for _ in range(self.p.chats):
            size = self.rng.randint(2, max(2, min(self.p.users, 8)))
            members.append(self.rng.sample(range(self.p.users), min(size, self.p.users)))
        return members

    # faults

    def plan_faults(self) -> None:
        p, rng, span = self.p, self.rng, self.heal - self.start
        if p.faults & {"drop", "dup", "delay"}:
            self._plan_net()
        episodes = [k for k in ("partition", "oneway") if k in p.faults]
        if episodes and p.nodes >= 2:
            count = max(2, int(span / 90_000))
            slot = span // (count + 1)
            for i in range(count):
                kind = episodes[i % len(episodes)]
                t = self.start + slot * i + rng.randrange(max(1, slot // 2))
                size = rng.randint(1, max(1, p.nodes // 3))
                group = sorted(rng.sample(range(p.nodes), size))
                name = tr.PARTITION if kind == "partition" else tr.PARTITION_ONEWAY
                self.faults.append(Fault(t, name, args={"group": group}))
                heal_at = min(t + rng.randint(5_000, max(5_000, min(slot, 40_000))), self.heal - 1)
                self.faults.append(Fault(heal_at, tr.HEAL))
        if "crash" in p.faults:
            count = max(1, round(p.nodes * span / 600_000 / 8))
            for _ in range(count):
                node = rng.randrange(p.nodes)
                t = self.start + rng.randrange(span)
                back = min(t + rng.randint(2_000, 30_000), self.heal - 1)
                if t >= back or any(a <= back and t <= b for a, b in self.down[node]):
                    continue
                self.down[node].append((t, back))
                self.faults.append(Fault(t, tr.CRASH, node))
                self.faults.append(Fault(back, tr.RESTART, node))
        if "far-future" in p.faults and p.nodes >= 3:
            # The clock jumps a day (plus the trace) ahead — past max offset for the rest of the
            # trace — and is fixed again after a minute or less. The node's HLC stays ahead (as an
            # HLC must), so it makes no valid op again; what it made meanwhile nobody honest takes.
            node = rng.randrange(p.nodes)
            t = self.start + rng.randrange(span // 4, span // 2)
            fixed = min(t + rng.randint(10_000, 60_000), self.heal - 1)
            self._set_offset(node, t, DAY_MS + (self.end - self.start), tr.FAR_FUTURE)
            self._set_offset(node, fixed, 0, tr.SKEW)
            self.poisoned[node] = (t, fixed)
        if "skew" in p.faults:
            bound = self.max_offset // 4
            honest = [n for n in range(p.nodes) if n not in self.poisoned]
            for node in rng.sample(honest, max(1, len(honest) // 4)):
                t = self.start + rng.randrange(span)
                self._set_offset(node, t, rng.randint(-bound, bound), tr.SKEW)
                back = t + rng.randint(20_000, 120_000)
                if back < self.heal:
                    self._set_offset(node, back, 0, tr.SKEW)
        if "gc" in p.faults:
            self._plan_gc()
        # At heal: everything back to normal (the replay does this implicitly too).
        self.faults.append(Fault(self.heal, tr.HEAL))
        self.faults.append(Fault(self.heal, tr.NET, args=self._calm_net()))
        for node in range(p.nodes):
            if self.offsets[node]:
                self._set_offset(node, self.heal, 0, tr.SKEW)
        if "gc" in p.faults:
            for node in range(p.nodes):
                self.faults.append(Fault(self.heal, tr.GC, node))

    def _plan_gc(self) -> None:
        """Each node's GC runs just after its local clock moves the cutoff to the next grain.

        Through the quiescence too: a node that missed a message which then aged out is not
        sent it again (the soft filter), so the replicas agree only once everyone collected it.
        """
        grain, retention = self.grain_ms(), self.retention_ms()
        for node in range(self.p.nodes):
            local = self.start + (retention - self.start) % grain
            while local < self.end:
                t = local - self.offset(node, local) + self.rng.randrange(max(1, grain // 10))
                jumped = self.poisoned.get(node)
                if jumped is not None and jumped[0] <= t <= jumped[1]:
                    local += grain  # a GC at a far-future clock would collect everything
                    continue
                if self.start <= t < self.end:
                    self.faults.append(Fault(t, tr.GC, node))
                local += grain

    def _calm_net(self) -> dict[str, Any]:
        return {"drop": 0.0, "dup": 0.0, "delay_ms": 50, "jitter_ms": 100}

    def _plan_net(self) -> None:
        p, rng, span = self.p, self.rng, self.heal - self.start
        phases = max(2, int(span / 120_000))
        for i in range(phases):
            t = self.start + span * i // phases
            burst = i % 2 == 1
            self.faults.append(
                Fault(
                    t,
                    tr.NET,
                    args={
                        "drop": (0.1 if burst else 0.01) if "drop" in p.faults else 0.0,
                        "dup": (0.05 if burst else 0.01) if "dup" in p.faults else 0.0,
                        "delay_ms": rng.randint(50, 500) if "delay" in p.faults else 50,
                        "jitter_ms": rng.randint(200, 3_000) if "delay" in p.faults else 100,
                    },
                )
            )

    def _set_offset(self, node: int, t: int, offset: int, kind: str) -> None:
        self.offsets[node].append((t, offset))
        self.offsets[node].sort()
        self.faults.append(Fault(t, kind, node, {"offset_ms": offset}))

    def retention_ms(self) -> int:
        """Default: messages start to age during the workload, and the final GC keeps some.

        With Q the quiescence after heal and D the workload, retention is Q + (D - Q) / 2:
        GC collects from then on, and the final GC (at heal + Q) keeps the last (D - Q) / 2
        of the workload. With D <= Q, Q + D / 2: nothing ages before heal.
        """
        if "gc" not in self.p.faults:
            return 10 * 365 * DAY_MS
        if self.p.retention_s is not None:
            return int(self.p.retention_s * 1000)
        workload, quiet = self.heal - self.start, self.end - self.heal
        if workload > quiet:
            return quiet + (workload - quiet) // 2
        return quiet + workload // 2

    def grain_ms(self) -> int:
        if "gc" not in self.p.faults:
            return 1
        return min(60_000, max(1_000, self.retention_ms() // 10))

    def poisoned_by(self, node: int, t: int, *, after_fix: bool = False) -> bool:
        """Has ``node``'s clock jumped by ``t`` (and been fixed, with ``after_fix``)?"""
        if node not in self.poisoned:
            return False
        return t >= self.poisoned[node][1 if after_fix else 0]

    def is_down(self, node: int, t: int) -> bool:
        return any(a <= t < b for a, b in self.down[node])

    def offset(self, node: int, t: int) -> int:
        current = 0
        for at, value in self.offsets[node]:
            if at > t:
                break
            current = value
        return current

    # ops

    def plan_ops(self) -> list[OpSpec]:
        p, rng = self.p, self.rng
        self.clocks = [HlcClock() for _ in range(p.nodes)]
        kinds = [*OP_WEIGHTS, *scenarios.WEIGHTS]
        weights = [*OP_WEIGHTS.values(), *scenarios.WEIGHTS.values()]
        span = self.heal - self.start
        times = sorted(self.start + rng.randrange(span) for _ in range(p.ops))
        # Every chat's creator adds its initial members in the first moments; the second one
        # is an admin (the creator signs an AdminGrant for it).
        t0 = self.start
        for chat, members in enumerate(self.members):
            creator = members[0]
            node = self.origin(creator, t0, row_op=True)
            for i, member in enumerate(members):
                role = int(Role.ADMIN) if i < 2 else int(Role.PARTICIPANT)
                self._member(t0, node, tr.MEMBER_ADD, creator, chat, member, role)
        plays = scenarios.Scenarios(self, p.chats)
        kinds_plays = kind_plays.KindPlays(self, p.chats)
        kinds += list(kind_plays.WEIGHTS)
        weights += list(kind_plays.WEIGHTS.values())
        for t_partition in self._partition_starts():
            # a removal races a post across each, and a delete races an edit
            self.later(t_partition + rng.randint(500, 4_000), plays.race)
            self.later(t_partition + rng.randint(500, 4_000), kinds_plays.delete_across)
        for t in times[len(self.specs) :]:
            self._run_steps(until=t)
            kind = rng.choices(kinds, weights)[0]
            if kind in scenarios.WEIGHTS:
                plays.start(kind, t)
            elif kind in kind_plays.WEIGHTS:
                kinds_plays.start(kind, t)
            else:
                self._random_op(kind, t)
        self._run_steps(until=self.heal - 1)
        self.keys.finish(self.heal - 1)
        return self.specs

    def _random_op(self, kind: str, t: int) -> None:
        p, rng = self.p, self.rng
        chat = rng.randrange(p.chats)
        members = self.members[chat]
        creator = members[0]
        if kind == tr.MSG:
            # mostly a member as the plan left the chat; now and then one of its first members,
            # who may have been removed since (a post that is stored, and hidden)
            roster = self.roster[chat]
            first = rng.random() < FIRST_MEMBER_POSTS or not roster
            self.post(t, rng.choice(members if first else sorted(roster)), chat)
        elif kind in (tr.MEMBER_ADD, tr.MEMBER_REMOVE):
            target = rng.randrange(p.users)
            role = int(Role.ADMIN) if rng.random() < 0.1 else int(Role.PARTICIPANT)
            # An admin may add participants and remove anyone but the creator.
            granted = (
                len(members) > 1
                and rng.random() < 0.3
                and target != creator
                and (kind == tr.MEMBER_REMOVE or role == int(Role.PARTICIPANT))
            )
            actor = members[1] if granted else creator
            node = self.origin(actor, t, row_op=True)
            hlc = self._member(t, node, kind, actor, chat, target, role, granted=granted)
            if rng.random() < p.tie_rate and p.nodes > 1:
                # The creator's other device does the opposite at the very same stamp.
                twin = tr.MEMBER_REMOVE if kind == tr.MEMBER_ADD else tr.MEMBER_ADD
                other = (node + 1) % p.nodes
                if not self.is_down(other, t) and not self.poisoned_by(other, t):
                    self._member(t, other, twin, creator, chat, target, role, hlc=hlc)
        elif kind == tr.MEMBER_LEAVE:
            self.member_op(t, kind, chat, rng.choice(members))
        else:
            user = rng.randrange(p.users)
            node = self.origin(user, t, row_op=True)
            hlc = self.stamp(node, t)
            self.add(OpSpec(0, t, node, kind, user, hlc=hlc, box=rng.randrange(1 << 30)))
            if rng.random() < p.tie_rate and p.nodes > 1:
                other = (node + 1) % p.nodes
                if not self.is_down(other, t) and not self.poisoned_by(other, t):
                    self.add(OpSpec(0, t, other, kind, user, hlc=hlc, box=rng.randrange(1 << 30)))

    # --- the steps of scenarios (sim.scenarios), run in time order with the workload ---

    def later(self, t_ms: int, step: Callable[[int], object]) -> None:
        if t_ms < self.heal:
            heapq.heappush(self.steps, (t_ms, self._step_seq, step))
            self._step_seq += 1

    def _run_steps(self, until: int) -> None:
        while self.steps and self.steps[0][0] <= until:
            t, _, step = heapq.heappop(self.steps)
            step(t)

    # --- making ops ---

    def origin(self, user: int, t: int, row_op: bool = False) -> int:
        """The node a user's op is made on: their home node, or their next device up."""
        p = self.p
        node = user % p.nodes
        for step in range(p.nodes):  # the user's device is down: another device of theirs
            candidate = (node + step) % p.nodes
            if self.usable(candidate, t, row_op):
                return candidate
        return node

    def usable(self, node: int, t: int, row_op: bool = False) -> bool:
        """Up, and its clock makes valid ops. Past its fix a poisoned device makes no valid
        op (its HLC is still ahead), so the user goes on from another device. Row ops leave
        it at the jump: honest nodes refuse a row version carrying a far-future stamp, and
        valid state that only that version held would be stuck there."""
        return not self.is_down(node, t) and not self.poisoned_by(node, t, after_fix=not row_op)

    def stamp(self, node: int, t: int) -> int:
        return self.clocks[node].now(t + self.offset(node, t)).pack()

    def add(self, spec: OpSpec) -> None:
        spec.index = len(self.specs)
        self.specs.append(spec)

    def post(self, t_ms: int, author: int, chat: int, node: int | None = None) -> int | None:
        """A NEW message, or now and then a REPLY to the node's newest post in the chat."""
        if node is None or not self.usable(node, t_ms):
            node = self.origin(author, t_ms)
        last = self.last_post.get((node, chat))
        if self.rng.random() < 0.2 and last is not None:
            self.message(t_ms, node, author, chat, MessageKind.REPLY, last)
        else:
            self.message(t_ms, node, author, chat, MessageKind.NEW)
        return node

    def message(
        self,
        t_ms: int,
        node: int,
        author: int,
        chat: int,
        kind: MessageKind,
        target: OpSpec | None = None,
        payload: bytes | None = None,
    ) -> OpSpec:
        """A message of any kind; ``target``: the message its ``ref`` names."""
        ref = None if target is None else self.msg_id(target)
        if payload is None and kind in SEALED:  # sealed under its sender's key (sim.sender_keys)
            hlc, payload = self.keys.seal(t_ms, node, author, chat, self._filler(author, t_ms))
        else:
            hlc = self.stamp(node, t_ms)
        spec = OpSpec(0, t_ms, node, tr.MSG, author, chat, hlc=hlc)
        spec.msg_kind, spec.ref, spec.payload = int(kind), ref, payload
        self.add(spec)
        if kind in CONTENT:
            self.posts[chat].append(spec)
            self.last_post[(node, chat)] = spec
        return spec

    def _filler(self, author: int, t_ms: int) -> bytes:
        """What stands in for a group message's ciphertext."""
        lo, hi = self.p.payload_min, self.p.payload_max
        draw = derive(self.p.seed, "payload", author, t_ms, len(self.specs))
        size = lo + int.from_bytes(draw[:4], "big") % (hi - lo + 1)
        return (draw * (size // 32 + 1))[:size]

    def msg_id(self, spec: OpSpec) -> bytes:
        """The id a planned message will have (signing is deterministic): signed here once,
        for the messages others refer to."""
        found = self._ids.get(spec.index)
        if found is None:
            p = self.p
            msg = build_msg(p.seed, (p.payload_min, p.payload_max), self.creators, spec)
            found = self._ids[spec.index] = msg.msg_id
        return found

    def user_id(self, user: int) -> bytes:
        return _user_id(self.p.seed, user)

    def member_op(self, t_ms: int, kind: str, chat: int, target: int) -> int:
        actor = target if kind == tr.MEMBER_LEAVE else self.members[chat][0]
        node = self.origin(actor, t_ms, row_op=True)
        self._member(t_ms, node, kind, actor, chat, target, int(Role.PARTICIPANT))
        return node

    def _member(
        self,
        t: int,
        node: int,
        kind: str,
        actor: int,
        chat: int,
        target: int,
        role: int,
        *,
        granted: bool = False,
        hlc: int | None = None,
    ) -> int:
        """One member op (``hlc``: a twin's stamp); the plan's view of the chat follows it."""
        hlc = self.stamp(node, t) if hlc is None else hlc
        creator = self.members[chat][0]
        spec = OpSpec(0, t, node, kind, actor, chat, target, role, hlc, creator=creator)
        spec.granted = granted
        self.add(spec)
        self.keys.member_op(t, node, chat, target, hlc, kind == tr.MEMBER_ADD)
        if kind == tr.MEMBER_ADD:
            self.roster[chat].add(target)
            if role == int(Role.ADMIN):
                self.admins[chat].add(target)
        else:
            self.roster[chat].discard(target)
        return hlc

    # --- what scenarios ask of the plan ---

    def current_members(self, chat: int) -> list[int]:
        creator = self.members[chat][0]
        return sorted(self.roster[chat] - {creator})

    def outsider(self, chat: int) -> int:
        creator = self.members[chat][0]
        for _ in range(8):
            user = self.rng.randrange(self.p.users)
            if user != creator and user not in self.roster[chat]:
                return user
        return user  # a small chat of few users: a member, then (the oracle decides anyway)

    def across(self, node: int, t_ms: int) -> int:
        up = [n for n in range(self.p.nodes) if n != node and self.usable(n, t_ms)]
        group = self._partitioned(t_ms)
        if group is not None:
            other_side = [n for n in up if (n in group) != (node in group)]
            up = other_side or up
        return self.rng.choice(up) if up else node

    def steady(self, node: int, t_ms: int, steady_ms: int) -> bool:
        """Can ``node`` make ops from ``t_ms`` on, without a crash for ``steady_ms``?"""
        return (
            self.usable(node, t_ms)
            and self.usable(node, t_ms + steady_ms)
            and not any(t_ms <= a <= t_ms + steady_ms for a, _ in self.down[node])
        )

    def steady_node(self, t_ms: int, ahead_of: int, steady_ms: int) -> int | None:
        steady = [
            n for n in range(self.p.nodes) if n != ahead_of and self.steady(n, t_ms, steady_ms)
        ]
        floor = self.offset(ahead_of, t_ms)
        ahead = [n for n in steady if self.offset(n, t_ms) >= floor]
        pool = ahead or steady
        return self.rng.choice(pool) if pool else None

    def cut_at(self, t_ms: int) -> tuple[frozenset[int], int] | None:
        """The side of the partition on at ``t_ms`` and when the next heal ends it."""
        group = self._partitioned(t_ms)
        if group is None:
            return None
        heals = self._cut_list()[2]
        later = bisect.bisect_right(heals, t_ms)
        return frozenset(group), heals[later] if later < len(heals) else self.heal

    def _partition_starts(self) -> list[int]:
        return sorted(f.t_ms for f in self.faults if f.kind in (tr.PARTITION, tr.PARTITION_ONEWAY))

    def _cut_list(self) -> tuple[list[int], list[Fault], list[int]]:
        """The partitions and heals in time order (a stable sort: ties keep their planning
        order), their times, and the heals' times; made again when a fault was added since.
        Each member op asks for the cut it is made in: scanning every fault an op made the
        plan O(ops × faults), both of which grow with the nodes."""
        if self._cuts is None or self._cuts[0] != len(self.faults):
            kinds = (tr.PARTITION, tr.PARTITION_ONEWAY, tr.HEAL)
            cuts = sorted((f for f in self.faults if f.kind in kinds), key=lambda f: f.t_ms)
            heals = [f.t_ms for f in cuts if f.kind == tr.HEAL]
            self._cuts = (len(self.faults), [f.t_ms for f in cuts], cuts, heals)
        return self._cuts[1], self._cuts[2], self._cuts[3]

    def _partitioned(self, t_ms: int) -> set[int] | None:
        """The group of the latest partition on at ``t_ms`` (a heal ends every one)."""
        times, cuts, _ = self._cut_list()
        last = bisect.bisect_right(times, t_ms) - 1
        if last < 0 or cuts[last].kind == tr.HEAL:
            return None
        return set(cuts[last].args["group"])


# --- signing (worker processes) -----------------------------------------------------------

_KEYS: dict[tuple[int, int], SigningKey] = {}


def _key(seed: int, user: int) -> SigningKey:
    key = _KEYS.get((seed, user))
    if key is None:
        key = _KEYS[(seed, user)] = user_key(seed, user)
    return key


def _user_id(seed: int, user: int) -> bytes:
    return user_id_from_key(public_key(_key(seed, user)))


_PROOFS: dict[tuple[int, int, int], GroupProof] = {}


def _proof(seed: int, chat: int, creator: int) -> GroupProof:
    # Keyed by the creator too: another trace of the same seed (other users) has other creators.
    proof = _PROOFS.get((seed, chat, creator))
    if proof is None:
        proof = _PROOFS[(seed, chat, creator)] = chat_proof(seed, chat, creator)
    return proof


def build_msg(seed: int, payload_range: tuple[int, int], creators: list[int], s: OpSpec) -> MsgV1:
    """The signed message of a spec; content (NEW, REPLY, EDIT) stands in for ciphertext."""
    payload = s.payload
    if payload is None:
        lo, hi = payload_range
        draw = derive(seed, "payload", s.index)
        size = lo + int.from_bytes(draw[:4], "big") % (hi - lo + 1)
        payload = (draw * (size // 32 + 1))[:size]
    chat = _proof(seed, s.chat, creators[s.chat]).chat_id()
    kind = MessageKind(s.msg_kind)
    return MsgV1.create(
        _key(seed, s.author), chat, Hlc.unpack(s.hlc), payload, kind=kind, ref=s.ref
    )


def sign_chunk(
    seed: int, payload_range: tuple[int, int], creators: list[int], specs: list[OpSpec]
) -> list[dict[str, Any]]:
    """Build and sign the ops of one chunk of origin nodes, in time order."""
    out = []
    for s in specs:
        hlc = Hlc.unpack(s.hlc)
        key = _key(seed, s.author)
        op: Any
        if s.kind == tr.MSG:
            op = build_msg(seed, payload_range, creators, s)
        elif s.kind == tr.IDENTITY:
            box = derive(seed, "box-key", s.author, s.box)
            op = make_identity(key, box, hlc)
        else:
            action = {
                tr.MEMBER_ADD: MembershipAction.ADD,
                tr.MEMBER_REMOVE: MembershipAction.REMOVE,
                tr.MEMBER_LEAVE: MembershipAction.LEAVE,
            }[s.kind]
            target = _user_id(seed, s.target)
            proof = _proof(seed, s.chat, creators[s.chat])
            grant = None
            if s.granted:
                grant = grant_admin(_key(seed, creators[s.chat]), proof, _user_id(seed, s.author))
            op = MembershipOp.create(
                key, proof.chat_id(), target, action, hlc, Role(s.role), proof=proof, grant=grant
            )
        out.append({"index": s.index, "t_ms": s.t_ms, "node": s.node, **tr.op_columns(op)})
    return out


def _chunks(specs: list[OpSpec], nodes: int, parts: int) -> list[list[OpSpec]]:
    by_group: list[list[OpSpec]] = [[] for _ in range(parts)]
    for s in specs:
        by_group[s.node % parts].append(s)
    return [g for g in by_group if g]


def _sign_all(p: GenParams, specs: list[OpSpec], creators: list[int]) -> list[dict[str, Any]]:
    workers = p.workers or os.cpu_count() or 1
    payloads = (p.payload_min, p.payload_max)
    if workers <= 1 or len(specs) < 2_000:
        return sign_chunk(p.seed, payloads, creators, specs)
    chunks = _chunks(specs, p.nodes, min(p.nodes, workers * 4))
    rows: list[dict[str, Any]] = []
    n = len(chunks)
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("fork")) as pool:
        for part in pool.map(sign_chunk, [p.seed] * n, [payloads] * n, [creators] * n, chunks):
            rows.extend(part)
    return rows


# --- writing ------------------------------------------------------------------------------


@dataclass
class GenResult:
    path: Path
    header: tr.TraceHeader
    ops: int
    faults: int
    poisoned: list[int]


def generate(p: GenParams, out: str | Path) -> GenResult:
    if p.nodes < 1 or p.users < 1 or p.chats < 1 or p.ops < 0:
        raise ValueError("nodes, users and chats must be >= 1 and ops >= 0")
    out = Path(out)
    planner = _Planner(p)
    planner.plan_faults()
    specs = planner.plan_ops()
    rows = _sign_all(p, specs, [members[0] for members in planner.members])
    header = tr.TraceHeader(
        nodes=p.nodes,
        seed=p.seed,
        start_ms=planner.start,
        heal_ms=planner.heal,
        end_ms=planner.end,
        retention_ms=planner.retention_ms(),
        gc_grain_ms=planner.grain_ms(),
        max_offset_ms=planner.max_offset,
        anti_entropy_ms=p.anti_entropy_ms,
        flush_ms=p.flush_ms,
        users=p.users,
        chats=p.chats,
        ops=len(specs),
        command=p.command(out),
        params={
            "faults": sorted(p.faults),
            "duration_s": p.duration_s,
            "tie_rate": p.tie_rate,
            "poisoned": sorted(planner.poisoned),
            **({"plant": p.plant} if p.plant else {}),  # a generator bug (sim/bugs.py)
        },
    )
    if p.scope_shards:
        header.params.update(scope_shards=p.scope_shards, replication=p.replication)
        planner.faults += _scope_faults(p, planner, specs)
    events = _merge_events(planner.faults, rows)
    with tr.TraceWriter(out, header) as writer:
        for t, _, item in events:
            if isinstance(item, Fault):
                writer.fault(t, item.kind, item.node, **item.args)
            else:
                node = item.pop("node")
                for k in ("index", "t_ms"):
                    item.pop(k)
                writer.op_row(t, node, item)
    return GenResult(out, header, len(specs), len(planner.faults), sorted(planner.poisoned))


MAX_SCOPE_ROUNDS = 200


def _scope_rounds(p: GenParams) -> int:
    """Scoped: a node syncs its shards and user shards in turn (one a round,
    ``sim.scope_book``), so the quiescence gets about one turn of a typical scope on top:
    the chats' shards (its members' and its pins), and the user shards of its served users,
    its pins, the users its member ops name and the users whose identities it put."""
    if not p.scope_shards:
        return 0
    members = (2 + max(2, min(p.users, 8))) / 2
    chats = p.chats * members + min(p.chats, p.scope_shards) * p.replication
    users = p.users + min(p.users, p.scope_shards) * p.replication + p.chats * members
    users += p.ops * OP_WEIGHTS[tr.IDENTITY]
    shards = min(chats / p.nodes, p.scope_shards) + min(users / p.nodes, p.scope_shards)
    return min(MAX_SCOPE_ROUNDS, math.ceil(shards))


def _scope_faults(p: GenParams, planner: _Planner, specs: list[OpSpec]) -> list[Fault]:
    """The nodes' scopes over time (``sim.scopes``) as ``scope`` events."""
    creators = [members[0] for members in planner.members]
    shards = [
        scope_shard_of(_proof(p.seed, c, creators[c]).chat_id(), p.scope_shards)
        for c in range(p.chats)
    ]
    events = [
        ChatEvent(s.t_ms, s.node, s.kind, s.chat, shards[s.chat], s.target)
        for s in specs
        if s.chat >= 0 and (s.kind == tr.MSG or s.kind in tr.MEMBER_KINDS)
    ]
    events += [  # an identity's origin indexes its user
        ChatEvent(s.t_ms, s.node, s.kind, -1, -1, s.author) for s in specs if s.kind == tr.IDENTITY
    ]
    params = ScopeParams(p.scope_shards, p.replication)
    users = [user_shard_of(_user_id(p.seed, u), p.scope_shards) for u in range(p.users)]
    return [
        Fault(t, tr.SCOPE, node, {"group": group})
        for t, node, group in plan_scopes(events, set(shards), p.nodes, params, users)
    ]


def _merge_events(
    faults: Iterable[Fault], rows: Iterable[dict[str, Any]]
) -> list[tuple[int, tuple[int, int], Fault | dict[str, Any]]]:
    """Faults before ops at the same millisecond; ops in plan order."""
    events: list[tuple[int, tuple[int, int], Fault | dict[str, Any]]] = []
    for i, f in enumerate(faults):
        events.append((f.t_ms, (0, i), f))
    for r in rows:
        events.append((r["t_ms"], (1, r["index"]), r))
    events.sort(key=lambda e: (e[0], e[1]))
    return events
