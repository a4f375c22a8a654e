"""dm3 encryption envelopes at a delivery service: checked, opened, postmarked, kept. Pure.

An ``EncryptionEnvelop`` (seed 001 §2.2.5, ``@dm3-org/dm3-lib-messaging`` 1.7.1) is
``{message, metadata: {version, encryptionScheme?, deliveryInformation,
encryptedMessageHash, signature}, postmark?}`` and nothing else. ``message`` is sealed for the
recipient, ``deliveryInformation`` (``{to, from, deliveryInstruction?}``) for this service;
``metadata.signature`` is the sender's ed25519 signature over the metadata without it, and
``encryptedMessageHash`` the SHA-256 of the sealed message — so a sender is known by the key
behind their name, and nobody can swap the message of a signed envelope.

What the gateway keeps (``wrap``) is the postmarked envelope — as the recipient's dm3 client
fetches it — with the opened delivery information and the time it came in: any node of the
recipient's services can then serve it per contact and delete it when acknowledged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

from nacl.signing import SigningKey

from dm3.crypto import (
    SCHEME,
    Dm3CryptoError,
    EncryptionKeys,
    check_text_signature,
    decrypt_from,
    encrypt_for,
    hash_message,
    sha256_hex,
    sign_text,
    stringify,
)

# dm3's JSON schema (EncryptionEnvelop.schema.json): per object, field -> (required, types);
# no other fields (additionalProperties: false)
Fields = dict[str, tuple[bool, type | tuple[type, ...]]]
ENVELOPE_FIELDS: Fields = {
    "message": (True, str),
    "metadata": (True, dict),
    "postmark": (False, str),
}
METADATA_FIELDS: Fields = {
    "version": (True, str), "encryptionScheme": (False, str),
    "deliveryInformation": (True, (str, dict)), "encryptedMessageHash": (True, str),
    "signature": (True, str),
}  # fmt: skip
INFO_FIELDS: Fields = {"to": (True, str), "from": (True, str), "deliveryInstruction": (False, str)}


class EnvelopeError(ValueError):
    """An envelope that is not dm3's shape (``invalid_shape``) or does not open/verify."""

    def __init__(self, message: str, *, shape: bool = False) -> None:
        super().__init__(message)
        self.shape = shape


@dataclass(frozen=True, slots=True)
class DeliveryInformation:
    to: str
    sender: str  # dm3's ``from``
    instruction: str | None = None

    def to_json(self) -> dict[str, str]:
        out = {"to": self.to, "from": self.sender}
        if self.instruction is not None:
            out["deliveryInstruction"] = self.instruction
        return out


def _check_object(value: Any, fields: Fields, what: str) -> dict[str, Any]:
    """One object against its part of dm3's schema; EnvelopeError(shape=True) if it fails."""
    if not isinstance(value, dict):
        raise EnvelopeError(f"{what} must be an object", shape=True)
    extra = sorted(set(value) - set(fields))
    if extra:
        raise EnvelopeError(f"{what} has unknown fields: {', '.join(extra)[:120]}", shape=True)
    for name, (required, types) in fields.items():
        if name not in value:
            if required:
                raise EnvelopeError(f"{what}.{name} is missing", shape=True)
        elif not isinstance(value[name], types):
            raise EnvelopeError(f"{what}.{name} has the wrong type", shape=True)
    return value


def check_envelope(value: Any) -> dict[str, Any]:
    """The envelope if it has dm3's shape (its JSON schema, exactly); EnvelopeError if not."""
    envelope = _check_object(value, ENVELOPE_FIELDS, "envelope")
    metadata = _check_object(envelope["metadata"], METADATA_FIELDS, "metadata")
    if isinstance(metadata["deliveryInformation"], dict):
        _check_object(metadata["deliveryInformation"], INFO_FIELDS, "deliveryInformation")
    return envelope


def parse_envelope(text: Any) -> dict[str, Any]:
    """``dm3_submitMessage``'s first parameter: the envelope as a JSON string."""
    if not isinstance(text, str):
        raise EnvelopeError("the envelope must be passed as a JSON string", shape=True)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise EnvelopeError("the envelope is not JSON", shape=True) from None
    return check_envelope(value)


def envelope_size(envelope: dict[str, Any]) -> int:
    """dm3's ``getEnvelopSize``: UTF-8 bytes of the stable stringification."""
    return len(stringify(envelope).encode())


def open_delivery_information(
    keys: EncryptionKeys, envelope: dict[str, Any]
) -> DeliveryInformation:
    """Decrypt the delivery information sealed for this service (x25519-chacha20-poly1305)."""
    metadata = envelope["metadata"]
    scheme = metadata.get("encryptionScheme", SCHEME)
    if scheme != SCHEME:
        raise EnvelopeError(f"encryption scheme {scheme[:60]!r} is not supported; use {SCHEME}")
    sealed = metadata["deliveryInformation"]
    if not isinstance(sealed, str):
        raise EnvelopeError("deliveryInformation must be sealed for this delivery service")
    try:
        info = json.loads(decrypt_from(keys, json.loads(sealed)))
        _check_object(info, INFO_FIELDS, "deliveryInformation")
    except (Dm3CryptoError, ValueError, RecursionError) as exc:
        raise EnvelopeError(
            f"deliveryInformation does not open with this service's key: {exc}"
        ) from None
    return _info(info)


def _info(value: dict[str, str]) -> DeliveryInformation:
    return DeliveryInformation(value["to"], value["from"], value.get("deliveryInstruction"))


def check_sender(envelope: dict[str, Any], sender_key: bytes) -> None:
    """The metadata is signed by ``sender_key`` and names the message it carries."""
    metadata = envelope["metadata"]
    if metadata["encryptedMessageHash"] != sha256_hex(stringify(envelope["message"])):
        raise EnvelopeError("encryptedMessageHash is not the hash of the message")
    unsigned = {k: v for k, v in metadata.items() if k != "signature"}
    if not check_text_signature(sender_key, stringify(unsigned), metadata["signature"]):
        raise EnvelopeError("the metadata signature is not the sender's")


def add_postmark(
    envelope: dict[str, Any],
    service_key: SigningKey,
    recipient_box_key: bytes,
    incoming_ms: int,
    randomness: bytes,
) -> dict[str, Any]:
    """The envelope with dm3's postmark, signed by this service and sealed for the recipient
    (``dm3-lib-delivery`` ``addPostmark``). ``randomness``: 44 bytes (ephemeral seed, nonce)."""
    seed, nonce = _split_randomness(randomness, 1)[0]
    unsigned = {
        "messageHash": hash_message(stringify(envelope["message"])),
        "incommingTimestamp": incoming_ms,  # sic: dm3's spelling
    }
    signature = sign_text(service_key, sha256_hex(stringify(unsigned)))
    sealed = encrypt_for(
        recipient_box_key, stringify({**unsigned, "signature": signature}), seed, nonce
    )
    return {**envelope, "postmark": stringify(sealed)}


def _split_randomness(randomness: bytes, count: int) -> list[tuple[bytes, bytes]]:
    """``count`` (ephemeral seed, nonce) pairs: 44 random bytes each."""
    if len(randomness) != 44 * count:
        raise ValueError(f"{44 * count} random bytes needed, got {len(randomness)}")
    return [
        (randomness[at : at + 32], randomness[at + 32 : at + 44]) for at in range(0, 44 * count, 44)
    ]


# --- the sender's and the recipient's side (as dm3-lib-messaging does it) ---


def sign_message(
    key: SigningKey, sender: str, to: str, text: str, timestamp_ms: int
) -> dict[str, Any]:
    """A NEW dm3 message (``createMessage``), signed by the sender."""
    unsigned = {
        "message": text,
        "metadata": {"type": "NEW", "to": to, "from": sender, "timestamp": timestamp_ms},
    }
    return {**unsigned, "signature": sign_text(key, stringify(unsigned))}


def build_envelope(
    key: SigningKey,
    message: dict[str, Any],
    recipient_box_key: bytes,
    service_box_key: bytes,
    randomness: bytes,
) -> dict[str, Any]:
    """``buildEnvelop``: the message sealed for the recipient, the delivery information for
    the service, the metadata signed. ``randomness``: 88 bytes (two ephemeral seeds, nonces)."""
    info = {"to": message["metadata"]["to"], "from": message["metadata"]["from"]}
    for_recipient, for_service = _split_randomness(randomness, 2)
    sealed = stringify(encrypt_for(recipient_box_key, stringify(message), *for_recipient))
    metadata = {
        "encryptionScheme": SCHEME,
        "deliveryInformation": stringify(
            encrypt_for(service_box_key, stringify(info), *for_service)
        ),
        "encryptedMessageHash": sha256_hex(stringify(sealed)),
        "version": "v1",
    }
    return {
        "message": sealed,
        "metadata": {**metadata, "signature": sign_text(key, stringify(metadata))},
    }


def open_envelope(
    keys: EncryptionKeys, envelope: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``decryptEnvelop``: (message, postmark) for the recipient; Dm3CryptoError or
    EnvelopeError if they do not open or are not dm3's."""
    try:
        message = json.loads(decrypt_from(keys, json.loads(envelope["message"])))
        postmark = json.loads(decrypt_from(keys, json.loads(envelope["postmark"])))
    except (KeyError, TypeError, ValueError, RecursionError) as exc:
        raise EnvelopeError(f"the envelope does not open: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("metadata"), dict):
        raise EnvelopeError("the envelope holds no dm3 message")
    stamp = postmark.get("incommingTimestamp") if isinstance(postmark, dict) else None
    if not isinstance(stamp, int) or isinstance(stamp, bool):
        raise EnvelopeError("the envelope's postmark has no incoming time")
    return message, postmark


def check_message_signature(message: dict[str, Any], sender_key: bytes) -> bool:
    """``checkMessageSignature`` (without the name: the caller knows whose key it is)."""
    unsigned = {k: v for k, v in message.items() if k != "signature"}
    return check_text_signature(sender_key, stringify(unsigned), message.get("signature"))


class Delivered(NamedTuple):
    """A kept envelope: as the recipient fetches it, who sent it, when it came in."""

    envelope: dict[str, Any]
    info: DeliveryInformation
    incoming_ms: int


def wrap(delivered: Delivered) -> bytes:
    """The payload of the gateway's message in the recipient's inbox."""
    return stringify(
        {
            "v": 1,
            "envelop": delivered.envelope,
            "deliveryInformation": delivered.info.to_json(),
            "incomingTimestamp": delivered.incoming_ms,
        }
    ).encode()


def unwrap(payload: bytes) -> Delivered | None:
    """A kept envelope back, or None for anything else in the inbox (never trusted blindly:
    any member of the inbox may post there)."""
    try:
        value = json.loads(payload)
        envelope = check_envelope(value["envelop"])
        info = _check_object(value["deliveryInformation"], INFO_FIELDS, "deliveryInformation")
        incoming = value["incomingTimestamp"]
        if value["v"] != 1 or not isinstance(incoming, int) or isinstance(incoming, bool):
            return None
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    return Delivered(envelope, _info(info), incoming)
