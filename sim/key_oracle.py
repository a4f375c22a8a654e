"""The oracle's count of who can read which group message (issue 34), per chat.

Written from the rules, not from the generator's senders (``sim.sender_keys``): from a
chat's valid member ops and its valid messages alone,

* a user is a **member at t** iff their greatest add stamp <= t beats their greatest
  remove or leave stamp <= t (a tie goes to the remove);
* the **grants** are those of every KEYS message a replica holds — its sender added at or
  before its stamp; shown (a member then) or hidden (not), a reader takes both: an epoch
  grant gives its recipients every message of that sender sealed under its key id; a
  message grant gives one user one message (key id and stamp) when its signer is that
  message's sender or holds the epoch (a hand-over: a recipient of the sender's epoch
  grant; anyone else's is worthless);
* per **group message** (NEW, REPLY, EDIT) whose sender is a member at its stamp, and per
  user with a member op in the chat: it *should* read it iff a member at its stamp and a
  member now (the issue's promise is to current members; a removed user reads nothing of
  the chat, and no client grants it anything), it *can* iff it holds a grant covering it. ``undecryptable_for_member`` counts the pairs that should
  and cannot; ``readable_by_removed`` those that can, are no member at its stamp, and whose
  removal that decides it (their latest stamped at or before it) its sender had seen when it
  sent (the message's ``removed_seen``; a removal concurrent with the message may leave the
  removed member a key).

Grants count at any age: a client keeps the keys it read (SIM.md, "Group keys").
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass

from sim.group_payloads import Grants, read_group_message, read_keys

NEW, EDIT, REPLY, KEYS = 0, 1, 2, 6  # MsgV1's kind byte
SEALED_KINDS = (NEW, EDIT, REPLY)
KINDS = (*SEALED_KINDS, KEYS)
NOW = (1 << 64) - 1  # after every stamp: a member's state at the end

# One row of a chat: a member op (True, user, hlc, is_add, None) or a message
# (False, sender, hlc, kind, payload).
Row = tuple[bool, bytes, int, int, bytes | None]


@dataclass
class KeyCounts:
    group_messages: int = 0  # sealed messages whose sender was a member at their stamp
    keys_messages: int = 0  # KEYS messages shown (sender a member at their stamp)
    hidden_keys_messages: int = 0  # KEYS messages held but hidden (read all the same)
    undecryptable_for_member: int = 0
    readable_by_removed: int = 0

    def add(self, other: KeyCounts) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class _Members:
    def __init__(self, ops: Iterable[tuple[bytes, int, bool]]) -> None:
        adds: dict[bytes, list[int]] = {}
        removes: dict[bytes, list[int]] = {}
        for user, hlc, is_add in ops:
            (adds if is_add else removes).setdefault(user, []).append(hlc)
            adds.setdefault(user, [])
        self.users = sorted(adds)
        self.adds = {u: sorted(s) for u, s in adds.items()}
        self.removes = {u: sorted(s) for u, s in removes.items()}

    def last_removal(self, user: bytes, hlc: int) -> int | None:
        removes = self.removes.get(user, [])
        r = bisect_right(removes, hlc)
        return removes[r - 1] if r else None

    def held(self, user: bytes, hlc: int) -> bool:
        """Whether a replica holds a message of ``user`` stamped ``hlc``: added at or before."""
        adds = self.adds.get(user, [])
        return bool(adds) and adds[0] <= hlc

    def at(self, user: bytes, hlc: int) -> bool:
        adds = self.adds.get(user, [])
        a = bisect_right(adds, hlc)
        if a == 0:
            return False
        removes = self.removes.get(user, [])
        r = bisect_right(removes, hlc)
        return r == 0 or removes[r - 1] < adds[a - 1]


class _Grants:
    def __init__(self) -> None:
        self.epochs: dict[tuple[bytes, bytes], set[bytes]] = {}  # (sender, key id) -> holders
        self.singles: dict[tuple[bytes, bytes, int], set[bytes]] = {}  # (key, user, hlc) -> by

    def learn(self, signer: bytes, grants: Grants) -> None:
        for key_id, recipients in grants.epochs:
            self.epochs.setdefault((signer, key_id), set()).update(recipients)
        for key_id, user, at in grants.messages:
            self.singles.setdefault((key_id, user, at), set()).add(signer)

    def holders(self, sender: bytes, key_id: bytes) -> set[bytes]:
        return self.epochs.get((sender, key_id), set())

    def covers(
        self, sender: bytes, key_id: bytes, reader: bytes, hlc: int, held: set[bytes]
    ) -> bool:
        """``held``: who holds the epoch (a hand-over from one of them counts)."""
        if reader in self.holders(sender, key_id):
            return True
        signers = self.singles.get((key_id, reader, hlc), set())
        return sender in signers or bool(signers & held)


def count_keys(rows: Iterable[Row]) -> KeyCounts:
    rows = list(rows)
    members = _Members((user, hlc, bool(kind)) for is_op, user, hlc, kind, _ in rows if is_op)
    granted = _Grants()
    out = KeyCounts()
    for is_op, sender, hlc, kind, payload in rows:
        grants = None if is_op or kind != KEYS or payload is None else read_keys(payload)
        if grants is None or not members.held(sender, hlc):
            continue
        if members.at(sender, hlc):
            out.keys_messages += 1
        else:
            out.hidden_keys_messages += 1
        granted.learn(sender, grants)
    for is_op, sender, hlc, kind, payload in rows:
        if is_op or kind not in SEALED_KINDS or payload is None or not members.at(sender, hlc):
            continue
        sealed = read_group_message(payload)
        if sealed is None:
            continue  # not sealed (a recorded trace's payload): nothing to count
        out.group_messages += 1
        held = granted.holders(sender, sealed.key_id)
        for reader in members.users:
            then = members.at(reader, hlc)
            can = granted.covers(sender, sealed.key_id, reader, hlc, held)
            out.undecryptable_for_member += then and members.at(reader, NOW) and not can
            if can and not then:
                seen = sealed.removed_seen.get(reader)
                out.readable_by_removed += seen is not None and seen == members.last_removal(
                    reader, hlc
                )
    return out
