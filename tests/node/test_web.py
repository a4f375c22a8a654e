"""The web view's data (issue 37): which peers agree (node/agreement.py), the samples the
charts draw (node/series.py), the endpoints over two real nodes, the convergence metric,
the Grafana dashboard's queries against a real node's /metrics, and the page's files.
The page itself runs in a real browser in tests/cluster/test_web_view.py."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import trio

from node.agreement import LastSession, PeerAgreement, peer_rows, root_gauge
from node.metrics import Metrics
from node.node import RunningNode
from node.series import Sampler, Series
from sync.frames import Domain

from node_support import identity, now_ms, ops_body, running_node

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "chatsync-dashboard.json"
OURS = {"messages": "aa" * 32, "members": "bb" * 32}


def test_a_peer_agrees_while_its_last_matched_roots_are_still_ours() -> None:
    agreement = PeerAgreement()
    agreement.matched("p1", OURS, now_ms=1_000)
    agreement.matched("p2", {**OURS, "messages": "cc" * 32}, now_ms=2_000)
    rows = peer_rows(
        OURS, agreement, connected={"p1", "p3"}, blocked={"p2"},
        sessions={"p2": LastSession("timeout", 4_000)}, now_ms=5_000,
    )  # fmt: skip
    by_peer = {row["peer_id"]: row for row in rows}
    assert [row["peer_id"] for row in rows] == ["p1", "p2", "p3"]
    assert by_peer["p1"]["agrees"] is True and by_peer["p1"]["agreed_ms_ago"] == 4_000
    assert by_peer["p2"]["agrees"] is False and by_peer["p2"]["blocked"] is True
    assert by_peer["p2"]["last_session"] == {"result": "timeout", "ms_ago": 1_000}
    # connected, never agreed: nothing known of its roots
    assert by_peer["p3"] == {
        "peer_id": "p3", "connected": True, "blocked": False, "roots": None, "agrees": False,
        "agreed_ms_ago": None, "last_session": None,
    }  # fmt: skip
    assert agreement.seconds_since(3_000) == {"p1": 2.0, "p2": 1.0}


def test_agreements_are_bounded_and_the_oldest_goes_first() -> None:
    agreement = PeerAgreement(capacity=2)
    for i, peer in enumerate(("a", "b", "a", "c")):
        agreement.matched(peer, OURS, now_ms=i)
    assert agreement.peers() == ["a", "c"]  # b was the least recently matched
    roots = dict(OURS)
    agreement.matched("d", roots, now_ms=9)
    roots["messages"] = "00" * 32  # the caller's dict changing later changes nothing here
    assert agreement.last("d") is not None and agreement.last("d").roots == OURS  # type: ignore[union-attr]


def test_the_root_gauge_is_the_roots_first_48_bits_exactly() -> None:
    assert root_gauge("ffffffffffff" + "00" * 26) == float(2**48 - 1)
    assert root_gauge("000000000001" + "ff" * 26) == 1.0
    assert root_gauge("ab" * 32) != root_gauge("ac" + "ab" * 31)


def test_samples_total_the_counters_and_take_the_lag_of_new_ops_only() -> None:
    metrics = Metrics()
    metrics.observe_latency(5_000)  # before the sampler: not in its first sample
    sampler = Sampler(metrics, lambda: {"rss": 7.0})
    metrics.inc("gossip_ops_received", 3, reason="x")
    metrics.inc("gossip_ops_received", 2, reason="y")
    for ms in (10, 20, 30, 40):
        metrics.observe_latency(ms)
    first = sampler.take(1_000)
    assert first["gossip_in"] == 5 and first["sync_in"] == 0 and first["rss"] == 7.0
    assert (first["lag_p50"], first["lag_p99"]) == (30, 40)
    second = sampler.take(2_000)  # no op since: no lag, totals unchanged
    assert second["gossip_in"] == 5 and second["lag_p50"] is None and second["lag_p99"] is None


def test_a_series_keeps_the_newest_and_answers_since() -> None:
    series = Series(capacity=3)
    for t in (1, 2, 3, 4):
        series.add({"t": t})
    assert [s["t"] for s in series.since()] == [2, 3, 4]
    assert [s["t"] for s in series.since(3)] == [4]
    assert series.since(99) == []


@asynccontextmanager
async def two_nodes(
    tmp_path: Path, sync_interval_s: float = 0.5
) -> AsyncIterator[tuple[RunningNode, httpx.AsyncClient, RunningNode, httpx.AsyncClient]]:
    """a, then b bootstrapping from a (a new peer is synced with at once, then each interval)."""
    async with running_node(tmp_path / "a", sync_interval_s=sync_interval_s) as (a, a_http):
        first = a.listen_addrs[0]
        config = {"sync_interval_s": sync_interval_s, "bootstrap": (first,)}
        async with running_node(tmp_path / "b", **config) as (
            b,
            b_http,
        ):
            yield a, a_http, b, b_http


# Long: on a loaded machine (CI beside other jobs) sessions outlast the sync interval (two
# that cross are settled by peer id at once: node/sync_slots.py)
async def _wait_for(check: Callable[[], Awaitable[bool]], timeout_s: float = 60.0) -> None:
    with trio.fail_after(timeout_s):
        while not await check():
            await trio.sleep(0.1)


def _gauges(text: str, name: str) -> dict[str, float]:
    """label values -> value for one metric's lines."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, _, value = line.rpartition(" ")
            out[labels[len(name) :]] = float(value)
    return out


async def test_two_nodes_show_agreement_then_a_difference_and_the_metrics_say_so(
    tmp_path: Path,
) -> None:
    async with two_nodes(tmp_path) as (a, a_http, b, b_http):

        async def agreeing() -> bool:
            net = (await a_http.get("/network")).json()
            rows = {row["peer_id"]: row for row in net["peers"]}
            return b.peer_id in rows and rows[b.peer_id]["agrees"]

        await _wait_for(agreeing)
        net = (await a_http.get("/network")).json()
        (row,) = net["peers"]
        assert row["roots"] == net["roots"] and row["connected"] and not row["blocked"]
        assert row["last_session"]["ms_ago"] >= 0

        # both nodes export the same root digests; a's says how long since b agreed
        digests = await _root_digests(a_http, b_http)
        assert digests[0] == digests[1] and len(digests[0]) == len(Domain)
        a_metrics = (await a_http.get("/metrics")).text
        assert f'{{peer="{b.peer_id}"}}' in _gauges(a_metrics, "chatsync_peer_agreed_seconds")

        # b cut off at a: a's new identity is a difference a can see and b cannot close
        blocked = await a_http.post(
            "/admin/block", json={"peer_id": b.peer_id},
            headers={"authorization": f"Bearer {a.admin_token}"},
        )  # fmt: skip
        assert blocked.status_code == 200, blocked.text
        posted = await a_http.post("/ops", json=ops_body(identity(1, now_ms())))
        assert posted.status_code == 201, posted.text
        net = (await a_http.get("/network")).json()
        (row,) = net["peers"]
        assert row["blocked"] and not row["agrees"]
        assert row["roots"]["identity"] != net["roots"]["identity"]
        digests = await _root_digests(a_http, b_http)
        assert digests[0]['{domain="identity"}'] != digests[1]['{domain="identity"}']


async def _root_digests(*nodes: httpx.AsyncClient) -> list[dict[str, float]]:
    return [_gauges((await n.get("/metrics")).text, "chatsync_root_digest") for n in nodes]


async def test_series_samples_arrive_each_second_and_since_filters(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (_, http):
        await trio.sleep(2.2)
        samples = (await http.get("/status/series")).json()["samples"]
        assert len(samples) >= 2
        assert {"t", "written", "gossip_in", "sync_in", "api_in", "rss", "peers", "lag_p99"} <= set(
            samples[0]
        )
        assert samples[-1]["rss"] > 0 and samples[-1]["peers"] == 0
        later = (await http.get("/status/series", params={"since": samples[-2]["t"]})).json()
        assert [s["t"] for s in later["samples"]][:1] == [samples[-1]["t"]]
        for bad in ("-1", "soon", "1e999"):
            response = await http.get("/status/series", params={"since": bad})
            assert response.status_code == 422, (bad, response.text)


async def test_the_page_its_files_and_swagger_ui_are_served_from_the_package(
    tmp_path: Path,
) -> None:
    async with running_node(tmp_path) as (_, http):
        page = await http.get("/")
        assert page.status_code == 200 and 'src="/web/app.js"' in page.text
        for name, kind in (("app.js", "javascript"), ("style.css", "css")):
            response = await http.get(f"/web/{name}")
            assert response.status_code == 200 and kind in response.headers["content-type"]
        for outside in ("/web/../api/web.py", "/web/%2e%2e/api/web.py", "/web/nothing.js"):
            assert (await http.get(outside)).status_code == 404, outside
        docs = await http.get("/docs")
        scripts = re.findall(r'src="([^"]+)"', docs.text)
        assert scripts and all(s.startswith("/") for s in scripts), scripts  # no CDN
        for script in scripts:
            assert (await http.get(script)).status_code == 200, script


async def test_every_metric_the_grafana_dashboard_queries_exists_on_a_node(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    names = {n for q in queries for n in re.findall(r"chatsync_\w+", q)}
    assert len(names) >= 8, names
    # sync seldom: the post below reaches b by gossip first (the lag is gossip's)
    async with two_nodes(tmp_path, sync_interval_s=10) as (_, a_http, _, b_http):

        async def exported(name: str) -> bool:
            return name in (await b_http.get("/metrics")).text

        # both ends open a session at connect: the lower id's runs, the other is refused
        # (node/sync_slots.py); a loaded machine can need more than one interval (10 s ± 25 %)
        await _wait_for(lambda: exported("chatsync_peer_agreed_seconds{"), timeout_s=90.0)

        async def gossiped() -> bool:
            # a new op each try: the first may go out before b joined a's gossip mesh
            await a_http.post("/ops", json=ops_body(identity(2, now_ms())))
            await trio.sleep(0.5)
            return await exported("chatsync_op_latency_ms")

        await _wait_for(gossiped, timeout_s=60)
        # a took the post through its API, b got it by gossip: together they export everything
        metrics = (await a_http.get("/metrics")).text + (await b_http.get("/metrics")).text
    exported_names = {
        line.split("{")[0].split(" ")[0]
        for line in metrics.splitlines()
        if line.startswith("chatsync_")
    }
    assert names <= exported_names, names - exported_names


def test_the_dashboard_is_grafana_json_with_a_prometheus_datasource() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["schemaVersion"] >= 30
    for panel in dashboard["panels"]:
        assert panel["type"] in {"timeseries", "stat", "table"}, panel
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    assert any(v["type"] == "datasource" for v in dashboard["templating"]["list"])
