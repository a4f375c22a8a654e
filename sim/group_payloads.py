"""The simulator's stand-ins for end-to-end encrypted group payloads (SIM.md, "Group keys").

No cryptography: what the oracle needs to count who can read what, in canonical CBOR.
The node never reads a payload, so the store path is the one real ciphertexts take.

* a **group message** (NEW, REPLY, EDIT): ``[key_id, removed_seen, filler]`` — the epoch
  its sender sealed it under, and ``[user, packed hlc]`` for each user who was no member in
  the sender's view when it sent, with the stamp of the latest removal of theirs it had seen
  (what ``readable_by_removed`` asks about);
* a **KEYS** message: ``[epoch grants, message grants]`` — ``[key_id, [recipients]]`` per
  epoch, ``[key_id, user, packed hlc]`` per message key given to one user (a sender's own
  messages: the sender is the KEYS message's signer).

The generator writes them (``sim.sender_keys``), the oracle reads them (``sim.key_oracle``).
A payload of another shape (a recorded trace's) reads as None.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import cbor2

from store.records import canonical_cbor

EpochGrant = tuple[bytes, frozenset[bytes]]  # (key id, recipients)
MessageGrant = tuple[bytes, bytes, int]  # (key id, user, packed hlc of the sender's message)


@dataclass(frozen=True)
class Sealed:
    key_id: bytes
    removed_seen: dict[bytes, int]  # user -> the stamp of their latest removal the sender saw


@dataclass(frozen=True)
class Grants:
    epochs: tuple[EpochGrant, ...]
    messages: tuple[MessageGrant, ...]


def group_message(key_id: bytes, removed_seen: Iterable[tuple[bytes, int]], filler: bytes) -> bytes:
    return canonical_cbor([key_id, [list(seen) for seen in sorted(removed_seen)], filler])


def plain_message(filler: bytes) -> bytes:
    """A post no client sealed (its sender, as it knew, was no member: a client sends none;
    the workload keeps it for the node's rules): text to CBOR, so never read as sealed."""
    return b"plain " + filler


def keys_message(epochs: Iterable[EpochGrant], messages: Iterable[MessageGrant]) -> bytes:
    return canonical_cbor(
        [
            [[key_id, sorted(recipients)] for key_id, recipients in sorted(epochs)],
            [list(grant) for grant in sorted(messages)],
        ]
    )


def _load(payload: bytes) -> object:
    try:
        return cbor2.loads(payload)
    except Exception:  # any bytes at all: a payload of another shape is simply not ours
        return None


def _users(value: object) -> frozenset[bytes] | None:
    if type(value) is not list or not all(type(u) is bytes for u in value):
        return None
    return frozenset(value)


def read_group_message(payload: bytes) -> Sealed | None:
    v = _load(payload)
    if type(v) is not list or len(v) != 3 or type(v[0]) is not bytes or type(v[1]) is not list:
        return None
    seen = {}
    for row in v[1]:
        if type(row) is not list or [type(x) for x in row] != [bytes, int]:
            return None
        seen[row[0]] = row[1]
    return Sealed(v[0], seen)


def read_keys(payload: bytes) -> Grants | None:
    v = _load(payload)
    if type(v) is not list or len(v) != 2 or type(v[0]) is not list or type(v[1]) is not list:
        return None
    epochs: list[EpochGrant] = []
    for row in v[0]:
        users = _users(row[1]) if type(row) is list and len(row) == 2 else None
        if users is None or type(row[0]) is not bytes:
            return None
        epochs.append((row[0], users))
    messages: list[MessageGrant] = []
    for row in v[1]:
        if type(row) is not list or len(row) != 3 or [type(x) for x in row] != [bytes, bytes, int]:
            return None
        messages.append((row[0], row[1], row[2]))
    return Grants(tuple(epochs), tuple(messages))
