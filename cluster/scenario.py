"""The scripted scenario of ``chatsync cluster --scenario`` (the README's main job).

Messages are posted on different nodes; one node is cut off while messages go
on on both sides of the cut; the cut is healed; convergence is shown as equal
Merkle roots per domain, with timings. Results are printed and saved as JSON.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from cluster.local import Cluster
from store import Hlc, HlcClock, MsgV1, Role
from store.authz import new_group
from store.ops import MembershipAction, MembershipOp, Op, make_identity
from store.signing import key_from_seed, public_key, user_id_from_key

# The scenario's group chat: created by the first author; its id commits to that key.
GROUP_PROOF = new_group(key_from_seed(bytes([0x40]) * 32), b"scenario-group-1")
GROUP = GROUP_PROOF.chat_id()


def wall_ms() -> int:
    return int(time.time() * 1000)


class Authors:
    """A few users with deterministic keys, each with its own HLC, all members of GROUP.

    ``joins`` are GROUP's add ops for every author, signed by author 0 (who created the
    group: an admin, the others participants) and stamped when the ``Authors`` were made,
    before any of their messages: a node stores a message only once it knows an add op of
    its sender stamped at or before it, so post ``joins`` before (or with) the messages.
    """

    def __init__(self, count: int) -> None:
        self.keys = [key_from_seed(bytes([0x40 + i]) * 32) for i in range(count)]
        self.ids = [user_id_from_key(public_key(k)) for k in self.keys]
        self.clocks = [HlcClock() for _ in self.keys]
        self.joins: list[Op] = [
            MembershipOp.create(
                self.keys[0],
                GROUP,
                user,
                MembershipAction.ADD,
                self.stamp(0),
                Role.ADMIN if i == 0 else Role.PARTICIPANT,
                proof=GROUP_PROOF,
            )
            for i, user in enumerate(self.ids)
        ]
        for clock in self.clocks[1:]:  # every later stamp, of any author, after the joins'
            clock.update(self.clocks[0].last, wall_ms())

    def stamp(self, i: int) -> Hlc:
        return self.clocks[i].now(wall_ms())

    def messages(self, count: int, tag: str, start: int = 0) -> list[Op]:
        return [
            MsgV1.create(
                self.keys[(start + n) % len(self.keys)],
                GROUP,
                self.stamp((start + n) % len(self.keys)),
                f"{tag} #{n}".encode(),
            )
            for n in range(count)
        ]


def run_scenario(nodes: int, base_dir: Path, *, per_phase: int, out: Path) -> dict[str, Any]:
    console = Console()
    authors = Authors(4)
    timings: dict[str, float] = {}
    with Cluster(nodes, base_dir, sync_interval_s=2.0) as cluster:
        t0 = time.monotonic()
        cluster.start()
        timings["start_s"] = time.monotonic() - t0
        console.print(
            f"[bold]{nodes} nodes up[/] in {timings['start_s']:.1f} s: "
            + ", ".join(n.peer_id[-6:] for n in cluster.nodes)
        )

        setup: list[Op] = [
            make_identity(k, bytes([i]) * 32, authors.stamp(i)) for i, k in enumerate(authors.keys)
        ]
        cluster.post_ops(0, [*setup, *authors.joins])

        t0 = time.monotonic()
        for i, batch in enumerate(_split(authors.messages(per_phase, "before"), nodes)):
            cluster.post_ops(i, batch)  # each node gets its share
        timings["converge_initial_s"] = cluster.wait_converged()
        console.print(
            f"phase 1: {per_phase} messages posted across all nodes, converged in "
            f"{timings['converge_initial_s']:.2f} s"
        )

        victim = nodes - 1
        cluster.partition(victim)
        time.sleep(1.0)
        majority = [i for i in range(nodes) if i != victim]
        for i, batch in enumerate(
            _split(authors.messages(per_phase, "during", per_phase), len(majority))
        ):
            cluster.post_ops(majority[i], batch)
        cluster.post_ops(victim, authors.messages(per_phase // 10 or 1, "cut-off", 2 * per_phase))
        time.sleep(2 * 2.0 + 1)  # two sync intervals: the cut must hold
        diverged = not cluster.converged()
        timings["converge_majority_s"] = cluster.wait_converged(indexes=majority)
        console.print(
            f"phase 2: node {victim} cut off; {per_phase} messages on the majority, "
            f"{per_phase // 10 or 1} on node {victim}; roots differ during the cut: {diverged}"
        )

        t0 = time.monotonic()
        cluster.heal(victim)
        timings["heal_converge_s"] = cluster.wait_converged()
        console.print(
            f"phase 3: healed; all {nodes} nodes converged in {timings['heal_converge_s']:.2f} s"
        )

        final = {i: cluster.roots(i) for i in range(nodes)}
    table = Table(title="final Merkle roots per domain (equal = converged)")
    table.add_column("node")
    for domain in ("messages", "members", "identity"):
        table.add_column(domain)
    for i, roots in final.items():
        table.add_row(
            str(i),
            *(f"{roots[d][0][:12]}… ({roots[d][1]})" for d in ("messages", "members", "identity")),
        )
    console.print(table)
    converged = all(r == final[0] for r in final.values())
    result = {
        "nodes": nodes,
        "per_phase": per_phase,
        "diverged_during_partition": diverged,
        "converged": converged,
        "timings": timings,
        "roots": {str(i): r for i, r in final.items()},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    verdict = "[green]CONVERGED[/]" if converged and diverged else "[red]NOT CONVERGED[/]"
    console.print(f"{verdict} — saved {out}")
    return result


def _split(items: list[Op], parts: int) -> list[list[Op]]:
    return [items[i::parts] for i in range(parts)]
