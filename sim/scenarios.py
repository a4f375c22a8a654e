"""The generator's authorization scenarios: who posts, and when, around their member ops.

A message is stored once its sender has an add op stamped at or before it, and shown
while the sender is active at its stamp (``store.access``). The plain workload posts
as any of a chat's first members, removed or not; these scenarios aim at the rule's
edges on purpose, each a few ops spread over the following seconds:

* ``stranger``: a post signed by a key no chat ever adds — never stored anywhere;
* ``race``: a member is removed on one node while posting on another moments later
  (on the other side of a partition when one is on), then posts again as a
  removed member; each partition episode gets one race;
* ``readd``: add, post, remove, post (in the gap), add again, post;
* ``overtake``: an add made on one node, and the added user's post on another node
  a few milliseconds later — before gossip can bring the add there, so it waits in
  that node's waiting room. The posting node is one that does not crash for a
  while: a message waiting on the only node that holds it dies with it, and the
  oracle has no model of that.

Steps are planned through ``Plan``, the generator's planner (``sim.generate``), which
stamps each op on its node's clock when its time comes. Every choice is a draw from
the planner's seeded generator, in time order: same seed, same trace.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial
from typing import Protocol

from store import trace as tr

WEIGHTS = {"stranger": 0.01, "race": 0.012, "readd": 0.008, "overtake": 0.012}
STRANGERS = 3  # keys past the trace's users: signed by nobody any chat adds
OVERTAKE_MS = (1, 40)  # the post follows the add by this much: less than any gossip delay
STEADY_MS = 90_000  # the overtaking post's node does not crash for this long


class Plan(Protocol):
    rng: random.Random
    strangers: list[int]

    def later(self, t_ms: int, step: Callable[[int], object]) -> None:
        """Run ``step(t)`` when the plan reaches ``t_ms`` (dropped past the workload)."""

    def post(self, t_ms: int, author: int, chat: int, node: int | None = None) -> int | None:
        """A message (on ``node`` if it can make one then); the node it was made on."""

    def member_op(self, t_ms: int, kind: str, chat: int, target: int) -> int:
        """An add or remove by the chat's creator, or a leave; the node it was made on."""

    def current_members(self, chat: int) -> list[int]:
        """The chat's members as the plan so far left them, its creator excluded."""

    def outsider(self, chat: int) -> int:
        """A user (not a stranger) who is no member of the chat now."""

    def across(self, node: int, t_ms: int) -> int:
        """A node that can make ops at ``t_ms`` on the other side of a partition from
        ``node`` if one is on, else any other such node (``node`` if there is none)."""

    def steady_node(self, t_ms: int, ahead_of: int, steady_ms: int) -> int | None:
        """A node other than ``ahead_of`` that can make ops from ``t_ms`` and does not crash
        for ``steady_ms``, its clock not behind ``ahead_of``'s if there is such a one."""


class Scenarios:
    def __init__(self, plan: Plan, chats: int) -> None:
        self.plan = plan
        self.chats = chats

    def start(self, kind: str, t_ms: int) -> None:
        {
            "stranger": self.stranger,
            "race": self.race,
            "readd": self.readd,
            "overtake": self.overtake,
        }[kind](t_ms)

    def _chat(self) -> int:
        return self.plan.rng.randrange(self.chats)

    def stranger(self, t_ms: int) -> None:
        plan = self.plan
        plan.post(t_ms, plan.rng.choice(plan.strangers), self._chat())

    def race(self, t_ms: int) -> None:
        plan, chat = self.plan, self._chat()
        members = plan.current_members(chat)
        if members:
            user, t_remove = plan.rng.choice(members), t_ms
        else:  # a member first
            user = plan.outsider(chat)
            plan.member_op(t_ms, tr.MEMBER_ADD, chat, user)
            t_remove = t_ms + plan.rng.randint(5_000, 15_000)
        plan.later(t_remove, lambda t: self._remove_while_posting(t, chat, user))

    def _remove_while_posting(self, t_ms: int, chat: int, user: int) -> None:
        plan = self.plan
        remover = plan.member_op(t_ms, tr.MEMBER_REMOVE, chat, user)
        poster = plan.across(remover, t_ms)
        plan.later(t_ms + plan.rng.randrange(1_500), lambda t: plan.post(t, user, chat, poster))
        # ... and once the removal has spread: a removed member's post
        plan.later(t_ms + plan.rng.randint(20_000, 40_000), lambda t: plan.post(t, user, chat))

    def readd(self, t_ms: int) -> None:
        plan, chat = self.plan, self._chat()
        user = plan.outsider(chat)
        steps = (tr.MEMBER_ADD, tr.MSG, tr.MEMBER_REMOVE, tr.MSG, tr.MEMBER_ADD, tr.MSG)
        t = t_ms
        for kind in steps:
            plan.later(t, partial(self._act, kind, chat, user))
            t += plan.rng.randint(4_000, 12_000)

    def _act(self, kind: str, chat: int, user: int, t_ms: int) -> None:
        if kind == tr.MSG:
            self.plan.post(t_ms, user, chat)
        else:
            self.plan.member_op(t_ms, kind, chat, user)

    def overtake(self, t_ms: int) -> None:
        plan, chat = self.plan, self._chat()
        user = plan.outsider(chat)
        adder = plan.member_op(t_ms, tr.MEMBER_ADD, chat, user)
        poster = plan.steady_node(t_ms, adder, STEADY_MS)
        if poster is not None:
            t_post = t_ms + plan.rng.randint(*OVERTAKE_MS)
            plan.later(t_post, lambda t: plan.post(t, user, chat, poster))
