"""A signature worker process (``node/verify.py`` starts them): reads batches of messages'
signature parts on stdin, answers per message why its signature is refused (None: it
verifies) on stdout; exits when stdin closes.

Frames on both pipes: a 4-byte big-endian length, then a pickle. Only the node that started
the process writes to it, so unpickling trusts no one else.
"""

from __future__ import annotations

import pickle
import signal
import sys
from typing import IO, cast

from store.errors import BadSignature
from store.records import SignatureParts, check_signature

LENGTH_BYTES = 4


def check_signatures(parts: list[SignatureParts]) -> list[str | None]:
    """Per message, why its signature is refused (None: it verifies)."""
    out: list[str | None] = []
    for item in parts:
        try:
            check_signature(*item)
            out.append(None)
        except BadSignature as exc:
            out.append(str(exc))
    return out


def write_frame(pipe: IO[bytes], value: object) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(len(data).to_bytes(LENGTH_BYTES, "big") + data)
    pipe.flush()


def read_frame(pipe: IO[bytes]) -> object:
    """The next value; EOFError once the other side has closed the pipe."""
    head = pipe.read(LENGTH_BYTES)
    if len(head) < LENGTH_BYTES:
        raise EOFError("pipe closed")
    size = int.from_bytes(head, "big")
    data = pipe.read(size)
    if len(data) < size:
        raise EOFError("pipe closed mid-frame")
    return pickle.loads(data)


def main() -> None:
    # Ctrl-C reaches the whole process group: the node stops, then closes our stdin
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            parts = read_frame(sys.stdin.buffer)
        except EOFError:
            return
        write_frame(sys.stdout.buffer, check_signatures(cast(list[SignatureParts], parts)))


if __name__ == "__main__":
    main()
