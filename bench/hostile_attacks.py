"""Attacks by a js-libp2p peer (``bench/js_peer.py``) on a fresh chatsync node process, each
returning the figures that say what honest peers still get.

One function per attack; each starts its own node(s) under ``base`` (``cluster/local.py``), at
the node's default log level (INFO) so its log lines are the ones an operator would get.
``chatsync bench hostile`` prints and saves them; ``tests/interop/test_libp2p_hostile.py``
asserts them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.js_peer import JsPeer, last, run_js_peer
from bench.machine import rss_kib
from bench.prometheus import metric
from cluster.local import Cluster
from cluster.scenario import Authors
from node.gossip.settings import OPS_TOPIC
from store.ops import encode_ops

Figures = dict[str, Any]

# What honest peers must get (the hostile tests assert these; the bench marks them)
CONVERGE_WITHIN_S = 5.0  # an honest sync while a peer holds silent streams
LOG_LINES_PER_MINUTE_MAX = 60  # from any number of peers without the sync protocol
RSS_GROWTH_MAX_MB = 5.0  # after a connection flood has dropped, over the baseline
# py-libp2p's GossipSub keeps a message 5 heartbeats (1 s each here) for gossip repair: ops
# older than that can only come to a node that was cut off by anti-entropy
GOSSIP_MEMORY_S = 6.0


# Every peer of these attacks dials from 127.0.0.1: where an attack needs many of them in at
# once, the per-IP cap (its own test: tests/node/test_connections.py) is lifted, or it would
# turn all but 16 away before the attack said anything about the other defences.
CROWD = {"inbound_per_ip": 1000}


@contextmanager
def fresh_nodes(
    base: Path,
    count: int = 1,
    sync_interval_s: float = 1.0,
    node_config: dict[str, int] | None = None,
) -> Iterator[Cluster]:
    with Cluster(
        count, base, sync_interval_s=sync_interval_s, log_level="INFO", node_config=node_config
    ) as cluster:
        cluster.start()
        yield cluster


def probe(address: str) -> bool:
    """Does an honest peer (a new key) connect, and stay connected for a second?"""
    events = run_js_peer("probe", {"target": address, "holdMs": 1000}, timeout_s=60)
    return bool(last(events, "probe")["connected"])


def connection_churn(base: Path, cycles: int, probes: int = 5) -> Figures:
    """``cycles`` connect/hang-up cycles by one peer; then how many honest probes connect."""
    with fresh_nodes(base) as cluster:
        address = cluster.nodes[0].multiaddr
        done = run_js_peer("cycles", {"target": address, "count": cycles}, 60 + cycles * 0.5)
        accepted = sum(probe(address) for _ in range(probes))
        return {"cycles": cycles, "cycles_failed": last(done, "cycles")["failed"],
                "probes": probes, "probes_accepted": accepted}  # fmt: skip


def _diverge(cluster: Cluster, authors: Authors, count: int, tag: str) -> None:
    """Node 1 cut off while node 0 takes ``count`` messages: only sync can bring them."""
    cluster.partition(1)
    time.sleep(0.5)
    cluster.post_ops(0, authors.messages(count, tag))
    time.sleep(GOSSIP_MEMORY_S)  # then gossip's repair (IHAVE/IWANT) has forgotten them


def _converge_after_heal(cluster: Cluster, timeout_s: float) -> float | None:
    cluster.heal(1)
    try:
        return round(cluster.wait_converged(timeout_s), 2)
    except TimeoutError:
        return None


def silent_sync_streams(base: Path, streams: int, messages: int, timeout_s: float) -> Figures:
    """Seconds until two nodes converge by sync, without and then with a peer holding
    ``streams`` silent sync streams on node 0 (None: not within ``timeout_s``)."""
    authors = Authors(2)
    with fresh_nodes(base, 2) as cluster:
        cluster.post_ops(0, authors.joins)
        cluster.wait_converged(30)
        _diverge(cluster, authors, messages, "before the attack")
        alone = _converge_after_heal(cluster, timeout_s)
        config = {"target": cluster.nodes[0].multiaddr, "streams": streams,
                  "seconds": timeout_s + 60}  # fmt: skip
        # the attacker first: once node 1 is cut off (an admin block), a newcomer from the
        # same address would be refused before the handshake (every peer seen there blocked)
        with JsPeer("silent", config) as attacker:
            attacker.wait_for("holding", 30)
            _diverge(cluster, authors, messages, "during the attack")
            attacked = _converge_after_heal(cluster, timeout_s)
            attacker.close()
        opened = max((e.get("opened", 0) for e in attacker.events), default=0)
        return {"streams": streams, "messages": messages, "timeout_s": timeout_s,
                "converged_s_without_attack": alone, "converged_s_under_attack": attacked,
                "silent_streams_opened": opened}  # fmt: skip


def _log_size(cluster: Cluster) -> int:
    return cluster.nodes[0].log_path.stat().st_size


def _log_lines_since(cluster: Cluster, offset: int) -> list[str]:
    with cluster.nodes[0].log_path.open("rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace").splitlines()


def peers_without_sync(base: Path, peers: int, window_s: float, sync_interval_s: float) -> Figures:
    """Log lines while ``peers`` peers that do not speak the sync protocol stay connected: in
    the first ``2 × sync interval + 5 s`` (each peer looked at, one line per peer and reason
    allowed) and then per minute over ``window_s`` (the steady state)."""
    roomy = {**CROWD, "inbound_max": peers + 16}  # this attack is about logs, not the cap
    with fresh_nodes(base, sync_interval_s=sync_interval_s, node_config=roomy) as cluster:
        first_s = 2 * sync_interval_s + 5
        config = {"target": cluster.nodes[0].multiaddr, "peers": peers,
                  "seconds": first_s + window_s + 30}  # fmt: skip
        with JsPeer("nosync", config) as crowd:
            offset = _log_size(cluster)
            connected = crowd.wait_for("connected", 120)
            time.sleep(first_s)
            first = _log_lines_since(cluster, offset)
            offset = _log_size(cluster)
            time.sleep(window_s)
            lines = _log_lines_since(cluster, offset)
            connected_now = len(cluster.status(0)["connected_peers"])
        return {"peers": peers, "peers_connected": connected["open"],
                "node_connected_peers": connected_now, "sync_interval_s": sync_interval_s,
                "first_s": first_s, "first_log_lines": len(first), "window_s": window_s,
                "log_lines": len(lines), "log_lines_per_minute": round(len(lines) * 60 / window_s, 1),
                "sample": (first + lines)[:12]}  # fmt: skip


def replay_flood(base: Path, rate: int, seconds: float, honest_ops: int) -> Figures:
    """A peer publishes an op node 0 holds, ``rate`` times a second for ``seconds``, while
    ``honest_ops`` new ops are posted to node 1: is the flooder throttled or banned, and do
    the honest ops reach node 0?"""
    authors = Authors(2)
    with fresh_nodes(base, 2, sync_interval_s=10.0) as cluster:
        held = authors.messages(1, "held")
        cluster.post_ops(0, [*authors.joins, *held])
        cluster.wait_converged(30)
        before = cluster.roots(0)["messages"][1]
        config = {"target": cluster.nodes[0].multiaddr, "data": encode_ops(held).hex(),
                  "rate": rate, "seconds": seconds, "topic": OPS_TOPIC}  # fmt: skip
        with JsPeer("replay", config) as flooder:
            flooder.wait_for("subscribed", 30)
            _post_paced(cluster, authors, honest_ops, seconds)
            done = flooder.wait_for("replay", seconds + 60)
        arrived = _wait_for_count(cluster, before + honest_ops, 20) - before
        status, metrics = cluster.status(0), cluster.http.get(f"{cluster.nodes[0].url}/metrics")
        rejected = metric(metrics.text, "gossip_rejected_total")
        return {"rate": rate, "seconds": seconds, "published": done["published"],
                "replays_validated": rejected.get('reason="nothing_new"', 0),
                "flooder_disconnected": done["disconnected"],
                "flooder_still_connected": done["stillConnected"],
                "flooder_banned": bool(status["blocked_peers"]), "rejected": rejected,
                "honest_ops": honest_ops, "honest_arrived": arrived}  # fmt: skip


def flooder_stopped(figures: Figures) -> bool:
    """Banned, hung up on, or throttled: at most half its copies cost a validation."""
    throttled = figures["replays_validated"] <= figures["published"] / 2
    return figures["flooder_banned"] or figures["flooder_disconnected"] or throttled


def _post_paced(cluster: Cluster, authors: Authors, count: int, seconds: float) -> None:
    """``count`` honest messages posted to node 1, spread over ``seconds``."""
    for n in range(count):
        cluster.post_ops(1, authors.messages(1, "honest", start=n))
        time.sleep(seconds / count)


def _wait_for_count(cluster: Cluster, count: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while (now := cluster.roots(0)["messages"][1]) < count and time.monotonic() < deadline:
        time.sleep(0.3)
    return now


def rss_mb(cluster: Cluster) -> float:
    proc = cluster.nodes[0].proc
    assert proc is not None
    return round(rss_kib(proc.pid) * 1024 / 1e6, 1)


def connection_flood(base: Path, connections: int, hold_s: float, settle_s: float) -> Figures:
    """RSS of the node before, while ``connections`` peers hold a connection, and ``settle_s``
    after they drop; an honest probe first, so the baseline has every code path loaded."""
    with fresh_nodes(base, node_config=CROWD) as cluster:
        address = cluster.nodes[0].multiaddr
        probe(address)
        time.sleep(settle_s)
        before = rss_mb(cluster)
        config = {"target": address, "connections": connections, "holdSeconds": hold_s}
        with JsPeer("flood", config) as flood:
            held = flood.wait_for("held", 120 + connections)
            during = rss_mb(cluster)
            node_saw = len(cluster.status(0)["connected_peers"])
            flood.wait_for("dropped", hold_s + 60)
        time.sleep(settle_s)
        return {"connections": connections, "connected": held["open"],
                "node_connected_peers": node_saw, "rss_mb_before": before,
                "rss_mb_during": during, "rss_mb_after": rss_mb(cluster),
                "honest_probe_after": probe(address)}  # fmt: skip
