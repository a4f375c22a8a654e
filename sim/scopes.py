"""Partial replication in a generated trace: which shards each node holds, and when.

Issue 33 (SYNC.md, "Scopes"): a node holds the chats whose members include a user it serves,
plus what its operator pins. The generator's model of that, written as ``scope`` events into
the trace (``group`` = the node's shards and user shards from then on: ``split_group``),
which the replay applies with ``set_scope`` and the oracle reads as the nodes' final
scopes:

* a user's **home node** is node ``user % nodes`` (the node the generator makes its ops on);
* **pins**: every shard is pinned on its ``R`` nearest nodes by rendezvous hashing with
  bounded loads (``pinned``: the holders rule), so each chat has ``R`` holders whatever its
  members do, and no node more than the load cap of shards;
* a node holds the **user shards** of the users it serves and its pins among users' shards,
  for good. Those of the users named by member ops and identities it makes are not in the
  trace: it holds them until a session hands them over, then ``GRACE_MS`` (its member
  index, docs/design/member-scopes.md), which depends on the sessions, so the replay keeps
  them with the node's own rule (``sim.handover``, ``sync.serving.ServedScope``);
* a node **grows** by a chat's shard ``LEARN_MS`` after a member op adds a user it serves
  (the op reaches it on its user shard's topic), and **shrinks** ``GRACE_MS`` after the
  last such user left or was removed (the grace period before a shard's rows are dropped);
* a node that makes a message or member op of a chat holds the chat's shard from then on (a
  client asked it to: it joins, as SYNC.md's joining step would — a node refuses a client's
  op of a chat it does not hold), and keeps it: were it to drop the shard before a peer took
  the op, the op would be gone, which the oracle does not model.

Pure and deterministic: a function of the plan's ops and the seed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache

import blake3

from store import trace as tr

LEARN_MS = 2_000  # an add reaches the served user's home node (the generator's gossip model)
GRACE_MS = 30_000  # a shard no reason holds any more is dropped this much later
DEFAULT_REPLICATION = 3


@dataclass(frozen=True)
class ScopeParams:
    """A trace's scope settings (``TraceHeader.params``); ``shards`` 0: every node full."""

    shards: int = 0
    replication: int = DEFAULT_REPLICATION

    @classmethod
    def of(cls, params: dict[str, object]) -> ScopeParams:
        shards, replication = params.get("scope_shards", 0), params.get("replication", 3)
        assert isinstance(shards, int) and isinstance(replication, int)
        return cls(shards, replication)

    @property
    def scoped(self) -> bool:
        return self.shards > 0


def split_group(group: Iterable[int], num_shards: int) -> tuple[frozenset[int], frozenset[int]]:
    """(chat shards, user shards) of a scope event's ``group``: its chat shards, and ``S + u``
    for each user shard ``u`` (one list column in the trace for both sets)."""
    values = list(group)
    shards = frozenset(v for v in values if v < num_shards)
    return shards, frozenset(v - num_shards for v in values if v >= num_shards)


def node_id(node: int) -> bytes:
    """A simulated node's id in the rendezvous hash."""
    return node.to_bytes(4, "big")


# The R rule (``sync.scope.assign_shards``): shard by shard in order, the R nodes of lowest
# BLAKE3(domain || S || shard || node id)[:8], ties by id, among those below the load cap
# (the mean share k·S/N rounded up, plus a quarter of it; the nearest others where fewer than R
# are below it). Restated here, so the simulator's scopes do not rest on the code they check.
HOLDERS_DOMAIN = b"chatsync/holders/v1\x00"


def rendezvous(shard: int, nodes: int, replication: int, num_shards: int) -> list[int]:
    """The shard's ``replication`` pinned nodes (``pinned``), ascending."""
    return pinned(nodes, replication, num_shards)[shard]


@cache
def pinned(nodes: int, replication: int, num_shards: int) -> tuple[list[int], ...]:
    """Every shard's pinned nodes by the R rule (rendezvous hashing with bounded loads)."""
    k = min(replication, nodes)
    share = k * num_shards
    cap = -(-share // nodes) + share // (4 * nodes) if k > 0 else 0
    ids = [node_id(n) for n in range(nodes)]
    load = [0] * nodes
    out = []
    for shard in range(num_shards):
        prefix = HOLDERS_DOMAIN + num_shards.to_bytes(2, "big") + shard.to_bytes(2, "big")
        ranked = sorted(
            range(nodes), key=lambda n: (blake3.blake3(prefix + ids[n]).digest(8), ids[n])
        )
        chosen = [n for n in ranked if load[n] < cap][:k]
        if len(chosen) < k:  # too few below the cap: the nearest others, R holders first
            chosen += [n for n in ranked if n not in chosen][: k - len(chosen)]
        for n in chosen:
            load[n] += 1
        out.append(sorted(chosen))
    return tuple(out)


def home_node(user: int, nodes: int) -> int:
    return user % nodes


@dataclass(frozen=True)
class ChatEvent:
    """What the scope model reads of one planned op."""

    t_ms: int
    node: int  # the op's origin
    kind: str  # a member kind, tr.MSG or tr.IDENTITY
    chat: int  # -1 for an identity
    shard: int  # the chat's shard
    target: int = -1  # a member op's user, an identity's


def plan_scopes(
    events: Iterable[ChatEvent],
    used_shards: Iterable[int],
    nodes: int,
    p: ScopeParams,
    user_shards: Sequence[int] = (),
) -> list[tuple[int, int, list[int]]]:
    """``(t_ms, node, group)`` scope events (``split_group``: a user shard ``u`` is ``S + u``
    throughout): each node's scope at the start (its pins), then every time it changes.
    ``user_shards[u]``: user ``u``'s user shard. A node holds, for good, its served users'
    user shards and its pins among the users' shards (the R rule over user shards too). The
    user shards it holds for the writes it makes are not here: they end when a session hands
    them over, which the replay keeps (``sim.handover``)."""
    pins = _pins(used_shards, nodes, p)
    for n, shards in enumerate(_pins(set(user_shards), nodes, p)):
        pins[n].update(p.shards + u for u in shards)
    for user, shard in enumerate(user_shards):
        pins[home_node(user, nodes)].add(p.shards + shard)
    # reasons to hold a shard, as (node, shard) -> +1 at their start and -1 at their end
    changes: list[tuple[int, int, int, int]] = []  # (t, node, shard, +1/-1)
    member: set[tuple[int, int]] = set()  # (user, chat): added, as the plan goes
    start_ms = None
    for e in sorted(events, key=lambda e: e.t_ms):
        start_ms = e.t_ms if start_ms is None else start_ms
        if e.kind == tr.IDENTITY:  # its user shard is held while unhanded: the replay's
            continue
        changes.append((e.t_ms, e.node, e.shard, +1))  # its origin, for good: the docstring
        if e.kind == tr.MSG:
            continue
        key = (e.target, e.chat)
        home = home_node(e.target, nodes)
        if e.kind == tr.MEMBER_ADD and key not in member:
            member.add(key)
            changes.append((e.t_ms + (0 if home == e.node else LEARN_MS), home, e.shard, +1))
        elif e.kind != tr.MEMBER_ADD and key in member:
            member.discard(key)
            changes.append((e.t_ms + GRACE_MS, home, e.shard, -1))
    t0 = 0 if start_ms is None else start_ms
    out = [(t0, n, sorted(pins[n])) for n in range(nodes)]
    out += _timeline(changes, pins)
    return out


def _pins(shards: Iterable[int], nodes: int, p: ScopeParams) -> list[set[int]]:
    """Each node's pinned shards: the ``R`` nearest nodes of every shard (``rendezvous``)."""
    pins: list[set[int]] = [set() for _ in range(nodes)]
    for shard in shards:
        for n in rendezvous(shard, nodes, p.replication, p.shards):
            pins[n].add(shard)
    return pins


def _timeline(
    changes: list[tuple[int, int, int, int]], pins: Sequence[set[int]]
) -> list[tuple[int, int, list[int]]]:
    """The scope events the reasons add up to: one per node and time its shards change."""
    changes.sort(key=lambda c: (c[1], c[0], -c[3]))  # per node, in time, starts first
    out: list[tuple[int, int, list[int]]] = []
    counts: dict[int, int] = {}
    node = -1
    i = 0
    while i < len(changes):
        t, n = changes[i][0], changes[i][1]
        if n != node:
            node, counts = n, {}
        before = {s for s, c in counts.items() if c > 0}
        while i < len(changes) and changes[i][0] == t and changes[i][1] == n:
            _, _, shard, delta = changes[i]
            counts[shard] = counts.get(shard, 0) + delta
            i += 1
        after = {s for s, c in counts.items() if c > 0}
        if (before | pins[n]) != (after | pins[n]):
            out.append((t, n, sorted(after | pins[n])))
    return out
