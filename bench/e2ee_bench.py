"""``chatsync bench e2ee``: what group encryption (issue 34, ``client/group_e2e.py``) costs a
client, each figure beside its plain counterpart in the same run.

* **Per message**: sealing a payload (its message key derived from the epoch key, then
  XChaCha20-Poly1305) and opening it (``Keyring.open``), beside signing the same plain message
  (``MsgV1.create``, ed25519) and verifying it: the ratio is what encryption adds to what every
  message costs already.
* **Per removal**: in a group of N members a removal leaves N-1, and each of them starts a new
  epoch before its next message (``needs_new_epoch``): one grants payload for N-1 recipients
  (itself among them), ``MAX_RECIPIENTS`` to a KEYS message, each signed. Measured for one
  sender; the model for the group: every remaining member posts once afterwards, so rotates
  once, and the totals are N-1 times one sender's. A plain group spends nothing.
* **A history page** (``bench/e2ee_history.py``): from a real node, a page of sealed messages
  fetched with ``client.http`` and each opened, against a page of plain ones fetched alone.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nacl.public import PrivateKey
from rich.console import Console

from bench.console import bench_console, save_report
from bench.e2ee_history import measure_history
from bench.e2ee_report import plot, print_report
from bench.machine import loadavg, machine_info
from client.e2e import UserKey
from client.group_e2e import (
    Keyring,
    epoch_grants,
    message_key,
    new_epoch,
    open_grants,
    seal_epoch,
    seal_group,
)
from store.hlc import Hlc
from store.records import MessageKind, MsgV1

CHAT = b"\x34" * 32  # the per-message and per-removal figures need no node: any chat id
SENDER = UserKey.from_seed(b"\x01" * 32)
READER = UserKey.from_seed(b"\x02" * 32)
FETCHES_PER_ROUND = 20  # a page fetch is a few ms of HTTP: many more samples for its median


@dataclass(frozen=True)
class E2eeBenchParams:
    sizes: tuple[int, ...] = (100, 1024, 16 * 1024)  # payload bytes, per message
    iterations: int = 2000  # calls per op per round, per message
    groups: tuple[int, ...] = (2, 10, 100, 1000, 5000)  # members before the removal
    page: int = 50  # messages in the history page
    history_payload: int = 200  # bytes of each of its messages
    rounds: int = 5  # medians over this many rounds (history: 20x as many page fetches)
    out: Path = Path("bench-results/e2ee.json")
    data: Path | None = None  # the node's directory (kept); default: a temporary one

    def check(self) -> None:
        if min(self.groups) < 2:
            raise ValueError("--groups: a removal needs at least 2 members")


def median_us(fns: dict[str, Callable[[], object]], calls: int, rounds: int) -> dict[str, float]:
    """Median µs per call of each of ``fns``; they take turns in every round, so a busy moment
    of a shared machine falls on all of them rather than on one."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def per_message_row(size: int, iterations: int, rounds: int) -> dict[str, Any]:
    """Seal and open one payload of ``size`` bytes beside signing and verifying it plain."""
    me, hlc, plaintext = SENDER.user_id, Hlc(int(time.time() * 1000)), os.urandom(size)
    epoch = new_epoch(frozenset({me}), hlc)
    ring = Keyring(CHAT)
    ring.learn(me, epoch_grants(epoch)[me])

    def encrypt() -> bytes:
        key = message_key(epoch.key, CHAT, me, hlc)
        return seal_group(key, epoch.key_id, CHAT, me, hlc, plaintext)

    sealed = encrypt()
    signed = MsgV1.create(SENDER.signing_key, CHAT, hlc, plaintext)
    if ring.open(me, hlc, sealed) != plaintext:
        raise AssertionError("a sealed payload did not open to its plain text")
    us = median_us(
        {
            "encrypt": encrypt,
            "decrypt": lambda: ring.open(me, hlc, sealed),
            "sign": lambda: MsgV1.create(SENDER.signing_key, CHAT, hlc, plaintext),
            "verify": signed.verify,
        },
        iterations,
        rounds,
    )
    return {
        "payload_bytes": size,
        "sealed_bytes": len(sealed),
        **{f"{op}_us": value for op, value in us.items()},
        "encrypt_vs_sign": us["encrypt"] / us["sign"],
        "decrypt_vs_verify": us["decrypt"] / us["verify"],
    }


def removal_row(members: int, rounds: int) -> dict[str, Any]:
    """One remaining sender's new epoch after a removal from ``members``, and the group's total
    if every one of the ``members - 1`` remaining posts once afterwards."""
    remaining = members - 1
    # the sender, a reader whose side is timed too, and others: any user id, a real x25519 key
    box_keys = {SENDER.user_id: SENDER.box_key, READER.user_id: READER.box_key}
    if remaining == 1:
        del box_keys[READER.user_id]  # the sender alone: it still grants itself (its state)
    while len(box_keys) < remaining:
        box_keys[os.urandom(20)] = bytes(PrivateKey.generate().public_key)
    recipients = frozenset(box_keys)
    reader = READER if READER.user_id in recipients else SENDER
    hlc = Hlc(int(time.time() * 1000))

    def rotate() -> list[MsgV1]:
        epoch = new_epoch(recipients, hlc)
        return [
            MsgV1.create(SENDER.signing_key, CHAT, hlc, payload, kind=MessageKind.KEYS)
            for payload in seal_epoch(SENDER, epoch, box_keys)
        ]

    def learn() -> int:  # a recipient reads the rotation's KEYS messages for its own row
        return sum(len(open_grants(reader, m.payload, SENDER.box_key)) for m in keys)

    # a rotation of 1,000+ recipients takes ~0.1-1 s: one there, up to ``rounds`` for small groups
    repeats = max(1, min(rounds, math.ceil(rounds * 100 / members)))
    seal_ms = median_us({"rotate": rotate}, 1, repeats)["rotate"] / 1000
    keys = rotate()
    if learn() != 1:
        raise AssertionError("a recipient did not find exactly one grant in a rotation")
    payload_bytes = sum(len(m.payload) for m in keys)
    per_sender = {
        "keys_messages": len(keys),
        "grants_payload_bytes": payload_bytes,
        "keys_message_bytes": sum(len(m.encoded) for m in keys),
        "box_ops": remaining,
        "seal_and_sign_ms": seal_ms,
    }
    return {
        "members": members,
        "remaining": remaining,
        "bytes_per_recipient": payload_bytes / remaining,
        "per_sender": per_sender,
        # the model: each remaining member posts once after the removal, so rotates once
        "all_senders": {
            "keys_messages": remaining * len(keys),
            "grants_payload_bytes": remaining * payload_bytes,
            "keys_message_bytes": remaining * per_sender["keys_message_bytes"],
            "box_ops": remaining * remaining,
            "seal_and_sign_ms": remaining * seal_ms,  # extrapolated from one sender's
        },
        "recipient_open_ms": median_us({"learn": learn}, 1, repeats)["learn"] / 1000,
        "plain_group_bytes": 0,
    }


def run_e2ee_bench(params: E2eeBenchParams, console: Console | None = None) -> dict[str, Any]:
    """Run every measurement, print the table, save the JSON and the plot beside it."""
    params.check()
    console = console or bench_console(log_width=140)
    load_before = loadavg()
    per_message = []
    for size in params.sizes:
        per_message.append(per_message_row(size, params.iterations, params.rounds))
        console.print(f"  per message, {size:,} B: done")
    removals = []
    for members in params.groups:
        removals.append(removal_row(members, params.rounds))
        console.print(f"  removal from {members:,} members: done")
    base = params.data or Path(tempfile.mkdtemp(prefix="chatsync-e2ee-"))
    shutil.rmtree(base, ignore_errors=True)
    try:
        history = measure_history(
            base, params.page, params.history_payload, FETCHES_PER_ROUND * params.rounds
        )
    finally:
        if params.data is None:
            shutil.rmtree(base, ignore_errors=True)
    report = {
        "benchmark": "e2ee",
        "params": {k: str(v) if isinstance(v, Path) else v for k, v in params.__dict__.items()},
        "machine": machine_info(load_before),
        "per_message": per_message,
        "removal": removals,
        "history": history,
        "about": __doc__ or "",
    }
    print_report(console, report)
    save_report(console, report, params.out)
    plot(report, params.out.with_suffix(".png"))
    console.print(f"saved {params.out.with_suffix('.png')}")
    return report
