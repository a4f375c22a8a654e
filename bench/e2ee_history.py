"""A history page of sealed group messages read from a real node, against a plain one
(``chatsync bench e2ee``).

One node process (``cluster.local.Cluster``); alice creates two groups with bob in each and
posts ``page`` messages to each: sealed under one epoch (its grants first, a KEYS message) in
one, plain in the other. Bob, a ``client.http`` client, then fetches a page of each in turn —
the fetch checks every signature, as a client does — and opens every sealed message with his
keyring. Learning the keys (fetching the chat's KEYS messages, opening his grant) is timed on
its own: a client does it once per epoch, not per page. The sender's box key is taken as known
(a client reads it once from the sender's verified identity).
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

from client.e2e import UserKey
from client.group_e2e import (
    Keyring,
    message_key,
    new_epoch,
    open_grants,
    seal_epoch,
    seal_group,
)
from client.http import ChatsyncClient
from cluster.local import Cluster
from store.authz import new_group
from store.ops import MembershipAction, Op
from store.records import MessageKind, MsgV1, Role

ALICE = UserKey.from_seed(b"\x0a" * 32)
BOB = UserKey.from_seed(b"\x0b" * 32)
POST_BATCH = 100  # ops per POST while filling the chats


def measure_history(base: Path, page: int, payload: int, rounds: int) -> dict[str, Any]:
    """Median ms per page: plain fetch, sealed fetch, opening it; the learning of the keys."""
    with Cluster(1, base, sync_interval_s=3600) as cluster:
        cluster.start()
        url = cluster.nodes[0].url
        with (
            ChatsyncClient(url, key=ALICE.signing_key, device="alice") as alice,
            ChatsyncClient(url, key=BOB.signing_key, device="bob") as bob,
        ):
            plain_chat, plain_texts = _fill(alice, page, payload, sealed=False)
            sealed_chat, sealed_texts = _fill(alice, page, payload, sealed=True)
            samples: dict[str, list[float]] = {
                "plain_fetch": [], "sealed_fetch": [], "open": [], "learn_keys": [],
            }  # fmt: skip
            for turn in range(rounds):  # each in turn: a busy moment falls on all of them
                start = time.perf_counter()
                ring = learn_keys(bob, sealed_chat)
                samples["learn_keys"].append(_ms_since(start))
                # which page goes first alternates: neither always gets the warmer connection
                for sealed_turn in (False, True) if turn % 2 else (True, False):
                    if sealed_turn:
                        opened = _read_sealed(bob, sealed_chat, page, ring, samples)
                    else:
                        start = time.perf_counter()
                        plain = bob.history(plain_chat, limit=page)
                        samples["plain_fetch"].append(_ms_since(start))
            read_back = (sorted(m.payload for m in plain.messages), sorted(opened))
            if read_back != (sorted(plain_texts), sorted(sealed_texts)):
                raise AssertionError("a page did not read back as posted")
    ms = {f"{name}_ms": statistics.median(values) for name, values in samples.items()}
    sealed_read = ms["sealed_fetch_ms"] + ms["open_ms"]
    return {
        "messages": page,
        "payload_bytes": payload,
        "rounds": rounds,
        **ms,
        "sealed_read_ms": sealed_read,  # fetch + open, what a reader waits for
        "sealed_read_vs_plain": sealed_read / ms["plain_fetch_ms"],
        "open_share_of_sealed_read": ms["open_ms"] / sealed_read,
        "open_us_per_message": ms["open_ms"] * 1000 / page,
    }


def _read_sealed(
    reader: ChatsyncClient, chat: bytes, page: int, ring: Keyring, samples: dict[str, list[float]]
) -> list[bytes]:
    """Fetch a page of ``chat`` and open each message, timing the two apart."""
    start = time.perf_counter()
    sealed = reader.history(chat, limit=page)
    samples["sealed_fetch"].append(_ms_since(start))
    start = time.perf_counter()
    opened = [ring.open(m.msg.sender, m.msg.hlc, m.payload) for m in sealed.messages]
    samples["open"].append(_ms_since(start))
    return opened


def learn_keys(reader: ChatsyncClient, chat: bytes) -> Keyring:
    """A fresh keyring from the chat's KEYS messages (one page: one epoch here)."""
    ring = Keyring(chat)
    for message in reader.history(chat, kind=int(MessageKind.KEYS), raw=True).messages:
        ring.learn(message.msg.sender, open_grants(BOB, message.payload, ALICE.box_key))
    return ring


def _fill(
    alice: ChatsyncClient, count: int, payload: int, *, sealed: bool
) -> tuple[bytes, list[bytes]]:
    """A new group of alice and bob with ``count`` messages from alice: its id and their texts."""
    proof = new_group(ALICE.signing_key, os.urandom(16))
    chat = proof.chat_id()
    ops: list[Op] = [
        alice.membership_op(
            ALICE.signing_key, chat, user, MembershipAction.ADD, Role.ADMIN, proof=proof
        )
        for user in (ALICE.user_id, BOB.user_id)
    ]
    texts = [os.urandom(payload) for _ in range(count)]
    epoch = new_epoch(frozenset({ALICE.user_id, BOB.user_id}), alice.now())
    if sealed:
        box_keys = {ALICE.user_id: ALICE.box_key, BOB.user_id: BOB.box_key}
        ops += [
            MsgV1.create(ALICE.signing_key, chat, alice.now(), grants, kind=MessageKind.KEYS)
            for grants in seal_epoch(ALICE, epoch, box_keys)
        ]
    for text in texts:
        hlc = alice.now()
        body = text
        if sealed:
            key = message_key(epoch.key, chat, ALICE.user_id, hlc)
            body = seal_group(key, epoch.key_id, chat, ALICE.user_id, hlc, text)
        ops.append(MsgV1.create(ALICE.signing_key, chat, hlc, body))
    for at in range(0, len(ops), POST_BATCH):
        if not all(alice.post_ops(ops[at : at + POST_BATCH])):
            raise RuntimeError("the node did not take the bench's ops as new (a reused data dir?)")
    return chat, texts


def _ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000
