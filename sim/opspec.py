"""A planned op: what the generator's plan decides, before the signing phase builds it."""

from __future__ import annotations

from dataclasses import dataclass

from store.records import MessageKind


@dataclass
class OpSpec:
    """One op to sign: everything but the signature, including its HLC stamp."""

    index: int
    t_ms: int
    node: int
    kind: str
    author: int  # user index whose key signs (the actor, for membership ops)
    chat: int = -1
    target: int = -1  # the member a membership op is about
    role: int = 0
    hlc: int = 0  # packed
    msg_kind: int = int(MessageKind.NEW)
    ref: bytes | None = None  # the referenced message's id (resolved when planned)
    payload: bytes | None = None  # a public payload (delete claims, reaction, receipt)
    box: int = 0  # identity: which box key version
    creator: int = -1  # the chat's creator (its id commits to the creator's key)
    granted: bool = False  # the actor acts as an admin the creator granted
