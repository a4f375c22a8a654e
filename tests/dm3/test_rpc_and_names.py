"""dm3/rpc.py and dm3/names.py: every malformed request gets its JSON-RPC code, every name
that is not a chatsync user's is refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nacl.signing import SigningKey

from dm3 import rpc
from dm3.names import INBOX_NONCE, UnknownName, inbox_proof, name_of, user_of, user_or_none
from store.authz import group_chat_id
from store.signing import user_id_from_key


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{", rpc.PARSE_ERROR),
        (b"\xff\xfe", rpc.PARSE_ERROR),
        (b"[" * 100_000, rpc.PARSE_ERROR),  # nesting deeper than the parser goes
        (b"[]", rpc.INVALID_REQUEST),  # batches are not served
        (b'"dm3_submitMessage"', rpc.INVALID_REQUEST),
        (b'{"method": "m", "params": []}', rpc.INVALID_REQUEST),
        (b'{"jsonrpc": "1.0", "method": "m"}', rpc.VERSION_NOT_SUPPORTED),
        (b'{"jsonrpc": "2.0", "method": 5}', rpc.INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "method": "m", "id": {}}', rpc.INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "method": "m", "id": true}', rpc.INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "method": "m", "params": {"a": 1}}', rpc.INVALID_PARAMS),
    ],
)
def test_malformed_requests_get_their_codes(body: bytes, code: int) -> None:
    with pytest.raises(rpc.RpcError) as refused:
        rpc.parse_request(body)
    assert refused.value.code == code
    answer = rpc.error_response(refused.value)
    assert answer["jsonrpc"] == "2.0" and answer["error"]["code"] == code


def test_a_request_keeps_its_id() -> None:
    call = rpc.parse_request(b'{"jsonrpc": "2.0", "id": "x7", "method": "m", "params": [1]}')
    assert (call.method, call.params, call.id) == ("m", [1], "x7")
    assert rpc.response(call.id, "ok") == {"jsonrpc": "2.0", "id": "x7", "result": "ok"}
    refused = rpc.RpcError(rpc.TOO_BIG, "Too big", call.id)
    assert rpc.error_response(refused)["id"] == "x7"


@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_bytes_are_a_request_or_a_json_rpc_error(body: bytes) -> None:
    try:
        call = rpc.parse_request(body)
    except rpc.RpcError as exc:
        assert exc.code in {rpc.PARSE_ERROR, rpc.INVALID_REQUEST, rpc.INVALID_PARAMS,
                            rpc.VERSION_NOT_SUPPORTED}  # fmt: skip
    else:
        assert isinstance(call.method, str) and isinstance(call.params, list)
        json.dumps(rpc.response(call.id, None))


def test_names_are_self_certifying() -> None:
    key = SigningKey.generate()
    user = user_id_from_key(bytes(key.verify_key))
    name = name_of(user)
    assert user_of(name) == user == user_of(name.upper())  # dm3 compares names case-blind
    assert user_or_none(name) == user and user_or_none("alice.eth") is None
    assert inbox_proof(bytes(key.verify_key)).chat_id() == group_chat_id(
        bytes(key.verify_key), INBOX_NONCE
    )
    for bad in ("alice.eth", name.removesuffix(".user.chatsync"), "zz" * 20 + ".user.chatsync",
                "ab" * 19 + ".user.chatsync", "ab" * 200 + ".user.chatsync", ".user.chatsync"):  # fmt: skip
        with pytest.raises(UnknownName):
            user_of(bad)


def test_the_codes_are_the_seeds() -> None:
    """Seed 001, "RPC Error Codes": the JSON-RPC ones and dm3's own."""
    assert (rpc.PARSE_ERROR, rpc.INVALID_REQUEST, rpc.METHOD_NOT_FOUND, rpc.INVALID_PARAMS,
            rpc.INTERNAL_ERROR) == (-32700, -32600, -32601, -32602, -32603)  # fmt: skip
    assert tuple(range(-32000, -32007, -1)) == (rpc.INVALID_INPUT, rpc.NOT_FOUND, rpc.UNAVAILABLE, rpc.UNAUTHORIZED, rpc.NOT_SUPPORTED,
            rpc.LIMIT_EXCEEDED, rpc.VERSION_NOT_SUPPORTED)  # fmt: skip
    assert (rpc.SPAM, rpc.TOO_BIG) == (-32010, -32011)
    assert str(rpc.RpcError(rpc.SPAM, "Spam")) == "Spam"
