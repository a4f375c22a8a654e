"""``chatsync bench hostile``: each attack of a js-libp2p peer against a fresh node, the figures
issue 19's closing note needs, printed and saved (``bench-results/hostile.json``).

The attacks are ``bench/hostile_attacks.py``'s: connect/disconnect cycles, silent sync streams,
peers without the sync protocol, a replay flood of a held op, a connection flood. A figure
that misses what honest peers must get is printed red and listed under ``failures``; the
program still exits 0 (it measures; ``tests/interop/test_libp2p_hostile.py`` asserts).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import hostile_attacks as attacks
from bench.console import bench_console, check_mark, save_report
from bench.js_peer import install_js_packages
from bench.machine import machine_info


@dataclass(frozen=True)
class HostileBenchParams:
    cycles: int = 1000  # connect/disconnect cycles
    probes: int = 5  # honest connection attempts after the cycles
    silent_streams: int = 4  # sync streams held silent
    sync_messages: int = 100  # messages the honest sync must bring
    sync_timeout_s: float = 30.0  # "did not converge" after this
    nosync_peers: int = 100  # peers without the sync protocol
    nosync_window_s: float = 60.0  # log lines counted over this
    nosync_sync_interval_s: float = 10.0  # the node's sync interval then (its default)
    replay_rate: int = 200  # copies of the held op per second
    replay_s: float = 15.0
    honest_ops: int = 10  # posted to another node during the replay flood
    flood_connections: int = 300
    flood_hold_s: float = 10.0
    settle_s: float = 10.0  # after the flood drops, before RSS is read again
    out: Path = Path("bench-results/hostile.json")
    data: Path | None = None  # nodes' directories (wiped first, kept); default: temporary


def _attacks(params: HostileBenchParams, base: Path) -> dict[str, Callable[[], attacks.Figures]]:
    p = params
    return {
        "churn": lambda: attacks.connection_churn(base / "churn", p.cycles, p.probes),
        "silent_sync": lambda: attacks.silent_sync_streams(
            base / "silent", p.silent_streams, p.sync_messages, p.sync_timeout_s
        ),
        "no_sync_protocol": lambda: attacks.peers_without_sync(
            base / "nosync", p.nosync_peers, p.nosync_window_s, p.nosync_sync_interval_s
        ),
        "replay_flood": lambda: attacks.replay_flood(
            base / "replay", p.replay_rate, p.replay_s, p.honest_ops
        ),
        "connection_flood": lambda: attacks.connection_flood(
            base / "flood", p.flood_connections, p.flood_hold_s, p.settle_s
        ),
    }


def run_hostile_bench(params: HostileBenchParams, console: Console | None = None) -> dict[str, Any]:
    """Every attack on its own fresh node; print, save, return the report."""
    console = console or bench_console(log_width=160)
    load_before = list(os.getloadavg())
    install_js_packages()
    base = (
        Path(tempfile.mkdtemp(prefix="chatsync-hostile-")) if params.data is None else params.data
    )
    if params.data is not None:
        shutil.rmtree(base, ignore_errors=True)
    results: dict[str, attacks.Figures] = {}
    try:
        for name, attack in _attacks(params, base).items():
            t0 = time.monotonic()
            console.print(f"attack: {name} …")
            results[name] = {**attack(), "elapsed_s": round(time.monotonic() - t0, 1)}
    finally:
        if params.data is None:
            shutil.rmtree(base, ignore_errors=True)
    ok = verdicts(results)
    report = {
        "benchmark": "hostile",
        "params": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(params).items()},
        "machine": machine_info(load_before, js_libp2p="3.3.11", gossipsub="17.1.1"),
        "attacks": results,
        "honest_peers_ok": ok,
        "failures": [name for name, good in ok.items() if not good],
    }
    print_report(console, report)
    save_report(console, report, params.out)
    return report


def figure_rows(results: dict[str, attacks.Figures]) -> list[tuple[str, str, str, bool]]:
    """(attack, figure, value, does it meet what honest peers must get) for the table."""
    churn, silent, nosync = results["churn"], results["silent_sync"], results["no_sync_protocol"]
    replay, flood = results["replay_flood"], results["connection_flood"]
    alone, attacked = silent["converged_s_without_attack"], silent["converged_s_under_attack"]

    def seconds(value: float | None) -> str:
        return f"{value:.2f} s" if value is not None else f"none within {silent['timeout_s']:g} s"

    growth = flood["rss_mb_after"] - flood["rss_mb_before"]
    return [
        ("churn", f"honest connections accepted after {churn['cycles']:,} cycles",
         f"{churn['probes_accepted']}/{churn['probes']} (cycles refused: {churn['cycles_failed']})",
         churn["probes_accepted"] == churn["probes"]),
        ("silent_sync", "honest sync converged, no attack", seconds(alone), alone is not None),
        ("silent_sync", f"… while a peer holds {silent['streams']} silent sync streams",
         seconds(attacked), attacked is not None and attacked <= attacks.CONVERGE_WITHIN_S),
        ("no_sync_protocol", f"log lines per minute, {nosync['peers']} peers without sync",
         f"{nosync['log_lines_per_minute']:,.0f} ({nosync['node_connected_peers']} connected)",
         nosync["log_lines_per_minute"] <= attacks.LOG_LINES_PER_MINUTE_MAX),
        ("replay_flood", f"replay flood, {replay['rate']}/s for {replay['seconds']:g} s",
         f"{replay['published']:,} sent, {replay['replays_validated']:,.0f} validated, "
         f"banned {replay['flooder_banned']}, hung up {replay['flooder_disconnected']}",
         attacks.flooder_stopped(replay)),
        ("replay_flood", "honest ops arrived during the flood",
         f"{replay['honest_arrived']}/{replay['honest_ops']}",
         replay["honest_arrived"] == replay["honest_ops"]),
        ("connection_flood", f"RSS before / during / after {flood['connections']} connections",
         f"{flood['rss_mb_before']} / {flood['rss_mb_during']} / {flood['rss_mb_after']} MB "
         f"({flood['node_connected_peers']} held)", growth <= attacks.RSS_GROWTH_MAX_MB),
        ("connection_flood", "an honest peer connects after the flood",
         str(flood["honest_probe_after"]), flood["honest_probe_after"]),
    ]  # fmt: skip


def verdicts(results: dict[str, attacks.Figures]) -> dict[str, bool]:
    """Per attack: did honest peers get all they must (the hostile tests' assertions)?"""
    ok: dict[str, bool] = dict.fromkeys(results, True)
    for attack, _, _, good in figure_rows(results):
        ok[attack] = ok[attack] and good
    return ok


def print_report(console: Console, report: dict[str, Any]) -> None:
    table = Table(title="chatsync bench hostile: what honest peers get under attack")
    for column in ("attack", "figure", "value", "ok"):
        table.add_column(column)
    for attack, figure, value, good in figure_rows(report["attacks"]):
        table.add_row(attack, figure, value, check_mark(good))
    console.print(table)
