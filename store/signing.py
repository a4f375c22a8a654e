"""Authorship: ed25519 keys (pynacl), user ids derived from them, domain-separated signatures.

A user id is the first 20 bytes of BLAKE3(verify key), so an id cannot be
claimed without the key behind it. Every signature covers a domain tag plus the
canonical body, so a signature made for one record kind never verifies as another.
"""

from __future__ import annotations

import blake3
from nacl.exceptions import BadSignatureError as _NaclBadSignature
from nacl.signing import SigningKey, VerifyKey

from store.errors import BadSignature
from store.keys import USER_ID_LEN

PUBLIC_KEY_LEN = 32
SIGNATURE_LEN = 64


def user_id_from_key(verify_key: bytes) -> bytes:
    if len(verify_key) != PUBLIC_KEY_LEN:
        raise ValueError(
            f"ed25519 public key must be {PUBLIC_KEY_LEN} bytes, got {len(verify_key)}"
        )
    return blake3.blake3(verify_key).digest()[:USER_ID_LEN]


def generate_key() -> SigningKey:
    return SigningKey.generate()


def key_from_seed(seed: bytes) -> SigningKey:
    """A deterministic key (tests, simulator): seed must be 32 bytes."""
    return SigningKey(seed)


def public_key(key: SigningKey) -> bytes:
    return bytes(key.verify_key)


def sign(key: SigningKey, domain: bytes, body: bytes) -> bytes:
    return key.sign(domain + body).signature


def verify(author_key: bytes, domain: bytes, body: bytes, signature: bytes) -> None:
    """Raise BadSignature unless ``signature`` is ``author_key``'s over domain + body."""
    try:
        VerifyKey(author_key).verify(domain + body, signature)
    except (_NaclBadSignature, ValueError, TypeError) as exc:
        raise BadSignature(f"signature does not verify: {exc}") from None
