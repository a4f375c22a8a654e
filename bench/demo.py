"""A store demo for a fresh machine: writes a realistic chat workload into ChatDb and reads it back."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from rich.console import Console
from rich.progress import track
from rich.table import Table

from store import ChatDb, ChatKind, Direction, Hlc, HlcClock, InboxEntry, MessageKind, MsgV1, Role
from store.hlc import VIRTUAL_EPOCH_MS
from store.signing import key_from_seed, public_key, user_id_from_key

BATCH = 500


def store_demo(path: str, *, messages: int, chats: int, users: int = 8) -> None:
    console = Console()
    shutil.rmtree(path, ignore_errors=True)
    keys = [key_from_seed(bytes([i + 1]) * 32) for i in range(users)]
    user_ids = [user_id_from_key(public_key(k)) for k in keys]
    chat_ids = [bytes([0xC0, i % 256]) + bytes(30) for i in range(chats)]
    clock = HlcClock()

    with ChatDb(path=path) as db:
        t0 = time.perf_counter()
        for n, chat in enumerate(chat_ids):
            for i, user in enumerate(user_ids):
                role = Role.ADMIN if i == n % users else Role.PARTICIPANT
                db.add_member_synced(chat, user, role, clock.now(VIRTUAL_EPOCH_MS))
        for user, key in zip(user_ids, keys, strict=True):
            db.put_identity(user, clock.now(VIRTUAL_EPOCH_MS), b"x25519:" + public_key(key))
        t_members = time.perf_counter() - t0

        t0 = time.perf_counter()
        written = 0
        for base in track(
            range(0, messages, BATCH), description="writing messages", console=console
        ):
            batch = []
            for i in range(base, min(base + BATCH, messages)):
                author = i % users
                batch.append(
                    MsgV1.create(
                        keys[author],
                        chat_ids[i % chats],
                        clock.now(VIRTUAL_EPOCH_MS + i * 10),
                        f"encrypted payload #{i}".encode(),
                    )
                )
            written += sum(not r.duplicate for r in db.put_messages(batch))
        t_write = time.perf_counter() - t0

        for chat in chat_ids:
            meta = db.get_chat_meta(chat)
            assert meta is not None
            entry = InboxEntry(
                chat, ChatKind.GROUP, meta.last_ts, meta.last_msg_id, user_ids[0], meta.last_seq
            )
            db.upsert_inbox_for_members(chat, db.list_members(chat), entry)
        read = db.range(chat_ids[0], limit=10, direction=Direction.FORWARD).items[-1].msg
        receipt = MsgV1.create(
            keys[0],
            chat_ids[0],
            clock.now(VIRTUAL_EPOCH_MS + messages * 10),
            read.hlc.to_bytes(),
            kind=MessageKind.READ_RECEIPT,
            ref=read.msg_id,
        )  # fmt: skip  (user 0 has read chat 0 up to its tenth message)
        db.put_messages([receipt])

        t0 = time.perf_counter()
        pages = seen = 0
        cursor = None
        while True:
            page = db.range(chat_ids[0], cursor, limit=50, direction=Direction.BACKWARD)
            pages += 1
            seen += len(page.items)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        t_range = time.perf_counter() - t0
        chat_list = db.list_user_chats(user_ids[0], limit=5)

    table = Table(title=f"chatsync store demo — {path}")
    table.add_column("step")
    table.add_column("result", justify="right")
    table.add_row("members + identities", f"{chats * users} + {users} in {t_members:.2f} s")
    table.add_row(
        "messages written", f"{written:,} in {t_write:.2f} s ({written / t_write:,.0f} msg/s)"
    )
    table.add_row("chat 0 paged backward", f"{seen} msgs in {pages} pages, {t_range * 1000:.1f} ms")
    for item in chat_list.items:
        table.add_row(
            f"inbox: chat {item.entry.chat_id[:2].hex()}",
            f"last seq {item.entry.last_seq}, unread {item.unread}",
        )
    console.print(table)
    size = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
    console.print(f"on disk: {size / 1e6:.1f} MB; HLC now {Hlc.unpack(clock.last.pack())}")
