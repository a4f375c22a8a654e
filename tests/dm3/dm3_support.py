"""Envelopes built as ``@dm3-org/dm3-lib-messaging`` 1.7.1 builds them (``buildEnvelop``), in
Python, for the tests that need many, hostile ones among them. The Node.js interop test
(tests/interop/dm3) builds them with the real library."""

from __future__ import annotations

import os
from typing import Any

from nacl.signing import SigningKey

from dm3.crypto import encrypt_for, encryption_keys, sha256_hex, sign_text, stringify
from dm3.names import name_of
from store.signing import user_id_from_key


def dm3_name(key: SigningKey) -> str:
    return name_of(user_id_from_key(bytes(key.verify_key)))


def message(
    sender: SigningKey, to: str, text: str, timestamp: int = 1_700_000_000_000
) -> dict[str, Any]:
    unsigned = {
        "message": text,
        "metadata": {"type": "NEW", "to": to, "from": dm3_name(sender), "timestamp": timestamp},
    }
    return {**unsigned, "signature": sign_text(sender, stringify(unsigned))}


def envelope(
    sender: SigningKey,
    recipient: SigningKey,
    service_box_key: bytes,
    text: str = "hello",
    *,
    info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A signed envelope from ``sender`` to ``recipient`` via the service with that box key."""
    to = dm3_name(recipient)
    sealed_message = stringify(
        encrypt_for(
            encryption_keys(recipient).public, stringify(message(sender, to, text)),
            os.urandom(32), os.urandom(12),
        )
    )  # fmt: skip
    delivery = info if info is not None else {"to": to, "from": dm3_name(sender)}
    metadata = {
        "encryptionScheme": "x25519-chacha20-poly1305",
        "deliveryInformation": stringify(
            encrypt_for(service_box_key, stringify(delivery), os.urandom(32), os.urandom(12))
        ),
        "encryptedMessageHash": sha256_hex(stringify(sealed_message)),
        "version": "v1",
    }
    return {
        "message": sealed_message,
        "metadata": {**metadata, "signature": sign_text(sender, stringify(metadata))},
    }


def submit_call(env: dict[str, Any], token: str, request_id: int = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0", "id": request_id, "method": "dm3_submitMessage",
        "params": [stringify(env), token],
    }  # fmt: skip
