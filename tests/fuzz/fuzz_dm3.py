"""Fuzz target ``dm3``: what a dm3 client sends a node, decoded and checked as the gateway does.

On the same bytes:

* ``rpc.parse_request`` — the JSON-RPC request of ``POST /rpc``;
* ``parse_envelope`` of the bytes as text, then ``open_delivery_information`` with the
  service's key and ``check_sender`` with the sender's — ``dm3_submitMessage``'s envelope;
* ``unwrap`` — a kept envelope read back from an inbox (any member may post there);
* ``open_envelope`` — what the recipient's side (``chatsync dm3 inbox``) opens.

Property: only ``RpcError``, ``EnvelopeError`` and ``Dm3CryptoError`` are raised; a request
parsed has a string method and list params; an unwrapped envelope re-wraps to the same value.
"""

from __future__ import annotations

import contextlib

from fuzz_support import instrumented, main

with instrumented(__name__ == "__main__"):
    from nacl.signing import SigningKey

    from dm3 import rpc
    from dm3.crypto import Dm3CryptoError, encryption_keys, stringify
    from dm3.envelope import (
        Delivered,
        EnvelopeError,
        add_postmark,
        build_envelope,
        check_sender,
        open_delivery_information,
        open_envelope,
        parse_envelope,
        sign_message,
        unwrap,
        wrap,
    )
    from dm3.names import name_of
    from store.signing import user_id_from_key

TARGET = "dm3"
SENDER, RECIPIENT, SERVICE = (SigningKey(bytes([i]) * 32) for i in (0x31, 0x32, 0x33))
REFUSALS = (rpc.RpcError, EnvelopeError, Dm3CryptoError)


def _name(key: SigningKey) -> str:
    return name_of(user_id_from_key(bytes(key.verify_key)))


def _request(data: bytes) -> None:
    call = rpc.parse_request(data)
    if not isinstance(call.method, str) or not isinstance(call.params, list):
        raise AssertionError("a parsed request without a method or params")


def _submission(data: bytes) -> None:
    envelope = parse_envelope(data.decode(errors="replace"))
    open_delivery_information(encryption_keys(SERVICE), envelope)
    check_sender(envelope, bytes(SENDER.verify_key))


def _kept(data: bytes) -> None:
    kept = unwrap(data)
    if kept is not None and unwrap(wrap(kept)) != kept:
        raise AssertionError("a kept envelope re-wraps differently")


def _opened(data: bytes) -> None:
    envelope = parse_envelope(data.decode(errors="replace"))
    open_envelope(encryption_keys(RECIPIENT), envelope)


CHECKS = [_request, _submission, _kept, _opened]


def one_input(data: bytes) -> None:
    for check in CHECKS:
        with contextlib.suppress(*REFUSALS):
            check(data)


def seeds() -> dict[str, bytes]:
    message = sign_message(SENDER, _name(SENDER), _name(RECIPIENT), "gm", 1_700_000_000_000)
    envelope = build_envelope(
        SENDER, message, encryption_keys(RECIPIENT).public, encryption_keys(SERVICE).public,
        bytes(range(88)),
    )  # fmt: skip
    postmarked = add_postmark(envelope, SERVICE, encryption_keys(RECIPIENT).public, 5, bytes(44))
    info = open_delivery_information(encryption_keys(SERVICE), envelope)
    call = {"jsonrpc": "2.0", "id": 1, "method": "dm3_submitMessage",
            "params": [stringify(envelope), "token"]}  # fmt: skip
    return {
        "request": stringify(call).encode(),
        "envelope": stringify(envelope).encode(),
        "postmarked": stringify(postmarked).encode(),
        "kept": wrap(Delivered(postmarked, info, 5)),
    }


if __name__ == "__main__":
    main(TARGET, one_input, seeds)
