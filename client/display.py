"""How the read commands (history, watch, chats, group members, status) show what they read:
on screen, ids cut to 12 hex digits and texts to a preview of one line; with ``--json``, the
same things whole, one JSON document per page (``watch``: one per line), for scripts.

Pure: strings and dicts in, strings out; the commands print them.
"""

from __future__ import annotations

import json
from typing import Any

from store.records import MessageKind, MsgV1

SHORT_ID = 12  # hex digits: what the tables show of an id, and enough to name a message
PREVIEW_CHARS = 120  # a message on screen; --json gives it whole


def short(raw: bytes) -> str:
    return raw.hex()[:SHORT_ID]


def preview(text: str) -> str:
    """``text`` on one line (a newline shown as ↵: a watch line stays one event); cut to
    PREVIEW_CHARS with an ellipsis and the full size, so a huge message does not fill the
    terminal."""
    flat = text.replace("\r\n", "\n").replace("\n", "↵")
    if len(flat) <= PREVIEW_CHARS:
        return flat
    return f"{flat[:PREVIEW_CHARS]}… [{len(text.encode()):,} bytes in all; --json shows it whole]"


def msg_json(msg: MsgV1, text: str | None) -> dict[str, Any]:
    """A message as ``--json`` gives it: every id whole, the text as shown, uncut."""
    return {
        "id": msg.msg_id.hex(),
        "chat_id": msg.chat_id.hex(),
        "sender": msg.sender.hex(),
        "kind": MessageKind(msg.kind).name.lower(),
        "ref": None if msg.ref is None else msg.ref.hex(),
        "time_ms": msg.hlc.physical_ms,
        "hlc": {"physical_ms": msg.hlc.physical_ms, "logical": msg.hlc.logical},
        "text": text,
    }


def dumps(value: Any) -> str:
    """One line of JSON (non-ASCII text as is)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
