"""dm3/envelope.py: dm3's envelope schema exactly, opening and checking what a sender built,
the postmark, and what the gateway keeps. The same refusals against the real dm3 library's
envelopes: tests/interop/test_dm3_js.py."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nacl.signing import SigningKey

from dm3.crypto import decrypt_from, encryption_keys, hash_message, stringify
from dm3.envelope import (
    Delivered,
    DeliveryInformation,
    EnvelopeError,
    add_postmark,
    build_envelope,
    check_envelope,
    check_message_signature,
    check_sender,
    envelope_size,
    open_delivery_information,
    open_envelope,
    parse_envelope,
    sign_message,
    unwrap,
    wrap,
)
from dm3.names import name_of
from store.signing import user_id_from_key

ALICE, BOB, SERVICE = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()


def name(key: SigningKey) -> str:
    return name_of(user_id_from_key(bytes(key.verify_key)))


def envelope(text: str = "hi", sender: SigningKey = ALICE) -> dict[str, Any]:
    message = sign_message(sender, name(sender), name(BOB), text, 1_700_000_000_000)
    return build_envelope(
        sender, message, encryption_keys(BOB).public, encryption_keys(SERVICE).public,
        os.urandom(88),
    )  # fmt: skip


def test_what_a_sender_builds_the_service_and_the_recipient_open() -> None:
    env = check_envelope(envelope("gm"))
    info = open_delivery_information(encryption_keys(SERVICE), env)
    assert info == DeliveryInformation(name(BOB), name(ALICE))
    check_sender(env, bytes(ALICE.verify_key))
    postmarked = add_postmark(env, SERVICE, encryption_keys(BOB).public, 1234, os.urandom(44))
    message, postmark = open_envelope(encryption_keys(BOB), postmarked)
    assert message["message"] == "gm" and check_message_signature(message, bytes(ALICE.verify_key))
    assert postmark["incommingTimestamp"] == 1234
    assert postmark["messageHash"] == hash_message(stringify(env["message"]))
    with pytest.raises(EnvelopeError):
        open_envelope(encryption_keys(ALICE), postmarked)  # not alice's to read


def test_a_forged_or_altered_envelope_is_refused() -> None:
    env = envelope()
    with pytest.raises(EnvelopeError, match="signature"):
        check_sender(env, bytes(BOB.verify_key))  # not bob's envelope
    other = envelope("swapped")
    with pytest.raises(EnvelopeError, match="hash"):
        check_sender({**env, "message": other["message"]}, bytes(ALICE.verify_key))
    with pytest.raises(EnvelopeError, match="does not open"):
        open_delivery_information(encryption_keys(ALICE), env)  # sealed for the service
    plain = {
        **env,
        "metadata": {**env["metadata"], "deliveryInformation": {"to": "a", "from": "b"}},
    }
    with pytest.raises(EnvelopeError, match="sealed"):
        open_delivery_information(encryption_keys(SERVICE), check_envelope(plain))
    other_scheme = {**env, "metadata": {**env["metadata"], "encryptionScheme": "rot13"}}
    with pytest.raises(EnvelopeError, match="scheme"):
        open_delivery_information(encryption_keys(SERVICE), other_scheme)


@pytest.mark.parametrize(
    "change",
    [
        lambda e: {**e, "extra": "x"},
        lambda e: {k: v for k, v in e.items() if k != "message"},
        lambda e: {**e, "message": 5},
        lambda e: {**e, "postmark": {}},
        lambda e: {**e, "metadata": "x"},
        lambda e: {**e, "metadata": {**e["metadata"], "more": "x"}},
        lambda e: {**e, "metadata": {k: v for k, v in e["metadata"].items() if k != "version"}},
        lambda e: {**e, "metadata": {**e["metadata"], "signature": None}},
        lambda e: {**e, "metadata": {**e["metadata"], "deliveryInformation": {"to": "a"}}},
        lambda e: {**e, "metadata": {**e["metadata"], "deliveryInformation": 7}},
        lambda e: [e],
    ],
)
def test_what_is_not_dm3s_schema_is_refused(change: Any) -> None:
    with pytest.raises(EnvelopeError) as refused:
        check_envelope(change(envelope()))
    assert refused.value.shape


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=10), inner, max_size=5), max_leaves=20))  # fmt: skip
def test_any_json_is_an_envelope_or_an_envelope_error(value: Any) -> None:
    with pytest.raises(EnvelopeError):
        parse_envelope(value if not isinstance(value, str) else 5)  # not a JSON string
    try:
        env = parse_envelope(json.dumps(value))
    except EnvelopeError:
        return
    assert isinstance(env["message"], str) and isinstance(env["metadata"]["signature"], str)


def test_size_is_dm3s_measure() -> None:
    env = envelope("x" * 5000)
    assert envelope_size(env) == len(stringify(env).encode())
    assert envelope_size(env) > envelope_size(envelope("x"))  # padded: 2 KiB classes


def test_what_the_gateway_keeps_comes_back_and_nothing_else_does() -> None:
    kept = Delivered(envelope(), DeliveryInformation(name(BOB), name(ALICE), "topic-7"), 99)
    assert unwrap(wrap(kept)) == kept
    raw = json.loads(wrap(kept))
    for bad in (b"not json", b"{}", stringify({**raw, "v": 2}).encode(),
                stringify({**raw, "incomingTimestamp": "99"}).encode(),
                stringify({**raw, "incomingTimestamp": True}).encode(),
                stringify({**raw, "envelop": {"message": "m"}}).encode(),
                stringify({**raw, "deliveryInformation": {"to": 1, "from": "x"}}).encode()):  # fmt: skip
        assert unwrap(bad) is None


def test_the_postmark_is_signed_by_the_service_and_sealed_for_the_recipient() -> None:
    from dm3.crypto import check_text_signature, sha256_hex

    env = add_postmark(envelope(), SERVICE, encryption_keys(BOB).public, 5, os.urandom(44))
    postmark = json.loads(decrypt_from(encryption_keys(BOB), json.loads(env["postmark"])))
    unsigned = {k: v for k, v in postmark.items() if k != "signature"}
    assert check_text_signature(
        bytes(SERVICE.verify_key), sha256_hex(stringify(unsigned)), postmark["signature"]
    )


REQUIRED = [("message",), ("metadata",), ("metadata", "version"), ("metadata", "signature"),
            ("metadata", "deliveryInformation"), ("metadata", "encryptedMessageHash")]  # fmt: skip


@pytest.mark.parametrize("path", REQUIRED)
def test_each_required_field_is_required(path: tuple[str, ...]) -> None:
    env = envelope()
    holder = env if len(path) == 1 else env["metadata"]
    del holder[path[-1]]
    with pytest.raises(EnvelopeError, match="missing"):
        check_envelope(env)


@pytest.mark.parametrize("field", ["to", "from"])
def test_plain_delivery_information_needs_to_and_from(field: str) -> None:
    info = {"to": "a", "from": "b", "deliveryInstruction": "c"}
    check_envelope(
        {**envelope(), "metadata": {**envelope()["metadata"], "deliveryInformation": info}}
    )
    del info[field]
    with pytest.raises(EnvelopeError, match="missing"):
        check_envelope(
            {**envelope(), "metadata": {**envelope()["metadata"], "deliveryInformation": info}}
        )


def test_optional_fields_may_be_left_out() -> None:
    env = envelope()
    del env["metadata"]["encryptionScheme"]
    assert "postmark" not in check_envelope(env)
    assert open_delivery_information(encryption_keys(SERVICE), env).to == name(
        BOB
    )  # default scheme


def test_refusals_say_whether_the_shape_was_wrong() -> None:
    with pytest.raises(EnvelopeError) as not_json:
        parse_envelope("{nope")
    assert not_json.value.shape and "not JSON" in str(not_json.value)
    with pytest.raises(EnvelopeError) as not_text:
        parse_envelope(b"{}")
    assert not_text.value.shape
    with pytest.raises(EnvelopeError) as forged:
        check_sender(envelope(), bytes(BOB.verify_key))
    assert not forged.value.shape  # the shape was right: the signer was not


def test_delivery_information_that_opens_but_is_not_dm3s_is_refused() -> None:
    from dm3.crypto import encrypt_for

    env = envelope()
    for info in ('{"to": "a"}', '["a", "b"]', "not json", '{"to": "a", "from": "b", "x": 1}'):
        sealed = stringify(
            encrypt_for(encryption_keys(SERVICE).public, info, os.urandom(32), os.urandom(12))
        )
        bad = {**env, "metadata": {**env["metadata"], "deliveryInformation": sealed}}
        with pytest.raises(EnvelopeError, match="deliveryInformation"):
            open_delivery_information(encryption_keys(SERVICE), bad)


def test_what_opens_but_is_no_message_or_has_no_postmark_time_is_refused() -> None:
    from dm3.crypto import encrypt_for

    def sealed(value: object) -> str:
        return stringify(
            encrypt_for(
                encryption_keys(BOB).public, stringify(value), os.urandom(32), os.urandom(12)
            )
        )

    good = add_postmark(envelope(), SERVICE, encryption_keys(BOB).public, 7, os.urandom(44))
    for message in ([1], {"message": "no metadata"}, {"metadata": "x"}):
        with pytest.raises(EnvelopeError, match="no dm3 message"):
            open_envelope(encryption_keys(BOB), {**good, "message": sealed(message)})
    for postmark in ({}, {"incommingTimestamp": "7"}, {"incommingTimestamp": True}, [7]):
        with pytest.raises(EnvelopeError, match="postmark"):
            open_envelope(encryption_keys(BOB), {**good, "postmark": sealed(postmark)})
    with pytest.raises(EnvelopeError, match="does not open"):
        open_envelope(encryption_keys(BOB), {k: v for k, v in good.items() if k != "postmark"})


def test_randomness_comes_in_exact_amounts() -> None:
    message = sign_message(ALICE, name(ALICE), name(BOB), "x", 1)
    with pytest.raises(ValueError, match="88 random bytes"):
        build_envelope(
            ALICE, message, encryption_keys(BOB).public, encryption_keys(SERVICE).public, bytes(89)
        )
    with pytest.raises(ValueError, match="44 random bytes"):
        add_postmark(envelope(), SERVICE, encryption_keys(BOB).public, 1, bytes(43))
