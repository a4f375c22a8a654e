"""dm3/crypto.py: dm3-lib-crypto's formats (vectors from the npm library, 1.7.1), and what a
tampered, truncated or foreign ciphertext does. tests/interop runs the library itself."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nacl.signing import SigningKey

from dm3 import crypto
from dm3.crypto import Dm3CryptoError

KEY = SigningKey(bytes(range(32)))


def test_vectors_of_the_npm_library() -> None:
    # ethers.utils.hashMessage, dm3-lib-shared sha256 and stringify of the same inputs
    assert crypto.hash_message("hello dm3") == (
        "0x5fde5f778568e7714ba86068b9c28f1bde757f9f972eabc5646b72ef02051448"
    )
    assert crypto.sha256_hex("hello dm3") == (
        "0xd3b47c718151f0f56dcff0349ce493cd6d12d9051080561b92817a9a843e3e27"
    )
    value = {"b": [1, "ü", None], "a": {"z": True, "c": 1.5}}
    assert crypto.stringify(value) == '{"a":{"c":1.5,"z":true},"b":[1,"ü",null]}'


@given(st.text(max_size=3000))
def test_sealing_round_trips_and_pads_to_2048(text: str) -> None:
    sealed = crypto.encrypt(b"k" * 32, text, os.urandom(12))
    assert crypto.decrypt(b"k" * 32, sealed) == text
    # 16-byte tag on a multiple of 2,048 bytes: the length leaks only the size class
    assert (len(crypto.unb64(sealed["ciphertext"], "c")) - 16) % crypto.PAD_BLOCK == 0


def test_a_tampered_truncated_or_foreign_ciphertext_does_not_open() -> None:
    sealed = crypto.encrypt(b"k" * 32, "secret", os.urandom(12))
    raw = crypto.unb64(sealed["ciphertext"], "c")
    flipped = {**sealed, "ciphertext": crypto.b64(raw[:5] + bytes([raw[5] ^ 1]) + raw[6:])}
    for bad in (
        flipped,
        {**sealed, "ciphertext": crypto.b64(raw[:-1])},
        {**sealed, "nonce": "0x" + "00" * 12},
        {**sealed, "nonce": "00" * 12},
        {**sealed, "nonce": "0x00"},
        {**sealed, "ciphertext": "not base64!"},
        {"nonce": sealed["nonce"]},
        "a string",
    ):
        with pytest.raises(Dm3CryptoError):
            crypto.decrypt(b"k" * 32, bad)
    with pytest.raises(Dm3CryptoError):
        crypto.decrypt(b"j" * 32, sealed)


def test_sealed_for_a_key_opens_with_that_key_only() -> None:
    mine, other = crypto.encryption_keys(KEY), crypto.encryption_keys(SigningKey.generate())
    sealed = crypto.encrypt_for(mine.public, '{"to":"x"}', os.urandom(32), os.urandom(12))
    assert crypto.decrypt_from(mine, sealed) == '{"to":"x"}'
    with pytest.raises(Dm3CryptoError):
        crypto.decrypt_from(other, sealed)
    for bad in ({**sealed, "ephemPublicKey": crypto.b64(b"x" * 31)}, {"ciphertext": "AA=="}):
        with pytest.raises(Dm3CryptoError):
            crypto.decrypt_from(mine, bad)


def test_a_chatsync_key_is_a_dm3_profile() -> None:
    keys = crypto.profile_keys(KEY)
    public = crypto.unb64(keys["signingKeyPair"]["publicKey"], "k")
    private = crypto.unb64(keys["signingKeyPair"]["privateKey"], "k")
    assert public == bytes(KEY.verify_key) and private == bytes(KEY) + public  # libsodium's layout
    box = crypto.encryption_keys(KEY)
    assert crypto.unb64(keys["encryptionKeyPair"]["publicKey"], "k") == box.public
    signature = crypto.sign_text(KEY, "challenge")
    assert crypto.check_text_signature(public, "challenge", signature)
    assert not crypto.check_text_signature(public, "challengE", signature)
    assert not crypto.check_text_signature(public, "challenge", 12)
    # the storage key is the key file's: same every time, another for another key
    assert crypto.storage_key(KEY) == crypto.storage_key(SigningKey(bytes(range(32))))
    assert crypto.storage_key(KEY) != crypto.storage_key(SigningKey.generate())
    json.dumps(keys)  # printable as JSON for a dm3 client


def test_the_padding_block_is_dm3s_2048_bytes() -> None:
    sealed = crypto.encrypt(b"k" * 32, "x", bytes(12))
    assert len(crypto.unb64(sealed["ciphertext"], "c")) == 2048 + 16  # one block and the tag


@pytest.mark.parametrize("text", ["***", "AAA=!", "QUFB\n"])
def test_base64_is_strict(text: str) -> None:
    with pytest.raises(Dm3CryptoError, match="not base64"):
        crypto.unb64(text, "x")


@pytest.mark.parametrize("nonce", [None, 12, "00" * 13, "0x" + "zz" * 12, "0x" + "00" * 11])
def test_a_nonce_is_twelve_0x_prefixed_hex_bytes(nonce: object) -> None:
    sealed = {**crypto.encrypt(b"k" * 32, "x", bytes(12)), "nonce": nonce}
    with pytest.raises(Dm3CryptoError, match="nonce"):
        crypto.decrypt(b"k" * 32, sealed)


def test_a_low_order_ephemeral_key_is_refused() -> None:
    sealed = crypto.encrypt_for(crypto.encryption_keys(KEY).public, "x", bytes(32), bytes(12))
    for bad in (bytes(32), bytes(31)):
        with pytest.raises(Dm3CryptoError, match="ephemPublicKey"):
            crypto.decrypt_from(
                crypto.encryption_keys(KEY), {**sealed, "ephemPublicKey": crypto.b64(bad)}
            )


def test_a_signature_check_answers_false_not_falsy() -> None:
    public = bytes(KEY.verify_key)
    assert crypto.check_text_signature(public, "x", None) is False
    assert crypto.check_text_signature(public, "x", crypto.sign_text(KEY, "y")) is False
    assert crypto.check_text_signature(public, "x", "***") is False
    assert crypto.profile_keys(KEY)["storageEncryptionNonce"] == 0  # dm3's first storage nonce
