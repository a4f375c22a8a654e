"""Sync errors: whose fault it was decides the family.

``RemoteProtocolError`` — the peer sent something invalid or unexpected; the
session is over, ``reason`` says why (for logs, metrics and the ABORT frame).
``LocalProtocolError`` — our own code drove the session wrongly (a bug).
"""

from __future__ import annotations

from store.errors import ChatsyncError, InvalidInput


class RemoteProtocolError(InvalidInput):
    reason = "protocol"


class LocalProtocolError(ChatsyncError, RuntimeError):
    """The session was used out of order by its driver."""
