"""Joining a shard no connected peer holds: which known holder to dial, and when. Pure.

When a node's scope grows (SYNC.md, "Joining") its sessions with the connected peers fill the
new shards, if one of them holds them. If none does, the node would wait until rotation or
exchange happened to connect it to a holder. ``JoinDials`` keeps each new shard (a chat
shard or a user shard: a ``Target``) until it is caught up, and says whom to dial for it:

* **A connected holder first.** If a holder (the ranking the 421 answer uses: the chats'
  members' home nodes, then the R rule over the peers known, then over those reached;
  ``node/scope_answer.py``) is connected, nothing is dialled: the sessions started at the
  join fill the shard. The join ends (``CONNECTED_HOLDER``).
* **Else the best known holder not tried yet** is dialled; a failed dial moves to the next
  (at most ``MAX_TRIES`` per join: ``GAVE_UP``); none known ends the join (``NO_HOLDER``:
  logged and counted, nothing dialled). Once dialled, the holder is an ordinary connected
  peer: the node's session machinery reconciles with it (the rotation sends it at once);
  the join ends when a session with it that started after the dial converged
  (``CAUGHT_UP``), or after ``CATCH_UP_MS`` (``TIMED_OUT``). If it disconnects before that,
  the next holder is tried.
* **Bounded.** At most ``MAX_JOINS`` joins are kept (a flood of joins past it is dropped,
  ``DROPPED``), at most ``DIALS_AT_ONCE`` dials run at once, and dials take tokens from a
  bucket of ``DIAL_BURST`` refilled one per ``DIAL_EVERY_MS``: over any span of ``t`` ms at
  most ``DIAL_BURST + t / DIAL_EVERY_MS`` join dials, whatever the member ops do. Two joins
  waiting on the same holder share its dial.

Time is an argument (``now_ms``); the caller gives the holders and the connected peers.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

MAX_JOINS = 64  # joins kept at once (a network has 2 x num_shards targets at most)
MAX_TRIES = 3  # holders dialled for one join before it gives up
DIALS_AT_ONCE = 2
DIAL_BURST = 4
DIAL_EVERY_MS = 5_000  # one more join dial per 5 s once the burst is spent
CATCH_UP_MS = 600_000  # a dialled holder's sessions get this long to catch the shard up

CONNECTED_HOLDER = "connected_holder"  # a holder is connected: its sessions fill the shard
NO_HOLDER = "no_holder"  # no holder known (with an address): nothing dialled
GAVE_UP = "gave_up"  # every holder tried (or MAX_TRIES) failed
CAUGHT_UP = "caught_up"  # a session with the dialled holder converged
TIMED_OUT = "timed_out"  # connected, not caught up within CATCH_UP_MS
DROPPED = "dropped"  # over MAX_JOINS


@dataclass(frozen=True, order=True)
class Target:
    """A shard joined: a chat shard, or (``user``) a user shard."""

    shard: int
    user: bool = False


@dataclass(frozen=True)
class Dial:
    """Dial ``peer`` (a holder of ``target``); report with ``JoinDials.dialled``."""

    target: Target
    peer: str


@dataclass(frozen=True)
class Ended:
    """A join over, and why (one of the results above)."""

    target: Target
    result: str
    peer: str | None = None


@dataclass
class _Join:
    tried: list[str] = field(default_factory=list)  # holders whose dial failed, or who left
    peer: str | None = None  # the holder dialled for it
    connected_ms: int | None = None  # when that dial connected (None: in flight)


class JoinDials:
    """The joins in progress and the dials they need (see the module doc)."""

    def __init__(
        self,
        *,
        max_joins: int = MAX_JOINS,
        max_tries: int = MAX_TRIES,
        dials_at_once: int = DIALS_AT_ONCE,
        burst: int = DIAL_BURST,
        every_ms: int = DIAL_EVERY_MS,
        catch_up_ms: int = CATCH_UP_MS,
    ) -> None:
        self.max_joins, self.max_tries = max_joins, max_tries
        self.dials_at_once = dials_at_once
        self.burst, self.every_ms = burst, every_ms
        self.catch_up_ms = catch_up_ms
        self._joins: dict[Target, _Join] = {}
        self._dialling: set[str] = set()  # peers with a dial in flight
        self._tokens = float(burst)
        self._refilled_ms: int | None = None

    # --- what the node tells it ---

    def add(self, targets: Iterable[Target]) -> list[Ended]:
        """New shards in the scope; those past ``max_joins`` are dropped (returned)."""
        dropped = []
        for target in sorted(set(targets)):
            if target in self._joins:
                continue
            if len(self._joins) >= self.max_joins:
                dropped.append(Ended(target, DROPPED))
                continue
            self._joins[target] = _Join()
        return dropped

    def dialled(self, peer: str, ok: bool, now_ms: int) -> None:
        """The dial of ``peer`` connected (``ok``) or failed: every join waiting on it learns."""
        self._dialling.discard(peer)
        for join in self._joins.values():
            if join.peer != peer or join.connected_ms is not None:
                continue
            if ok:
                join.connected_ms = now_ms
            else:
                join.tried.append(peer)
                join.peer = None

    def synced(self, peer: str, converged: bool, started_ms: int) -> list[Ended]:
        """A session with ``peer`` ended: a converged one that started after the dial
        catches up every join that dialled it."""
        if not converged:
            return []
        done = [
            t
            for t, j in self._joins.items()
            if j.peer == peer and j.connected_ms is not None and started_ms >= j.connected_ms
        ]
        return [self._end(t, CAUGHT_UP) for t in done]

    # --- what it tells the node ---

    def targets(self) -> list[Target]:
        """The joins in progress (their holders are asked for at the next ``step``)."""
        return sorted(self._joins)

    def waiting_on(self) -> set[str]:
        """The holders joins dialled and still need (not to be closed as surplus)."""
        return {j.peer for j in self._joins.values() if j.peer is not None}

    def step(
        self, now_ms: int, holders: Mapping[Target, Sequence[str]], connected: Collection[str]
    ) -> tuple[list[Dial], list[Ended]]:
        """The dials to start now and the joins that ended. ``holders``: each target's
        holders best first (dialable ones: known addresses, or connected); ``connected``:
        the peers connected now."""
        self._refill(now_ms)
        dials: list[Dial] = []
        ended: list[Ended] = []
        for target in sorted(self._joins):
            join = self._joins[target]
            if join.peer is not None:
                if join.connected_ms is None:
                    continue  # its dial is in flight
                if join.peer in connected:
                    if now_ms - join.connected_ms >= self.catch_up_ms:
                        ended.append(self._end(target, TIMED_OUT))
                    continue  # its sessions are catching it up
                join.tried.append(join.peer)  # left before it was caught up: the next one
                join.peer, join.connected_ms = None, None
            outcome = self._choose(target, join, holders.get(target, ()), connected)
            if isinstance(outcome, Ended):
                ended.append(outcome)
            elif isinstance(outcome, Dial):
                dials.append(outcome)
        return dials, ended

    def _choose(
        self, target: Target, join: _Join, ranked: Sequence[str], connected: Collection[str]
    ) -> Dial | Ended | None:
        """For a join with no holder in hand: a connected holder (done), a dial, an end,
        or None (wait: no token, too many dials at once)."""
        candidates = [h for h in dict.fromkeys(ranked) if h not in join.tried]
        if (present := next((h for h in candidates if h in connected), None)) is not None:
            return self._end(target, CONNECTED_HOLDER, present)
        if not ranked:
            return self._end(target, NO_HOLDER)
        if not candidates or len(join.tried) >= self.max_tries:
            return self._end(target, GAVE_UP)
        peer = candidates[0]
        if peer in self._dialling:  # another join dials it: share that dial
            join.peer = peer
            return None
        if len(self._dialling) >= self.dials_at_once or self._tokens < 1:
            return None  # rate-limited: at the next step
        self._tokens -= 1
        self._dialling.add(peer)
        join.peer = peer
        return Dial(target, peer)

    def _end(self, target: Target, result: str, peer: str | None = None) -> Ended:
        join = self._joins.pop(target)
        return Ended(target, result, peer or join.peer)

    def _refill(self, now_ms: int) -> None:
        if self._refilled_ms is not None and now_ms > self._refilled_ms:
            gained = (now_ms - self._refilled_ms) / self.every_ms
            self._tokens = min(float(self.burst), self._tokens + gained)
        if self._refilled_ms is None or now_ms > self._refilled_ms:
            self._refilled_ms = now_ms


def new_targets(
    old_shards: Iterable[int],
    new_shards: Iterable[int],
    old_user_shards: Iterable[int],
    new_user_shards: Iterable[int],
) -> list[Target]:
    """The shards and user shards a widening added."""
    shards = set(new_shards) - set(old_shards)
    users = set(new_user_shards) - set(old_user_shards)
    return sorted([*(Target(s) for s in shards), *(Target(s, user=True) for s in users)])
