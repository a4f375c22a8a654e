"""What goes wrong at the node's I/O edges, as our exceptions, and where library exceptions become them.

httpcore's pattern: each edge runs its library calls under ``map_exceptions`` (library
exception → ours); above the edge only our exceptions are caught, and anything else
is a bug that propagates. The node's exceptions:

* ``StreamClosed`` — a peer's stream ended, was reset or broke (``node/framing.py``: libp2p
  and trio streams); ``FrameTooLarge``, one of them, when the peer announced a frame over
  the size limit;
* ``PeerUnreachable`` — dialling a peer or opening a stream to it failed (``node/peers.py``,
  ``node/node.py``);
* ``StorageFull`` (``node/limits.py``), ``WriteFailed`` (``node/writer.py``) and the store's
  ``InvalidInput`` family for the rest.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import trio

from store.errors import ChatsyncError

ExceptionTypes = type[BaseException] | tuple[type[BaseException], ...]

TRIO_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError)


class StreamClosed(ChatsyncError):
    """The peer closed or reset the stream, or sent a frame over the size limit."""


class FrameTooLarge(StreamClosed):
    """The peer announced a frame over the size limit: the stream is dropped unread (a
    hostile peer's doing — an honest one knows the limit)."""


class PeerUnreachable(ChatsyncError):
    """A dial or a new stream to a peer failed (refused, timed out, negotiation failed)."""


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


def dialling() -> AbstractContextManager[None]:
    """Around a dial or a new stream: libp2p's failures and a timeout become PeerUnreachable."""
    return map_exceptions({(*libp2p_errors(), trio.TooSlowError): PeerUnreachable})


@functools.cache
def libp2p_errors() -> tuple[type[BaseException], ...]:
    """What py-libp2p raises when a peer or its stream is gone: its own exception family
    (stream reset, EOF, msgio, multiselect, swarm, ...), OS errors of its sockets, and
    trio's broken or closed resources. Imported on first use: libp2p loads slowly."""
    from libp2p.exceptions import BaseLibp2pError

    return (BaseLibp2pError, OSError, EOFError, *TRIO_STREAM_ERRORS)
