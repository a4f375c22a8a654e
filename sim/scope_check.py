"""The check of a scoped trace (issue 33): per chat, among the nodes that hold it.

The oracle's expected state (``sim.shards.Expected``) covers every chat of the task; a
node is compared with the part of it that lies in its final scope (the trace's last scope
event for it, as the oracle read it): the messages, deletes, member ops and rows of the
chats of its shards, the member ops naming users of its user shards (its index) and those
users' identities. On top of the usual counters:

* ``out_of_scope_held``: messages, deletes and member ops a node holds of a chat outside its
  scope, and index entries and identities of users outside its user shards;
* ``chats_diverged``: chats on which some honest live holder differs from the oracle
  (a record lost or extra, or another view);
* ``under_replicated``: chats held in full (converged) by fewer than R honest live nodes.

A node's expected roots of the scoped domains (``WANT_DOMAINS``) are summed from the
oracle's ids in its scope (XOR and count), so ``sim.runner`` can say whether every node
converged on its scope.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sim.replica import SimReplica
from sim.scopes import split_group
from sim.shards import Expected
from sync.frames import Domain

Compare = Callable[[SimReplica, Expected, set[bytes]], dict[str, int]]
Shard = Callable[[bytes], int]
WANT_DOMAINS = (Domain.MESSAGES, Domain.DELETES, Domain.MEMBERS, Domain.INDEX, Domain.IDENTITY)


@dataclass
class ScopeCheck:
    per_node: list[dict[str, Any]] = field(default_factory=list)
    chats: int = 0
    chats_diverged: int = 0
    under_replicated: int = 0
    holders: list[int] = field(default_factory=list)  # per chat: nodes holding it in full

    def summary(self) -> dict[str, int]:
        return {
            "chats": self.chats,
            "chats_diverged": self.chats_diverged,
            "under_replicated": self.under_replicated,
            "holders_min": min(self.holders, default=0),
            "holders_sum": sum(self.holders),
        }


class _ByShard:
    """The oracle's ids of one kind, per scope shard."""

    def __init__(self, ids: Iterable[bytes], chat_of: dict[bytes, bytes], shard: Any) -> None:
        self.ids: dict[int, set[bytes]] = {}
        for i in ids:
            self.ids.setdefault(shard(chat_of[i]), set()).add(i)

    def within(self, shards: Iterable[int]) -> set[bytes]:
        out: set[bytes] = set()
        for s in shards:
            out |= self.ids.get(s, set())
        return out


def check_scopes(
    reps: Sequence[SimReplica],
    exp: Expected,
    shard: Shard,
    user_shard: Shard,
    live: Sequence[bool],
    compare: Compare,
) -> ScopeCheck:
    chat_of = exp.chat_of
    messages = _ByShard(exp.messages, chat_of, shard)
    visible = _ByShard(exp.visible, chat_of, shard)
    deletes = _ByShard(exp.deletes, chat_of, shard)
    erased = _ByShard(exp.erased, chat_of, shard)
    member_ops = _ByShard(exp.member_ops, chat_of, shard)
    index = _ByShard(exp.member_ops, exp.user_of, user_shard)
    views: dict[int, dict[bytes, bytes]] = {}
    for chat, digest in exp.views.items():
        views.setdefault(shard(chat), {})[chat] = digest
    diverged: set[bytes] = set()
    holders: dict[bytes, int] = dict.fromkeys(exp.views, 0)
    out = ScopeCheck()
    for node, rep in enumerate(reps):
        scope, users = split_group(exp.final_scopes.get(node, ()), exp.scope_shards)
        mine = Expected(
            messages=messages.within(scope),
            visible=visible.within(scope),
            member_ops=member_ops.within(scope),
            members={k: v for k, v in exp.members.items() if shard(k[0]) in scope},
            identities={u: i for u, i in exp.identities.items() if user_shard(u) in users},
            deletes=deletes.within(scope),
            erased=erased.within(scope),
            views={c: d for s in scope for c, d in views.get(s, {}).items()},
        )
        wrong_views: set[bytes] = set()
        counts: dict[str, Any] = compare(rep, mine, wrong_views)
        held = {i: m.chat_id for i, m in rep.messages.items()}
        held.update((i, d.chat_id) for i, d in rep.deletes.items())
        indexed, want_index = set(rep.index), index.within(users)
        counts["lost"] += len(want_index - indexed)
        counts["extra"] += len(indexed - want_index)
        counts["out_of_scope_held"] = (
            sum(1 for c in held.values() if shard(c) not in scope)
            + sum(1 for op in rep.member_ops.values() if shard(op.chat_id) not in scope)
            + sum(1 for op in rep.index.values() if user_shard(op.user_id) not in users)
            + sum(1 for u in rep.identities if user_shard(u) not in users)
        )
        wanted = (
            mine.messages,
            mine.deletes,
            mine.member_ops,
            want_index,
            mine.identities.values(),
        )
        counts["want_roots"] = [_root(ids) for ids in wanted]  # WANT_DOMAINS' order
        out.per_node.append(counts)
        if not live[node]:
            continue
        # the chats this holder differs on: a record either way, or the view
        expected = mine.messages | mine.deletes
        differs = {held[i] for i in held.keys() - expected if shard(held[i]) in scope}
        differs |= {chat_of[i] for i in expected - held.keys()}
        differs |= wrong_views
        diverged |= differs
        for chat in mine.views:
            holders[chat] += chat not in differs
    out.chats = len(holders)
    out.chats_diverged = len(diverged)
    out.holders = sorted(holders.values())
    out.under_replicated = sum(1 for n in holders.values() if n < exp.replication)
    return out


def _root(ids: Iterable[bytes]) -> list[int]:
    """[xor, count] of ids, as a tree's root reads (``MerkleTree``: XOR of the ids' values)."""
    xor = count = 0
    for i in ids:
        xor ^= int.from_bytes(i, "big")
        count += 1
    return [xor, count]
