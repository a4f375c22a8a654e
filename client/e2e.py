"""End-to-end encryption of direct messages, and the user key file. Pure (no I/O but the key file).

The node never reads a payload; this module is for clients (``client.http``, the CLI).

* **User key file** (``chatsync keygen``): a small JSON file, mode 0600, holding the
  user's 32-byte ed25519 seed. The user id is BLAKE3(ed25519 public key)[:20]
  (``store.signing``); the x25519 box key pair is derived from the same seed
  (``SigningKey.to_curve25519_private_key``), so one file is the whole identity.
* **DM chat id**: BLAKE3(domain tag | smaller user id | larger user id) — both
  parties compute the same 32-byte id without asking anybody (Status: a 1:1 chat
  id comes from the pair).
* **DM payload**: the envelope ``[1, sender_box_key, recipient_box_key, boxed]``
  in canonical CBOR, where ``boxed = Box(sender_priv, recipient_pub).encrypt(text)``
  (XSalsa20-Poly1305 with a random 24-byte nonce in front). Box is symmetric, so
  the sender can read back their own messages and the recipient can read them;
  the node and everyone else see only the envelope. The reader checks that the
  envelope's sender key is the key the sender published (their verified
  ``IdentityDoc``); the message signature already binds the envelope to the sender.
* **Group chats**: the payload is whatever bytes the client gives; encrypting for a
  group (key agreement, rotation on membership change) is the client's business.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nacl.exceptions import CryptoError
from nacl.public import Box, PrivateKey, PublicKey
from nacl.signing import SigningKey

from store.errors import DecodeError
from store.hlc import Hlc
from store.ops import BOX_KEY_LEN, make_identity
from store.records import (
    IdentityRecord,
    canonical_cbor,
    ensure_canonical,
    field_bytes,
    load_array,
)
from store.signing import public_key, user_id_from_key

SEED_LEN = 32
MAX_ENVELOPE = 512 * 1024  # above any payload limit: the node's limit is the one that counts


class E2eError(Exception):
    """A DM that cannot be opened: not an envelope, not for this key, or tampered with."""


# --- the user key ----------------------------------------------------------------------------


@dataclass(frozen=True)
class UserKey:
    """A user's ed25519 signing key and everything derived from it."""

    signing_key: SigningKey

    @classmethod
    def generate(cls) -> UserKey:
        return cls(SigningKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> UserKey:
        if len(seed) != SEED_LEN:
            raise ValueError(f"an ed25519 seed is {SEED_LEN} bytes, got {len(seed)}")
        return cls(SigningKey(seed))

    @property
    def seed(self) -> bytes:
        return bytes(self.signing_key)

    @property
    def user_id(self) -> bytes:
        return user_id_from_key(public_key(self.signing_key))

    @property
    def box_private(self) -> PrivateKey:
        return self.signing_key.to_curve25519_private_key()

    @property
    def box_key(self) -> bytes:
        """The x25519 public key published in the user's identity."""
        return bytes(self.box_private.public_key)

    def identity(self, hlc: Hlc, home_nodes: Iterable[bytes] = ()) -> IdentityRecord:
        """A self-certifying identity record publishing this key's box key and the user's
        home nodes (peer ids' bytes)."""
        return make_identity(self.signing_key, self.box_key, hlc, home_nodes)


def write_key_file(path: Path, key: UserKey, *, force: bool = False) -> None:
    """Write ``key`` to ``path`` with mode 0600; FileExistsError unless ``force``."""
    body = json.dumps(
        {"version": 1, "ed25519_seed": key.seed.hex(), "user_id": key.user_id.hex()}, indent=2
    ).encode()
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)  # an existing file overwritten with --force keeps its mode
        f.write(body + b"\n")


def read_key_file(path: Path) -> UserKey:
    """The key in ``path``; ValueError if the file is not a chatsync key file."""
    try:
        data = json.loads(path.read_text())
        key = UserKey.from_seed(bytes.fromhex(data["ed25519_seed"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not a chatsync key file ({exc})") from None
    if "user_id" in data and data["user_id"] != key.user_id.hex():
        raise ValueError(f"{path}: user_id does not match the seed")
    return key


# --- DM chats and payloads -------------------------------------------------------------------


@dataclass(frozen=True)
class DmEnvelope:
    sender_box_key: bytes
    recipient_box_key: bytes
    boxed: bytes  # nonce (24 bytes) + ciphertext + MAC

    def encode(self) -> bytes:
        return canonical_cbor([1, self.sender_box_key, self.recipient_box_key, self.boxed])


def decode_envelope(payload: bytes) -> DmEnvelope:
    try:
        v = load_array(payload, what="DM envelope", version=1, fields=4, max_bytes=MAX_ENVELOPE)
        env = DmEnvelope(
            field_bytes(v[1], "sender_box_key", length=BOX_KEY_LEN),
            field_bytes(v[2], "recipient_box_key", length=BOX_KEY_LEN),
            field_bytes(v[3], "boxed"),
        )
        ensure_canonical(v, payload, "DM envelope")
    except DecodeError as exc:
        raise E2eError(f"not a DM envelope: {exc}") from None
    return env


def seal_dm(sender: UserKey, recipient_box_key: bytes, plaintext: bytes) -> bytes:
    """The payload of a DM from ``sender`` to the owner of ``recipient_box_key``."""
    if len(recipient_box_key) != BOX_KEY_LEN:
        raise ValueError(f"a box key is {BOX_KEY_LEN} bytes")
    box = Box(sender.box_private, PublicKey(recipient_box_key))
    boxed = bytes(box.encrypt(plaintext))
    return DmEnvelope(sender.box_key, recipient_box_key, boxed).encode()


def open_dm(reader: UserKey, payload: bytes, sender_box_key: bytes) -> bytes:
    """Decrypt a DM payload as ``reader`` (sender or recipient).

    ``sender_box_key`` is the box key the message's sender published (their verified
    identity), or the reader's own when the reader sent the message.
    """
    env = decode_envelope(payload)
    if env.sender_box_key != sender_box_key:
        raise E2eError("the envelope's sender key is not the key the sender published")
    mine = reader.box_key
    if mine == env.recipient_box_key:
        peer = env.sender_box_key
    elif mine == env.sender_box_key:
        peer = env.recipient_box_key
    else:
        raise E2eError("this DM is not addressed to this key")
    try:
        return bytes(Box(reader.box_private, PublicKey(peer)).decrypt(env.boxed))
    except CryptoError as exc:
        raise E2eError(f"DM does not decrypt: {exc}") from None
