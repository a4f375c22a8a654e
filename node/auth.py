"""Who is asking: users sign in with their ed25519 key, the operator with the admin token.

Sign-in, without passwords (docs/OPERATING.md, "Clients"):

1. ``challenge(user)``: 16 random bytes, bound to this node and the user, valid for
   ``challenge_ttl_s``. The bytes to sign are ``CHALLENGE_TAG | node id | user | nonce |
   expiry``: a signature over another node's challenge, another user's, or an expired one
   is no use, and the tag keeps it from meaning anything else a key signs.
2. ``sign_in(user, public key, challenge, signature, device)``: the key must be the user's
   (user id = its hash), the challenge one this node gave out and has not taken back (each
   is good once), the signature valid. The answer is a token.

A token is ``user | expiry | device`` and a keyed BLAKE3 MAC over them and the node's id with
this node's secret (``auth.key`` beside the database, 0600, made at first start): checking one needs no
lookup, and it outlives a restart of the node — a client resumes its stream with it. It is
good on this node only (another node has another secret) until it expires.

Admin endpoints take ``admin.token`` (beside the database, 0600, made at first start; the
node logs its path): whoever can read the node's files may administer it, nobody else.
Every refusal is an ``AuthRefused`` with an HTTP status (401: who are you; 403: not you)
and a code. Pure: the clock and the randomness are given.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from blake3 import blake3
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from store.keys import USER_ID_LEN
from store.signing import PUBLIC_KEY_LEN, SIGNATURE_LEN, user_id_from_key

log = logging.getLogger(__name__)

CHALLENGE_TAG = b"chatsync-sign-in-v1\x00"
NONCE_LEN = 16
NODE_ID_LEN = 32  # BLAKE3 of the node's peer id
MAC_LEN = 32
MAX_DEVICE = 32  # bytes of a device name
MAX_TOKEN = 4 * (USER_ID_LEN + 8 + MAX_DEVICE + MAC_LEN) // 3 + 4  # base64 of the longest token
SECRET_FILE, ADMIN_FILE = "auth.key", "admin.token"
# a challenge's bytes: tag | node id | user | nonce | expiry ms (8, big-endian)
CHALLENGE_PARTS = (len(CHALLENGE_TAG), NODE_ID_LEN, USER_ID_LEN, NONCE_LEN, 8)


class AuthRefused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@dataclass(frozen=True, slots=True)
class Principal:
    user_id: bytes
    device: str
    expires_ms: int


@dataclass(frozen=True, slots=True)
class Challenge:
    data: bytes  # what the key signs
    expires_ms: int


class Authenticator:
    def __init__(
        self,
        secret: bytes,
        node_id: bytes,
        *,
        now_ms: Callable[[], int],
        random: Callable[[int], bytes] = os.urandom,
        token_ttl_s: int = 3600,
        challenge_ttl_s: int = 60,
        max_pending: int = 10_000,
    ) -> None:
        self._secret = secret
        self.node_id = blake3(node_id).digest()
        self._now_ms, self._random = now_ms, random
        self.token_ttl_ms, self.challenge_ttl_ms = token_ttl_s * 1000, challenge_ttl_s * 1000
        self._max_pending = max_pending
        self._pending: dict[bytes, tuple[bytes, int]] = {}  # nonce -> (user, expiry)

    # --- sign-in ---

    def challenge(self, user_id: bytes) -> Challenge:
        now = self._now_ms()
        self._pending = {n: p for n, p in self._pending.items() if p[1] > now}
        if len(self._pending) >= self._max_pending:
            raise AuthRefused(503, "busy", "too many sign-ins under way, retry in a minute")
        nonce, expires = self._random(NONCE_LEN), now + self.challenge_ttl_ms
        self._pending[nonce] = (user_id, expires)
        data = CHALLENGE_TAG + self.node_id + user_id + nonce + expires.to_bytes(8, "big")
        return Challenge(data, expires)

    def sign_in(
        self,
        user_id: bytes,
        public_key: bytes,
        challenge: bytes,
        signature: bytes,
        device: str,
        *,
        signed: bytes | None = None,
    ) -> tuple[str, Principal]:
        """A token for ``user_id`` on ``device``, or AuthRefused (401). ``signed``: what the
        key signed, if not the challenge's bytes (dm3 signs a text holding them)."""
        if len(challenge) != sum(CHALLENGE_PARTS):
            raise AuthRefused(401, "bad_challenge", "not a challenge of this node's")
        tag, node, user, nonce, stamp = _split(challenge, CHALLENGE_PARTS)
        expires = int.from_bytes(stamp, "big")
        if tag != CHALLENGE_TAG or node != self.node_id:
            raise AuthRefused(401, "wrong_node", "the challenge was given out by another node")
        if user != user_id:
            raise AuthRefused(401, "bad_challenge", "the challenge was given to another user")
        if expires <= self._now_ms():
            raise AuthRefused(401, "challenge_expired", "the challenge expired: ask for another")
        if self._pending.get(nonce) != (user_id, expires):
            raise AuthRefused(401, "challenge_unknown", "the challenge was used or never given")
        if len(public_key) != PUBLIC_KEY_LEN or user_id_from_key(public_key) != user_id:
            raise AuthRefused(401, "wrong_key", "that public key is not this user's")
        if len(signature) != SIGNATURE_LEN:
            raise AuthRefused(401, "bad_signature", "a signature is 64 bytes")
        try:
            VerifyKey(public_key).verify(challenge if signed is None else signed, signature)
        except (BadSignatureError, ValueError):
            raise AuthRefused(401, "bad_signature", "the signature does not verify") from None
        del self._pending[nonce]  # good once
        return self.issue(user_id, device)

    # --- tokens ---

    def issue(self, user_id: bytes, device: str) -> tuple[str, Principal]:
        name = device.encode()
        if not 1 <= len(name) <= MAX_DEVICE:
            raise AuthRefused(401, "bad_device", f"a device name is 1..{MAX_DEVICE} bytes")
        expires = self._now_ms() + self.token_ttl_ms
        body = user_id + expires.to_bytes(8, "big") + name
        token = base64.urlsafe_b64encode(body + self._mac(body)).decode("ascii")
        return token, Principal(user_id, device, expires)

    def verify(self, token: str) -> Principal:
        if len(token) > MAX_TOKEN:
            raise AuthRefused(401, "bad_token", "not a token of this node's")
        try:
            raw = base64.urlsafe_b64decode(token.encode("ascii"))
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raise AuthRefused(401, "bad_token", "not a token of this node's") from None
        body, mac = raw[:-MAC_LEN], raw[-MAC_LEN:]
        if len(body) <= USER_ID_LEN + 8 or not hmac.compare_digest(mac, self._mac(body)):
            raise AuthRefused(401, "bad_token", "not a token of this node's")
        expires = int.from_bytes(body[USER_ID_LEN : USER_ID_LEN + 8], "big")
        if expires <= self._now_ms():
            raise AuthRefused(401, "token_expired", "the token expired: sign in again")
        device = body[USER_ID_LEN + 8 :].decode(errors="replace")
        return Principal(body[:USER_ID_LEN], device, expires)

    def _mac(self, body: bytes) -> bytes:
        return blake3(self.node_id + body, key=self._secret).digest()  # this node's, this body


def _split(data: bytes, lengths: tuple[int, ...]) -> list[bytes]:
    parts, at = [], 0
    for length in lengths:
        parts.append(data[at : at + length])
        at += length
    return parts


def check_admin(expected: str, given: str | None) -> None:
    if given is None:
        raise AuthRefused(401, "no_token", "send the admin token: Authorization: Bearer <token>")
    if not hmac.compare_digest(expected.encode(), given.encode(errors="replace")):
        raise AuthRefused(403, "not_admin", "that is not this node's admin token")


def load_or_create_secrets(data: Path) -> tuple[bytes, str]:
    """(the token MAC key, the admin token) from the files beside the database, made (0600)
    at first start."""
    secret = load_or_create_file(data / SECRET_FILE, lambda: os.urandom(32).hex())
    admin = load_or_create_file(data / ADMIN_FILE, lambda: os.urandom(32).hex())
    return bytes.fromhex(secret), admin


def load_or_create_file(path: Path, make: Callable[[], str]) -> str:
    """The file's text, stripped; made with ``make()`` (mode 0600) if it does not exist."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(make() + "\n")
        log.info("created %s (mode 0600)", path)
    return path.read_text().strip()
