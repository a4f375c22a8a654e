"""dm3's cryptography, byte for byte as ``@dm3-org/dm3-lib-crypto`` 1.7.1 does it. Pure.

* **Symmetric** (``encrypt`` / ``decrypt``): the payload's UTF-8 bytes are padded to a multiple
  of 2,048 bytes (libsodium's ISO/IEC 7816-4 ``sodium_pad``) and sealed with
  ChaCha20-Poly1305 (IETF, 12-byte nonce, no associated data). The result is
  ``{"ciphertext": base64, "nonce": "0x" + hex}`` — the storage containers use it.
* **Asymmetric** (``encrypt_for`` / ``decrypt_from``, dm3's x25519-chacha20-poly1305): a fresh
  x25519 key pair and libsodium's ``crypto_kx`` give the sender a session key (client side, its
  ``tx``) that the holder of the recipient's key derives too (server side, its ``rx``); the
  payload is then sealed as above and ``ephemPublicKey`` added.
* **Signatures** are libsodium ed25519 over the UTF-8 bytes of a string, base64 — the same
  curve as a chatsync user key, so a chatsync key *is* a dm3 signing key (``profile_keys``).
* ``stringify`` is ``safe-stable-stringify``: JSON with sorted keys and no spaces, which is
  what dm3 signs and hashes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from Crypto.Hash import keccak
from nacl import bindings
from nacl.exceptions import BadSignatureError, CryptoError
from nacl.signing import SigningKey, VerifyKey

PAD_BLOCK = 2048
NONCE_LEN = bindings.crypto_aead_chacha20poly1305_ietf_NPUBBYTES  # 12
SCHEME = "x25519-chacha20-poly1305"


class Dm3CryptoError(ValueError):
    """A ciphertext, key or signature that does not open or verify."""


def stringify(value: Any) -> str:
    """``safe-stable-stringify``: sorted keys, no whitespace, non-ASCII kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(text: str) -> str:
    """dm3-lib-shared ``sha256``: of the UTF-8 bytes, as ``0x`` + hex."""
    return "0x" + hashlib.sha256(text.encode()).hexdigest()


def hash_message(text: str) -> str:
    """ethers ``hashMessage`` (EIP-191): keccak256 of the prefixed UTF-8 bytes, ``0x`` + hex."""
    data = text.encode()
    digest = keccak.new(digest_bits=256)
    digest.update(b"\x19Ethereum Signed Message:\n" + str(len(data)).encode() + data)
    return "0x" + digest.hexdigest()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise Dm3CryptoError(f"{what} is not base64") from None


def _unhex_nonce(text: Any) -> bytes:
    if not isinstance(text, str) or not text.startswith("0x"):
        raise Dm3CryptoError("nonce is not 0x-prefixed hex")
    try:
        nonce = bytes.fromhex(text[2:])
    except ValueError:
        raise Dm3CryptoError("nonce is not 0x-prefixed hex") from None
    if len(nonce) != NONCE_LEN:
        raise Dm3CryptoError(f"nonce must be {NONCE_LEN} bytes")
    return nonce


def encrypt(key: bytes, payload: str, nonce: bytes) -> dict[str, str]:
    """Seal ``payload`` under a 32-byte key with the given 12-byte (random) nonce."""
    padded = bindings.sodium_pad(payload.encode(), PAD_BLOCK)
    sealed = bindings.crypto_aead_chacha20poly1305_ietf_encrypt(padded, None, nonce, key)
    return {"ciphertext": b64(sealed), "nonce": "0x" + nonce.hex()}


def decrypt(key: bytes, sealed: Any) -> str:
    """Open what ``encrypt`` sealed; Dm3CryptoError if it was altered, truncated or not ours."""
    if not isinstance(sealed, dict) or not isinstance(sealed.get("ciphertext"), str):
        raise Dm3CryptoError("sealed payload needs a ciphertext string")
    nonce = _unhex_nonce(sealed.get("nonce"))
    ciphertext = unb64(sealed["ciphertext"], "ciphertext")
    try:
        padded = bindings.crypto_aead_chacha20poly1305_ietf_decrypt(ciphertext, None, nonce, key)
        return bytes(bindings.sodium_unpad(padded, PAD_BLOCK)).decode()
    except (CryptoError, ValueError, TypeError, UnicodeDecodeError):
        raise Dm3CryptoError("ciphertext does not open with this key") from None


def encrypt_for(
    recipient_public: bytes, payload: str, ephemeral_seed: bytes, nonce: bytes
) -> dict[str, str]:
    """dm3 ``encryptAsymmetric``; the ephemeral key pair comes from ``ephemeral_seed``."""
    eph_public, eph_secret = bindings.crypto_kx_seed_keypair(ephemeral_seed)
    _, tx = bindings.crypto_kx_client_session_keys(eph_public, eph_secret, recipient_public)
    return {**encrypt(tx, payload, nonce), "ephemPublicKey": b64(eph_public)}


def decrypt_from(keys: EncryptionKeys, sealed: Any) -> str:
    """dm3 ``decryptAsymmetric`` with our x25519 key pair."""
    if not isinstance(sealed, dict) or not isinstance(sealed.get("ephemPublicKey"), str):
        raise Dm3CryptoError("sealed payload needs an ephemPublicKey")
    eph_public = unb64(sealed["ephemPublicKey"], "ephemPublicKey")
    try:  # libsodium refuses a key of another length, and a low-order point
        rx, _ = bindings.crypto_kx_server_session_keys(keys.public, keys.secret, eph_public)
    except (CryptoError, ValueError, TypeError):
        raise Dm3CryptoError("ephemPublicKey is not a usable x25519 key") from None
    return decrypt(rx, sealed)


def sign_text(key: SigningKey, text: str) -> str:
    return b64(key.sign(text.encode()).signature)


def check_text_signature(public_key: bytes, text: str, signature: Any) -> bool:
    if not isinstance(signature, str):
        return False
    try:
        VerifyKey(public_key).verify(text.encode(), unb64(signature, "signature"))
    except (BadSignatureError, Dm3CryptoError, ValueError, TypeError):
        return False
    return True


@dataclass(frozen=True, slots=True)
class EncryptionKeys:
    """An x25519 key pair (dm3's encryptionKeyPair)."""

    public: bytes
    secret: bytes


def encryption_keys(key: SigningKey) -> EncryptionKeys:
    """A chatsync user's box key pair (``client.e2e``: the ed25519 seed's curve25519 twin)."""
    secret = key.to_curve25519_private_key()
    return EncryptionKeys(bytes(secret.public_key), bytes(secret))


def profile_keys(key: SigningKey) -> dict[str, Any]:
    """dm3's ``ProfileKeys`` for a chatsync key: a dm3 client signs and decrypts with these."""
    box = encryption_keys(key)
    public = bytes(key.verify_key)
    return {
        "signingKeyPair": {"publicKey": b64(public), "privateKey": b64(bytes(key) + public)},
        "encryptionKeyPair": {"publicKey": b64(box.public), "privateKey": b64(box.secret)},
        "storageEncryptionKey": b64(storage_key(key)),
        "storageEncryptionNonce": 0,
    }


STORAGE_KEY_MESSAGE = "chatsync: derive my dm3 storage encryption key (v1)"


def storage_key(key: SigningKey) -> bytes:
    """dm3 ``createStorageKey``: SHA-256 of the UTF-8 of a signature by the user's key.

    ed25519 signatures are deterministic, so the same key file always gives the same
    storage key, and only its holder can compute it.
    """
    return hashlib.sha256(sign_text(key, STORAGE_KEY_MESSAGE).encode()).digest()
