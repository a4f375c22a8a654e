"""The log's end shared by the streams (node/api/tail.py): it gives what the store logged, each
event once; a message erased or hidden after the tail read it is gone from it — no stream gets
it any more and its payload leaves memory; a stream behind the tail's window reads the store."""

from __future__ import annotations

from pathlib import Path

from node.api import tail as tail_module
from node.api.tail import LogTail
from store import ChatDb, ChatDbConfig, Hlc, MessageKind, MsgV1
from store.events import EventKind
from store.feed import FeedEvent, Reader
from store.kinds import Claims
from sync.replica import DbReplica

from node_support import KEYS, USERS, add, messages

CONFIG = ChatDbConfig(block_cache_mb=8, memtable_mb=8)


def as_json(event: FeedEvent) -> str:
    return f"{event.kind.name}:{event.msg.payload.decode(errors='replace') if event.msg else '-'}"


async def test_the_tail_gives_each_event_once_and_forgets_what_was_erased(tmp_path: Path) -> None:
    with ChatDb(CONFIG, path=tmp_path) as db:
        replica = DbReplica(db)
        tail = LogTail(db.reads, as_json)
        posts = messages(0, 3)
        replica.apply_ops([add(0, 1), *posts])
        found = await tail.after(0)
        assert found is not None
        events, reached = found
        assert [e.json for e in events] == ["MEMBER:-"] + [
            f"MESSAGE:{m.payload.decode()}" for m in posts
        ]
        assert reached == db.last_position == 4
        assert (await tail.after(reached)) == ([], reached)  # nothing twice
        target = posts[1]
        delete = MsgV1.create(
            KEYS[0], target.chat_id, Hlc(target.hlc.physical_ms + 5),
            Claims.of(target).encode(), kind=MessageKind.DELETE, ref=target.msg_id,
        )  # fmt: skip
        replica.apply_ops([delete])
        found = await tail.after(0)
        assert found is not None
        texts = [e.json for e in found[0]]
    assert f"MESSAGE:{target.payload.decode()}" not in texts  # its copy is gone
    assert texts[-1].startswith("DELETE:") and len(texts) == 4


async def test_a_stream_behind_the_window_reads_the_store(
    tmp_path: Path, monkeypatch: object
) -> None:
    monkeypatch.setattr(tail_module, "KEEP", 2)  # type: ignore[attr-defined]
    with ChatDb(CONFIG, path=tmp_path) as db:
        replica = DbReplica(db)
        tail = LogTail(db.reads, as_json)
        replica.apply_ops([add(0, 1), *messages(0, 5)])
        assert await tail.after(db.last_position - 1) is not None
        assert await tail.after(0) is None  # behind the window: the caller reads db.feed
        reader = Reader(db.reads, USERS[2])  # never added
        found = await tail.after(db.last_position - 2)
        assert found is not None and all(e.kind is EventKind.MESSAGE for e in found[0])
        assert not any(
            reader.keeps(e.kind, e.chat_id, e.about) for e in found[0]
        )  # not a member: nothing kept
