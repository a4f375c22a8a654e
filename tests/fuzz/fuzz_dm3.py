"""Fuzz target ``dm3``: what a dm3 client sends a node, decoded and checked as the gateway does.

On the same bytes:

* ``rpc.parse_request`` — the JSON-RPC request of ``POST /rpc``;
* ``parse_envelope`` of the bytes as text, then ``open_delivery_information`` with the
  service's key and ``check_sender`` with the sender's — ``dm3_submitMessage``'s envelope;
* ``unwrap`` — a kept envelope read back from an inbox (any member may post there);
* ``open_envelope`` — what the recipient's side (``chatsync dm3 inbox``) opens;
* ``open_containers`` — an export (``chatsync import``): the bytes as the plaintext of the
  root container, and of the one chunk of an otherwise valid export, each sealed with the
  user's storage key (random ciphertext would never open: the fuzzer works behind the seal).

Property: only ``RpcError``, ``EnvelopeError``, ``Dm3CryptoError`` and ``ContainerError`` are
raised; a request
parsed has a string method and list params; an unwrapped envelope re-wraps to the same value.
"""

from __future__ import annotations

import contextlib
import json

from fuzz_support import instrumented, main

with instrumented(__name__ == "__main__"):
    from nacl.signing import SigningKey

    from dm3 import containers, rpc
    from dm3.crypto import (
        Dm3CryptoError,
        decrypt,
        encrypt,
        encryption_keys,
        storage_key,
        stringify,
    )
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
    from store.authz import new_group
    from store.hlc import Hlc
    from store.ops import MembershipAction, MembershipOp
    from store.records import MsgV1
    from store.signing import user_id_from_key

TARGET = "dm3"
SENDER, RECIPIENT, SERVICE = (SigningKey(bytes([i]) * 32) for i in (0x31, 0x32, 0x33))
REFUSALS = (rpc.RpcError, EnvelopeError, Dm3CryptoError, containers.ContainerError)
STORAGE_KEY = storage_key(SENDER)


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


GROUP = new_group(SENDER, b"fuzz-dm3-export!")


def _export() -> dict[str, bytes]:
    """A small valid export of SENDER's (one group: an add, a message), zero nonces."""
    user, chat = user_id_from_key(bytes(SENDER.verify_key)), GROUP.chat_id()
    add = MembershipOp.create(SENDER, chat, user, MembershipAction.ADD, Hlc(1_000), proof=GROUP)
    post = MsgV1.create(SENDER, chat, Hlc(1_001), b"kept")
    history = containers.History(user, None, {chat: [add, post]})
    return containers.build_containers(SENDER, history, bytes)


EXPORT = _export()
ROOT_KEY = containers.root_key(SENDER)
ROOT = containers.file_name(ROOT_KEY)
CONVERSATION = containers.conversation_key(ROOT_KEY, GROUP.chat_id())
CHUNK = containers.file_name(containers.chunk_key(CONVERSATION, {"id": 0, "timestamp": 1_000}))


def _sealed(plaintext: bytes) -> bytes:
    return stringify(encrypt(STORAGE_KEY, plaintext.decode(errors="replace"), bytes(12))).encode()


def _root_plaintext(data: bytes) -> None:
    containers.open_containers({**EXPORT, ROOT: _sealed(data)}, SENDER)


def _chunk_plaintext(data: bytes) -> None:
    containers.open_containers({**EXPORT, CHUNK: _sealed(data)}, SENDER)


CHECKS = [_request, _submission, _kept, _opened, _root_plaintext, _chunk_plaintext]


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
        "export-root": _plaintext(ROOT),
        "export-chunk": _plaintext(CHUNK),
        "request": stringify(call).encode(),
        "envelope": stringify(envelope).encode(),
        "postmarked": stringify(postmarked).encode(),
        "kept": wrap(Delivered(postmarked, info, 5)),
    }


def _plaintext(name: str) -> bytes:
    return decrypt(STORAGE_KEY, json.loads(EXPORT[name])).encode()


if __name__ == "__main__":
    main(TARGET, one_input, seeds)
