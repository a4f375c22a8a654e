"""The SQLite baseline of the store benchmark: RFC-0005's schema, indexes and queries.

The schema is RFC-0005's "Database Schema" verbatim (messages + 4 indexes,
delivery_status, group_members), plus one table the RFC leaves out and a chat
list needs: ``read_progress``, the newest message a user has read in a group.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from bench.workload import SqlRow

PRAGMAS = {
    "journal_mode": "WAL",
    "synchronous": "NORMAL",  # WAL fsynced at checkpoints, not per commit: like RocksDB's sync=false
    "cache_size": "-262144",  # 256 MiB page cache (RocksDB gets a 512 MiB block cache)
    "temp_store": "MEMORY",
}

SCHEMA = """
CREATE TABLE messages (
    id              TEXT PRIMARY KEY,
    group_id        TEXT NOT NULL,
    sender_id       TEXT NOT NULL,
    server_timestamp INTEGER NOT NULL,
    payload         BLOB NOT NULL,
    payload_size    INTEGER NOT NULL,
    message_type    INTEGER NOT NULL DEFAULT 0,
    epoch           INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL
);
CREATE INDEX idx_messages_group_timestamp ON messages(group_id, server_timestamp);
CREATE INDEX idx_messages_sender ON messages(sender_id, server_timestamp);
CREATE INDEX idx_messages_created_at ON messages(created_at);
CREATE INDEX idx_messages_group_size ON messages(group_id, payload_size);

CREATE TABLE delivery_status (
    message_id      TEXT NOT NULL,
    recipient_id    TEXT NOT NULL,
    status          INTEGER NOT NULL DEFAULT 0,
    delivered_at    INTEGER,
    read_at         INTEGER,
    PRIMARY KEY (message_id, recipient_id),
    FOREIGN KEY (message_id) REFERENCES messages(id) ON DELETE CASCADE
);
CREATE INDEX idx_delivery_pending ON delivery_status(recipient_id, status) WHERE status = 0;

CREATE TABLE group_members (
    group_id        TEXT NOT NULL,
    user_id         TEXT NOT NULL,
    joined_at       INTEGER NOT NULL,
    PRIMARY KEY (group_id, user_id)
);
CREATE INDEX idx_group_members_user ON group_members(user_id);

-- not in RFC-0005: what a user has read, for unread counts
CREATE TABLE read_progress (
    user_id         TEXT NOT NULL,
    group_id        TEXT NOT NULL,
    last_read_ts    INTEGER NOT NULL,       -- server_timestamp of the newest message read
    PRIMARY KEY (user_id, group_id)
);
"""

# INSERT OR IGNORE: a duplicate id is a no-op, as put_message's duplicate check makes it.
INSERT_MESSAGE = "INSERT OR IGNORE INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"

# RFC-0005 "SQL query (backward pagination)", asking for one extra row to learn has_more.
PAGE_RFC = """
SELECT id, group_id, sender_id, server_timestamp, payload, message_type
FROM messages WHERE group_id = ? AND id < ? ORDER BY id DESC LIMIT ?
"""
# The same page ordered by idx_messages_group_timestamp's own column (cursor = server_timestamp).
PAGE_BY_TIMESTAMP = """
SELECT id, group_id, sender_id, server_timestamp, payload, message_type
FROM messages WHERE group_id = ? AND server_timestamp < ? ORDER BY server_timestamp DESC LIMIT ?
"""
FIRST_ID = "~"  # sorts after every Crockford base32 id: "no cursor" for PAGE_RFC
FIRST_TIMESTAMP = 1 << 62

# A user's groups, newest message first, with the newest message and an unread count:
# group_members by user, the newest message through idx_messages_group_timestamp, and
# the messages by others newer than read_progress counted on the same index (own
# messages are never unread, as in ChatDb).
LIST_USER_CHATS = """
SELECT gm.group_id, last.id, last.sender_id, last.server_timestamp,
       (SELECT COUNT(*) FROM messages m
         WHERE m.group_id = gm.group_id
           AND m.server_timestamp > COALESCE(rp.last_read_ts, 0)
           AND m.sender_id != gm.user_id) AS unread
FROM group_members gm
JOIN messages last ON last.rowid = (
    SELECT rowid FROM messages WHERE group_id = gm.group_id
    ORDER BY server_timestamp DESC LIMIT 1)
LEFT JOIN read_progress rp ON rp.user_id = gm.user_id AND rp.group_id = gm.group_id
WHERE gm.user_id = ?
ORDER BY last.server_timestamp DESC
LIMIT ?
"""


def connect(path: Path) -> sqlite3.Connection:
    """Open (autocommit: transactions are explicit) and apply PRAGMAS."""
    conn = sqlite3.connect(path, isolation_level=None)
    for name, value in PRAGMAS.items():
        conn.execute(f"PRAGMA {name} = {value}")
    return conn


def create_schema(conn: sqlite3.Connection) -> None:
    conn.executescript(SCHEMA)


def insert_batch(conn: sqlite3.Connection, rows: list[SqlRow]) -> None:
    conn.execute("BEGIN")
    conn.executemany(INSERT_MESSAGE, rows)
    conn.execute("COMMIT")


def insert_one(conn: sqlite3.Connection, row: SqlRow) -> None:
    conn.execute("BEGIN")
    conn.execute(INSERT_MESSAGE, row)
    conn.execute("COMMIT")


def insert_members(
    conn: sqlite3.Connection,
    members: list[tuple[str, str, int]],
    progress: list[tuple[str, str, int]],
) -> None:
    """group_members (group, user, joined_at) and read_progress (user, group, last_read_ts) rows."""
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO group_members VALUES (?, ?, ?)", members)
    conn.executemany("INSERT INTO read_progress VALUES (?, ?, ?)", progress)
    conn.execute("COMMIT")
    conn.execute("ANALYZE")


def query_plan(conn: sqlite3.Connection, sql: str, params: tuple[object, ...]) -> list[str]:
    return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
