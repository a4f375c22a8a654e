"""The HTTP API's request decoding, without a server: ids, base64, op bodies (fast).

The same functions the handlers call (``node.api.decode``); the fuzz target ``http``
(``tests/fuzz/fuzz_http.py``) runs them on millions of inputs, and schemathesis runs the
whole API against a real node (``test_schemathesis.py``).
"""

from __future__ import annotations

import base64
from collections.abc import Callable

import cbor2
import pytest

from client.e2e import UserKey
from node.api.decode import chat_param, decode_identity_in, decode_ops_in, user_param
from node.api.errors import status_for
from node.api.models import IdentityIn, OpsIn
from store.errors import InvalidInput
from store.hlc import Hlc
from store.ops import encode_op, op_kind
from store.records import DEFAULT_MAX_PAYLOAD, MsgV1

ALICE = UserKey.from_seed(b"\x51" * 32)
BOB = UserKey.from_seed(b"\x52" * 32)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


@pytest.mark.parametrize(
    ("parse", "value"),
    [
        (chat_param, "00" * 20 + " " * 24),  # 64 characters, 20 bytes: fromhex skips spaces
        (chat_param, "00 " * 21 + "0"),
        (chat_param, "\t" * 2 + "ab" * 31),
        (user_param, "ab" * 10 + " " * 20),
        (user_param, "ab " * 13 + "a"),
    ],
)
def test_ids_with_whitespace_are_bad_ids_not_500(parse: Callable[[str], bytes], value: str) -> None:
    """Regression (found while writing the fuzz target ``http``): a 64-character chat id with
    spaces passed the length check, ``bytes.fromhex`` skipped the spaces, and the short id
    reached ``ChatDb`` as a ValueError — a 500."""
    with pytest.raises(InvalidInput) as info:
        parse(value)
    assert info.value.reason == "bad_id" and status_for("bad_id") == 400


def test_well_formed_ids_parse() -> None:
    assert chat_param("ab" * 32) == b"\xab" * 32
    assert user_param("AB" * 20) == b"\xab" * 20


def test_an_ops_body_decodes_to_its_ops() -> None:
    msg = MsgV1.create(ALICE.signing_key, b"\xc1" * 32, Hlc(1_000), b"hi")
    body = OpsIn.model_validate({"ops": [{"kind": int(op_kind(msg)), "data": b64(encode_op(msg))}]})
    assert decode_ops_in(body, max_payload=DEFAULT_MAX_PAYLOAD) == [msg]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ("not base64!", "bad_base64"),
        ("é", "bad_base64"),
        (b64(b"\x82\x01\x02"), "wrong_type"),
        # Regression: a bignum version made the error message raise ValueError: a 500.
        (b64(cbor2.dumps([cbor2.CBORTag(2, b"\x01" * 2000), 1])), "unknown_version"),
    ],
)
def test_a_bad_op_is_refused_with_its_reason(data: str, reason: str) -> None:
    body = OpsIn.model_validate({"ops": [{"kind": 1, "data": data}]})
    with pytest.raises(InvalidInput) as info:
        decode_ops_in(body, max_payload=DEFAULT_MAX_PAYLOAD)
    assert info.value.reason == reason and 400 <= status_for(reason) < 500


def test_an_identity_for_another_user_is_a_mismatch() -> None:
    record = ALICE.identity(Hlc(1_000))
    body = IdentityIn(data=b64(record.encode()))
    assert decode_identity_in(ALICE.user_id, body) == record
    with pytest.raises(InvalidInput) as info:
        decode_identity_in(BOB.user_id, body)
    assert info.value.reason == "user_mismatch" and status_for("user_mismatch") == 422
