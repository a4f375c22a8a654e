"""What is new for a user, pushed and paged (node/api/events.py), against real node processes
with a real WebSocket client (trio-websocket): a post on one node reaches a stream on another
by gossip, and by anti-entropy when gossip is cut; a stream resumes after kill -9 of its node
with nothing acknowledged lost and nothing twice; a thousand idle streams on one node all get
the next message; a client that never reads is closed and the node serves on; and every kind
of bad token, bad frame and wrong user is refused with its code."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio
import trio_websocket

from client.http import ChatsyncClient
from cluster.local import Cluster, NodeProcess
from cluster.scenario import Authors
from store.ops import Op
from store.records import MsgV1

pytestmark = pytest.mark.slow

AUTHORS = Authors(3)  # 0 posts, 1 reads (both in GROUP); 2 is in GROUP too
WRITER, READER = 0, 1


def reader_token(node: NodeProcess, author: int = READER) -> str:
    with ChatsyncClient(node.url, key=AUTHORS.keys[author]) as client:
        return client.token()


def stream_url(
    node: NodeProcess, token: str | None, since: str | None = None, user: int = READER
) -> str:
    query = [] if token is None else [f"access_token={token}"]
    query += [] if since is None else [f"since={since}"]
    return (
        f"ws://127.0.0.1:{node.http_port}/users/{AUTHORS.ids[user].hex()}/stream?{'&'.join(query)}"
    )


@asynccontextmanager
async def stream(
    node: NodeProcess, since: str | None = None
) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    token = await trio.to_thread.run_sync(reader_token, node)
    async with trio_websocket.open_websocket_url(stream_url(node, token, since)) as ws:
        yield ws


async def messages_until(
    ws: trio_websocket.WebSocketConnection, wanted: set[bytes], timeout_s: float = 30
) -> tuple[list[bytes], str]:
    """The message ids the stream gives until all of ``wanted`` came, and the last token."""
    got: list[bytes] = []
    last = ""
    with trio.fail_after(timeout_s):
        while not wanted <= set(got):
            batch = json.loads(await ws.get_message())
            last = batch["next"]
            got += [
                bytes.fromhex(e["message"]["id"] if e["message"] else e["msg_id"])  # or a stub's
                for e in batch["events"]
                if e["type"] == "message"
            ]
            await ws.send_message(json.dumps({"ack": last}))
    return got, last


def ids(ops: list[Op]) -> set[bytes]:
    return {op.msg_id for op in ops if isinstance(op, MsgV1)}


def post(cluster: Cluster, index: int, ops: list[Op]) -> None:
    assert all(cluster.post_ops(index, ops))


async def test_a_post_reaches_a_stream_on_another_node_by_gossip_and_by_sync(
    tmp_path: Path,
) -> None:
    with Cluster(2, tmp_path, sync_interval_s=1.0) as cluster:
        cluster.start()
        post(cluster, 0, AUTHORS.joins)
        cluster.wait_converged(timeout_s=30)
        b = cluster.nodes[1]
        async with stream(b) as ws:
            by_gossip = AUTHORS.messages(5, "gossip")
            post(cluster, 0, by_gossip)
            got, _ = await messages_until(ws, ids(by_gossip))
            assert sorted(got) == sorted(ids(by_gossip))  # each once
            cluster.partition(1)  # gossip (and sync) between them cut
            by_sync = AUTHORS.messages(5, "sync", start=5)
            post(cluster, 0, by_sync)
            await trio.sleep(7)  # past gossipsub's message cache (5 heartbeats of 1 s)
            cluster.heal(1)  # the posts' gossip is long gone: sync brings them
            got, _ = await messages_until(ws, ids(by_sync))
            assert sorted(got) == sorted(ids(by_sync))
        arrivals = httpx.get(
            f"{b.url}/debug/latency", params={"arrivals": 1}, headers=b.admin_headers()
        ).json()
        by_sync_stamps = {m.hlc.pack() for m in by_sync if isinstance(m, MsgV1)}
        assert by_sync_stamps <= {stamp for stamp, _ in arrivals["sync_arrivals"]}


async def test_a_stream_resumes_after_kill_9_with_nothing_lost_and_nothing_twice(
    tmp_path: Path,
) -> None:
    with Cluster(1, tmp_path, durable=True) as cluster:
        cluster.start()
        node = cluster.nodes[0]
        post(cluster, 0, AUTHORS.joins)
        first = AUTHORS.messages(10, "before")
        post(cluster, 0, first)
        async with stream(node) as ws:
            _got, token = await messages_until(ws, ids(first))
        later = AUTHORS.messages(30, "acknowledged, then kill -9", start=10)
        post(cluster, 0, later)  # each acknowledged: durable, in the WAL
        cluster.stop(0, kill=True)
        cluster.restart(0)
        async with stream(node, since=token) as ws:
            resumed, _ = await messages_until(ws, ids(later))
            more = AUTHORS.messages(3, "after the restart", start=40)
            post(cluster, 0, more)
            after, _ = await messages_until(ws, ids(more))
    assert resumed == [m.msg_id for m in later if isinstance(m, MsgV1)]  # in order, once
    assert sorted(after) == sorted(ids(more))


async def test_a_thousand_idle_streams_all_get_the_next_message(tmp_path: Path) -> None:
    with Cluster(1, tmp_path) as cluster:
        cluster.start()
        node = cluster.nodes[0]
        post(cluster, 0, AUTHORS.joins)
        token = await trio.to_thread.run_sync(reader_token, node)
        url = stream_url(node, token)
        ready = trio.Semaphore(0)
        news = AUTHORS.messages(1, "to everyone")
        received: list[int] = []

        async def listener(n: int) -> None:
            async with trio_websocket.open_websocket_url(url, connect_timeout=60) as ws:
                ready.release()
                _got, _ = await messages_until(ws, ids(news), timeout_s=120)
                received.append(n)

        async with trio.open_nursery() as nursery:
            for n in range(1000):
                nursery.start_soon(listener, n)
            with trio.fail_after(120):
                for _ in range(1000):
                    await ready.acquire()
            await trio.to_thread.run_sync(post, cluster, 0, news)
        metrics = httpx.get(f"{node.url}/metrics").text
    assert sorted(received) == list(range(1000))
    assert "chatsync_streams_opened_total 1000" in metrics


async def test_a_client_that_never_reads_is_closed_and_others_are_served(tmp_path: Path) -> None:
    config = {"stream_send_timeout_s": 1.0, "author_ops_per_s": 1e6, "author_ops_burst": 1e6}
    with Cluster(1, tmp_path, node_config=config) as cluster:
        cluster.start()
        node = cluster.nodes[0]
        post(cluster, 0, AUTHORS.joins)
        bulk = [AUTHORS.messages(1, "x" * 60_000, start=n)[0] for n in range(400)]  # ~32 MB of JSON
        for i in range(0, len(bulk), 50):
            post(cluster, 0, bulk[i : i + 50])
        token = await trio.to_thread.run_sync(reader_token, node)
        # this client reads the handshake and nothing more: its kernel buffers fill up
        async with trio_websocket.open_websocket_url(
            stream_url(node, token), message_queue_size=0, receive_buffer_size=1024
        ) as idle:
            with trio.fail_after(60):
                while "slow_consumer" not in httpx.get(f"{node.url}/metrics").text:
                    await trio.sleep(0.5)
            del idle
        async with stream(node) as ws:  # the node serves on
            _got, _ = await messages_until(ws, ids(bulk[:5]))
        metrics = httpx.get(f"{node.url}/metrics").text
    assert 'chatsync_streams_closed_total{reason="slow_consumer"} 1' in metrics


async def close_of(url: str, send: str | None = None) -> tuple[int | None, str]:
    """The close code and reason the node answers ``url`` (after sending ``send``) with."""
    async with trio_websocket.open_websocket_url(url) as ws:
        if send is not None:
            await ws.send_message(send)
        with trio.fail_after(10):
            try:
                while True:
                    await ws.get_message()
            except trio_websocket.ConnectionClosed as closed:
                assert closed.reason is not None
                return closed.reason.code, closed.reason.reason or ""


async def test_bad_tokens_frames_and_users_are_refused_with_their_code(tmp_path: Path) -> None:
    with Cluster(2, tmp_path) as cluster:
        cluster.start()
        a, b = cluster.nodes
        post(cluster, 0, AUTHORS.joins)
        token = await trio.to_thread.run_sync(reader_token, a)
        other = await trio.to_thread.run_sync(reader_token, a, 2)  # another member's
        on_b = await trio.to_thread.run_sync(reader_token, b)
        b_since = httpx.get(
            f"{b.url}/users/{AUTHORS.ids[READER].hex()}/events",
            headers={"authorization": f"Bearer {on_b}"},
        ).json()["next"]
        cases: list[tuple[str, str | None, int, str]] = [
            (stream_url(a, None), None, 4401, "no_token"),
            (stream_url(a, "x" * 40), None, 4401, "bad_token"),
            (stream_url(a, token[:-4] + "AAAA"), None, 4401, "bad_token"),  # forged MAC
            (stream_url(a, on_b), None, 4401, "bad_token"),  # b's token, on a
            (stream_url(a, other), None, 4403, "wrong_user"),
            (stream_url(a, token, since=b_since), None, 4410, "foreign_token"),
            (stream_url(a, token, since="!!"), None, 4400, "bad_since"),
            (stream_url(a, token), "x" * 2000, 1009, "too_large"),
            (stream_url(a, token), '{"ack": 5}', 4400, "bad_message"),
            (stream_url(a, token), "not json", 4400, "bad_message"),
        ]
        for url, send, code, reason in cases:
            got_code, got_reason = await close_of(url, send)
            assert (got_code, got_reason.split(":")[0]) == (code, reason), (url, send, got_reason)
        async with stream(a) as ws:  # and the node serves on
            news = AUTHORS.messages(1, "still here")
            post(cluster, 0, news)
            await messages_until(ws, ids(news))
        metrics = httpx.get(f"{a.url}/metrics").text
    for reason in ("no_token", "bad_token", "wrong_user", "foreign_token", "bad_since"):
        assert f'chatsync_streams_refused_total{{reason="{reason}"}}' in metrics
