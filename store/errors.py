"""The store's exception families.

Two families, because the caller reacts differently to each:

* ``ValueError`` subclasses raised for *local misuse* (a wrong-length id handed
  to a key builder by our own code) — a bug to fix, never caught in a loop.
* ``InvalidInput`` and its children for bytes or ops that came from *outside*
  (a peer, a client, a file). These carry a short machine-readable ``reason``
  so a session can end with it and a metric can count it. Nothing is written
  when one is raised.

The families do not overlap: ``InvalidInput`` is not a ``ValueError``, so an
``except ValueError`` around our own code never swallows a hostile input, and an
``except InvalidInput`` never hides a bug.
"""

from __future__ import annotations


class ChatsyncError(Exception):
    """Base of every exception this project raises on purpose."""


class StoreLocked(ChatsyncError):
    """Another process (or another ``ChatDb`` in this one) has the database open: RocksDB's
    LOCK file is held."""


class InvalidInput(ChatsyncError):
    """Input from outside the process was rejected; ``reason`` says why."""

    reason: str = "invalid"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class DecodeError(InvalidInput):
    """Bytes that are not a valid record (truncated, wrong type, version, oversize, ...)."""

    reason = "decode"


class TooLarge(InvalidInput):
    """A payload, blob or frame over its configured limit."""

    reason = "too_large"


class ClockDriftError(InvalidInput):
    """A remote HLC stamp too far ahead of local physical time."""

    reason = "clock_drift"


class BadSignature(InvalidInput):
    """A signature that does not verify, or an author id that does not match its key."""

    reason = "bad_signature"


def shown(value: object, limit: int = 60) -> str:
    """A value from outside, for an error message: ``repr`` cut to ``limit`` characters.

    Never raises: ``repr`` of an integer over 4,300 digits (a CBOR bignum from a peer) raises
    ValueError (``sys.get_int_max_str_digits``), and of deeply nested arrays RecursionError;
    either would escape as a crash instead of the decoder's own error.
    """
    try:
        text = repr(value)
    except Exception:  # whatever a peer's value does to repr, the message must still be made
        bits = value.bit_length() if isinstance(value, int) else 0
        return f"<{bits}-bit integer>" if bits else f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
