"""Where py-libp2p's, multiaddr's and trio's exceptions become ours (``node/errors.py``), once.

httpcore's ``map_exceptions`` model: every call into py-libp2p that can fail because of a
peer runs under one of the context managers here, in this package only; above it, code
catches ``StreamClosed`` / ``StreamReset`` / ``FrameTooLarge`` and ``PeerUnreachable`` /
``DialFailed`` / ``ProtocolNotSupported``, and anything else is a bug that propagates.
Errors are told apart by their types (and py-libp2p's ``raise ... from``), never by their
messages.

py-libp2p 0.8.1 facts behind the table:

* streams raise its ``BaseLibp2pError`` family (``StreamReset``, ``StreamEOF``, the muxer's
  ``MuxedStreamReset`` / ``MuxedStreamEOF``, msgio's ``MessageTooLarge``...), ``OSError``
  and ``EOFError`` from sockets, and trio's broken/closed resource errors;
* ``BasicHost.new_stream`` raises ``StreamFailure`` from the ``MultiselectClientError`` of
  the negotiation. When the peer answered and refused every protocol the latter is raised
  fresh (no cause of its own); a read or write that failed mid-negotiation is chained
  (``from error``): the peer went away;
* ``connect`` raises ``SwarmException`` (all dials failed), the transport's
  ``OpenConnectionError`` / ``UpgradeFailure`` and ``OSError``;
* ``Multiaddr(text)`` raises multiaddr's own errors (``ValueError`` subclasses), and
  ``info_from_p2p_addr`` ``InvalidAddrError`` (a ``ValueError``) for an address without
  ``/p2p/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import trio
from libp2p.exceptions import BaseLibp2pError
from libp2p.host.exceptions import StreamFailure
from libp2p.io.exceptions import MessageTooLarge
from libp2p.network.stream.exceptions import StreamReset as Libp2pStreamReset
from libp2p.protocol_muxer.exceptions import MultiselectClientError
from libp2p.stream_muxer.exceptions import MuxedStreamReset

from node.errors import (
    TRIO_STREAM_ERRORS,
    DialFailed,
    FrameTooLarge,
    InvalidAddress,
    PeerUnreachable,
    ProtocolNotSupported,
    StreamClosed,
    StreamReset,
    map_exceptions,
)

# What py-libp2p raises when a peer, its connection or its stream is gone.
LIBP2P_ERRORS: tuple[type[BaseException], ...] = (
    BaseLibp2pError,
    OSError,
    EOFError,
    *TRIO_STREAM_ERRORS,
)
RESETS = (Libp2pStreamReset, MuxedStreamReset)
# what a dial or a stream open may raise, our deadline included
UNREACHABLE: tuple[type[BaseException], ...] = (*LIBP2P_ERRORS, trio.TooSlowError)


def stream_errors() -> AbstractContextManager[None]:
    """Around a read or write of a stream: a reset is ``StreamReset``, a frame announced over
    the limit ``FrameTooLarge``, any other end ``StreamClosed``."""
    return map_exceptions(
        {MessageTooLarge: FrameTooLarge, RESETS: StreamReset, LIBP2P_ERRORS: StreamClosed}
    )


def dial_errors() -> AbstractContextManager[None]:
    """Around a dial: whatever stopped it, and our timeout, are ``DialFailed``."""
    return map_exceptions({UNREACHABLE: DialFailed})


@contextmanager
def open_errors() -> Iterator[None]:
    """Around opening a stream: ``ProtocolNotSupported`` when the peer answered and refused
    every protocol, ``DialFailed`` when it could not be reached, else ``PeerUnreachable``."""
    try:
        yield
    except StreamFailure as exc:
        cause = exc.__cause__
        refused = isinstance(cause, MultiselectClientError) and cause.__cause__ is None
        ours = ProtocolNotSupported if refused else PeerUnreachable
        raise ours(f"{type(exc).__name__}: {exc}") from exc
    except UNREACHABLE as exc:
        raise PeerUnreachable(f"{type(exc).__name__}: {exc}") from exc


def address_errors() -> AbstractContextManager[None]:
    """Around parsing an address we were given: ``InvalidAddress`` (local misuse)."""
    return map_exceptions({(ValueError, BaseLibp2pError): InvalidAddress})
