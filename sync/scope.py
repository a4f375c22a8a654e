"""What a replica holds and a session reconciles: a scope. Pure.

Every tree, bucket listing and record fetch of the ``Replica`` interface is asked for a
scope, and every session runs over one (``SyncConfig.scope``). Today there is one:
``EVERYTHING`` — every chat, every domain — and a replica serves it alone. Partial
replication (a node that holds the chats its users are in) is then an adapter over the
same interface, in the way negentropy scopes its storage by filter: trees per scope,
listings and records filtered to it, a session over the intersection of two scopes —
not a rewrite of the protocol or of the replicas.
"""

from __future__ import annotations

from dataclasses import dataclass

from sync.errors import LocalProtocolError


@dataclass(frozen=True, slots=True)
class Scope:
    """A set of chats (``None``: every chat). Member ops, deletes and messages follow their
    chat; identities are held by every scope (the rules need the authors')."""

    chats: frozenset[bytes] | None = None

    def holds(self, chat_id: bytes) -> bool:
        return self.chats is None or chat_id in self.chats

    def covers(self, other: Scope) -> bool:
        if self.chats is None:
            return True
        return other.chats is not None and other.chats <= self.chats

    def __and__(self, other: Scope) -> Scope:
        if self.chats is None:
            return other
        if other.chats is None:
            return self
        return Scope(self.chats & other.chats)


EVERYTHING = Scope()


class ScopeNotServed(LocalProtocolError):
    """A replica asked for a scope it keeps no trees for (today: anything but EVERYTHING)."""


def require_everything(scope: Scope) -> None:
    """What a replica that holds everything, in one tree per domain, can serve."""
    if scope != EVERYTHING:
        raise ScopeNotServed(f"this replica keeps trees for every chat only, not for {scope}")
