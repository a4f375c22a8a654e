"""What goes wrong at the node's I/O edges, as our exceptions, and where library exceptions become them.

httpcore's pattern: each edge runs its library calls under ``map_exceptions`` (library
exception → ours); above the edge only our exceptions are caught, and anything else
is a bug that propagates. Only the edges import their libraries: what py-libp2p, multiaddr
and trio's streams raise is mapped in ``node/p2p/errors.py``; this module imports none of
them, so code above the edge (and the in-process replay) catches ours without loading them. The node's exceptions:

* ``StreamClosed`` — a peer's stream ended, was reset or broke (``node/framing.py``: trio
  streams; ``node/p2p``: libp2p streams); ``StreamReset``, one of them, when the peer (or its
  connection) reset it; ``FrameTooLarge``, one of them, when the peer announced a frame
  over the size limit;
* ``PeerUnreachable`` — dialling a peer or opening a stream to it failed; ``DialFailed``
  when no connection could be made (refused, timed out, handshake failed),
  ``ProtocolNotSupported`` when the peer answered but agreed to none of our protocols;
* ``InvalidAddress`` — an address we were given (configuration) does not parse;
* ``StartupRefused`` — the node will not start: a flag or config value is malformed, a port
  (``PortInUse``) or the data directory is taken. Its message is the one line
  ``chatsync node run`` prints;
* ``StorageFull`` (``node/limits.py``), ``WriteFailed`` (``node/writer.py``) and the store's
  ``InvalidInput`` family for the rest.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio

from store.errors import ChatsyncError

ExceptionTypes = type[BaseException] | tuple[type[BaseException], ...]

TRIO_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError)


class StreamClosed(ChatsyncError):
    """The peer closed or reset the stream, or sent a frame over the size limit."""


class FrameTooLarge(StreamClosed):
    """The peer announced a frame over the size limit: the stream is dropped unread (a
    hostile peer's doing — an honest one knows the limit)."""


class StreamReset(StreamClosed):
    """The peer, or its connection going away, reset the stream."""


class PeerUnreachable(ChatsyncError):
    """A dial or a new stream to a peer failed (refused, timed out, negotiation failed)."""


class DialFailed(PeerUnreachable):
    """No connection to the peer: refused, timed out, or its handshake failed."""


class ProtocolNotSupported(PeerUnreachable):
    """The peer answered the protocol negotiation but agreed to none of our protocols."""


class InvalidAddress(ChatsyncError, ValueError):
    """An address we were given (listen, bootstrap) does not parse: local misuse."""


class StartupRefused(ChatsyncError):
    """The node will not start (config loading, or ``Node.run`` before it reports started).
    The message is one line naming the flag or resource; the CLI prints it, no traceback."""


class PortInUse(StartupRefused):
    """The libp2p or HTTP port is taken (a type of its own: trio's ``nursery.start``
    re-raises ``from None``, so the OSError behind it does not travel with it)."""


@contextmanager
def map_exceptions(mapping: dict[ExceptionTypes, type[ChatsyncError]]) -> Iterator[None]:
    """Raise ours for the library exceptions in ``mapping`` (the original as the cause)."""
    try:
        yield
    except Exception as exc:  # re-raised: mapped if listed, as it is otherwise
        for library_errors, ours in mapping.items():
            if isinstance(exc, library_errors):
                raise ours(f"{type(exc).__name__}: {exc}") from exc
        raise
