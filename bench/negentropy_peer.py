"""negentropy's reference implementation (``bench/negentropy/``), run by ``node`` on the same
two sets a ``chatsync bench sync`` case reconciles: the bytes both ways and the round trips.

Items are (timestamp in seconds, as Nostr's ``created_at``, id): a differing message's HLC
time; a shared id, which has no record behind it in the benchmark, a time derived from its
bytes, uniform over the range the scattered messages span — negentropy sorts by time first, so
the placement is the same. (The reference code's timestamp varints break above 2^32.)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parent / "negentropy" / "run.js"


def available() -> bool:
    return shutil.which("node") is not None and SCRIPT.is_file()


def item_blob(items: Iterable[tuple[int, bytes]]) -> bytes:
    """Records of an 8-byte big-endian timestamp and a 32-byte id, as ``run.js`` reads them."""
    return b"".join(ts.to_bytes(8, "big") + record_id for ts, record_id in items)


def reconcile(
    client: bytes, server: bytes, *, frame_limit: int = 0, timeout_s: float = 600
) -> dict[str, Any]:
    """One reconciliation of two item blobs: {"bytes", "round_trips", "have", "need", "ms"}."""
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("node is needed to run negentropy's reference implementation")
    with tempfile.TemporaryDirectory(prefix="negentropy-") as tmp:
        a, b = Path(tmp) / "client.bin", Path(tmp) / "server.bin"
        a.write_bytes(client)
        b.write_bytes(server)
        out = subprocess.run(
            [node, "--max-old-space-size=4096", str(SCRIPT), str(a), str(b), str(frame_limit)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result
