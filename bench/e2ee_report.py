"""``chatsync bench e2ee``'s tables and plot, from its JSON document."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt
from rich.console import Console
from rich.table import Table

from bench.console import byte_size

OPS = ("encrypt", "decrypt", "sign", "verify")


def print_report(console: Console, report: dict[str, Any]) -> None:
    console.print(_per_message_table(report["per_message"]))
    console.print(_removal_table(report["removal"]))
    console.print(_history_table(report["history"]))


def _per_message_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="per message: sealed beside plain (median µs per call; ratio)")
    for name in ("payload", "sealed", "encrypt", "sign (ed25519)", "encrypt / sign"):
        table.add_column(name, justify="right")
    for name in ("decrypt", "verify", "decrypt / verify"):
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(
            byte_size(row["payload_bytes"]),
            f"+{row['sealed_bytes'] - row['payload_bytes']} B",
            f"{row['encrypt_us']:.1f}",
            f"{row['sign_us']:.1f}",
            f"{row['encrypt_vs_sign']:.2f}x",
            f"{row['decrypt_us']:.1f}",
            f"{row['verify_us']:.1f}",
            f"{row['decrypt_vs_verify']:.2f}x",
        )
    return table


def _removal_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(
        title="per removal: every remaining member rotates once, when it next posts "
        "(a plain group: 0 B, 0 messages)"
    )
    for name in (
        "members",
        "KEYS msgs, one sender",
        "grants bytes, one sender",
        "B per recipient",
        "seal+sign, one sender",
        "a recipient opens",
        "KEYS msgs, all senders",
        "grants bytes, all senders",
        "seal+sign, all senders*",
    ):
        table.add_column(name, justify="right")
    for row in rows:
        one, every = row["per_sender"], row["all_senders"]
        table.add_row(
            f"{row['members']:,}",
            f"{one['keys_messages']:,}",
            byte_size(one["grants_payload_bytes"]),
            f"{row['bytes_per_recipient']:.0f}",
            _ms(one["seal_and_sign_ms"]),
            _ms(row["recipient_open_ms"]),
            f"{every['keys_messages']:,}",
            byte_size(every["grants_payload_bytes"]),
            _ms(every["seal_and_sign_ms"]),
        )
    table.caption = "* extrapolated: one sender's time x the remaining members"
    return table


def _history_table(history: dict[str, Any]) -> Table:
    table = Table(
        title=f"a history page of {history['messages']} messages of "
        f"{history['payload_bytes']} B from a node (median of {history['rounds']} fetches)"
    )
    table.add_column("figure")
    table.add_column("ms", justify="right")
    table.add_column("vs plain fetch", justify="right")
    plain = history["plain_fetch_ms"]
    for key, label in (
        ("plain_fetch_ms", "plain page: fetch (signatures checked)"),
        ("sealed_fetch_ms", "sealed page: fetch"),
        ("open_ms", "sealed page: Keyring.open each"),
        ("sealed_read_ms", "sealed page: fetch + open"),
        ("learn_keys_ms", "once per epoch: fetch KEYS + open the grant"),
    ):
        table.add_row(label, f"{history[key]:.2f}", f"{history[key] / plain:.2f}x")
    return table


def _ms(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:,.0f} s"
    return f"{value:,.0f} ms" if value >= 100 else f"{value:.2f} ms"


def plot(report: dict[str, Any], path: Path) -> None:
    """Bytes per removal against the group's size (log-log), and µs per op per payload size."""
    fig, (removal, ops) = plt.subplots(1, 2, figsize=(12, 4.5))
    rows = report["removal"]
    members = [r["members"] for r in rows]
    removal.loglog(
        members, [r["per_sender"]["grants_payload_bytes"] for r in rows], marker="o",
        label="one sender's grants",
    )  # fmt: skip
    removal.loglog(
        members, [r["all_senders"]["grants_payload_bytes"] for r in rows], marker="s",
        label="all remaining senders (each posts once)",
    )  # fmt: skip
    for row in rows:  # the split into KEYS messages of MAX_RECIPIENTS
        one = row["per_sender"]
        removal.annotate(
            f"{one['keys_messages']} KEYS msg" + ("s" if one["keys_messages"] > 1 else ""),
            (row["members"], one["grants_payload_bytes"]), textcoords="offset points",
            xytext=(4, -12), fontsize=8,
        )  # fmt: skip
    removal.set_xlabel("members before the removal")
    removal.set_ylabel("grants payload bytes")
    removal.set_title("bytes per removal (a plain group: 0)")
    removal.grid(True, which="both", alpha=0.3)
    removal.legend()

    sizes = report["per_message"]
    width = 0.8 / len(OPS)
    for i, op in enumerate(OPS):
        xs = [j + (i - (len(OPS) - 1) / 2) * width for j in range(len(sizes))]
        ops.bar(xs, [row[f"{op}_us"] for row in sizes], width, label=op)
    ops.set_xticks(range(len(sizes)), [f"{row['payload_bytes']:,} B" for row in sizes])
    ops.set_xlabel("payload")
    ops.set_ylabel("µs per message (median)")
    ops.set_title("group encryption vs ed25519 signing, per message")
    ops.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
