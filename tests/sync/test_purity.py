"""The sans-IO rule (ARCHITECTURE.md): the pure core imports no trio, libp2p, rocksdict or pyspark."""

from __future__ import annotations

import subprocess
import sys

PURE = ["store.hlc", "store.keys", "store.records", "store.merge", "store.ops", "store.ingress", "store.retention",
        "store.access", "store.kinds", "store.plan", "store.waiting", "store.leaving", "sync.scope",
        "sync.serving", "sync.entitled", "sync.joining",
        "sync.merkle", "sync.frames", "sync.protocol", "sync.replica", "sync.loopback", "sync.claims", "sync.sketch",
        "dm3.crypto", "dm3.containers"]  # fmt: skip
FORBIDDEN = ["trio", "libp2p", "rocksdict", "pyspark"]


def test_pure_modules_import_no_io_libraries() -> None:
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in PURE)
        + f"print([m for m in {FORBIDDEN!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
