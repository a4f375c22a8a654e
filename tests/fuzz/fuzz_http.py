"""Fuzz target ``http``: what the HTTP API does with a request before the write pipeline.

Not a mock of the app: the handlers' own pieces, in the order they run.

* Bodies: the raw bytes go through ``json.loads`` (Starlette's ``Request.json``) and the
  endpoint's pydantic model (``OpsIn``, ``IdentityIn``, ``ReadIn``, ``PeerIn``) as FastAPI
  does, then the handler's decoding function (``node.api.decode.decode_ops_in`` /
  ``decode_identity_in`` / ``decode_receipt_in``: URL-safe base64, then the CBOR op
  decoders) and ``validate_op``
  — what ``OpIntake.submit`` (node/intake.py) checks before it hands ops to the writer.
* Paths and queries: ids through ``chat_param`` / ``user_param``, then the read the handler
  makes on a real ``ChatDb`` (RocksDB in a temporary directory, one per process, holding a
  few messages): history pages with the fuzzed cursor, limit and direction, chat lists,
  members, a chat's proof, identity, a read position.

Input: ``[endpoint][field]\\n[field]\\n...[body]`` (the last field may hold newlines).

Property — the API's contract that invalid input is 4xx, never 500: the only exceptions are
the ones FastAPI or our handlers turn into a 4xx — a body that is not JSON (FastAPI: 422 or
400), a pydantic ``ValidationError`` (422 ``invalid_request``), or ``InvalidInput`` whose
``status_for(reason)`` is a 4xx. Anything else would reach the 500 handler: a crash.

The rest of a request (FastAPI's routing, the middleware, the writer, the response models)
runs under schemathesis against a real node: ``tests/node/test_schemathesis.py``.
"""

from __future__ import annotations

import atexit
import base64
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import cbor2
from pydantic import ValidationError

from fuzz_support import NOW_MS, instrumented, main

with instrumented(__name__ == "__main__"):
    from node.api.decode import (
        chat_param,
        decode_identity_in,
        decode_ops_in,
        decode_receipt_in,
        user_param,
    )
    from node.api.errors import status_for
    from node.api.models import IdentityIn, OpsIn, PeerIn, ReadIn
    from store.authz import new_group
    from store.chatdb import ChatDb
    from store.errors import InvalidInput
    from store.hlc import DEFAULT_MAX_OFFSET_MS, Hlc
    from store.ingress import validate_op
    from store.keys import encode_cursor, key_messages
    from store.messages import Direction
    from store.ops import (
        MembershipAction,
        MembershipOp,
        encode_op,
        make_identity,
        op_kind,
    )
    from store.records import DEFAULT_MAX_PAYLOAD, MessageKind, MsgV1
    from store.rocks import ChatDbConfig
    from store.signing import key_from_seed, public_key, user_id_from_key

TARGET = "http"
KEY = key_from_seed(b"\x31" * 32)
USER = user_id_from_key(public_key(KEY))
CHAT = b"\xc4" * 32

_DB: list[ChatDb] = []


def _db() -> ChatDb:
    """A real ChatDb with a few messages in CHAT, opened once per process."""
    if not _DB:
        path = Path(tempfile.mkdtemp(prefix="fuzz-http-"))
        db = ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=path / "db")
        db.put_messages(
            [MsgV1.create(KEY, CHAT, Hlc(NOW_MS - 1000 + i), b"m%d" % i) for i in range(5)]
        )
        _DB.append(db)

        def close() -> None:
            db.close()
            shutil.rmtree(path, ignore_errors=True)

        atexit.register(close)
    return _DB[0]


def _text(raw: bytes) -> str:
    """A path or query value as Starlette hands it over (percent-decoded, UTF-8, replaced)."""
    return raw.decode("utf-8", "replace")


class NotJson(Exception):
    """The body is not JSON: FastAPI answers 422 (JSONDecodeError) or 400 (anything else)."""


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)  # what Starlette's Request.json() does
    except Exception as exc:  # FastAPI maps every parse failure to a 4xx
        raise NotJson(str(exc)) from exc


def _limit(raw: bytes) -> int:
    return int.from_bytes(raw[:9], "big", signed=True)  # FastAPI hands over any int


def _post_ops(fields: list[bytes]) -> None:
    body = OpsIn.model_validate(_json(fields[-1]))
    for op in decode_ops_in(body, max_payload=DEFAULT_MAX_PAYLOAD):
        validate_op(op, now_ms=NOW_MS, max_offset_ms=DEFAULT_MAX_OFFSET_MS)


def _put_identity(fields: list[bytes]) -> None:
    user = user_param(_text(fields[0]))
    record = decode_identity_in(user, IdentityIn.model_validate(_json(fields[-1])))
    validate_op(record, now_ms=NOW_MS, max_offset_ms=DEFAULT_MAX_OFFSET_MS)


def _read_receipt(fields: list[bytes]) -> None:
    user, chat = user_param(_text(fields[0])), chat_param(_text(fields[1]))
    body = ReadIn.model_validate(_json(fields[-1]))
    receipt = decode_receipt_in(user, chat, body, max_payload=DEFAULT_MAX_PAYLOAD)
    validate_op(receipt, now_ms=NOW_MS, max_offset_ms=DEFAULT_MAX_OFFSET_MS)
    _db().read_position(chat, user)


def _peer(fields: list[bytes]) -> None:
    PeerIn.model_validate(_json(fields[-1]))


def _history(fields: list[bytes]) -> None:
    chat = chat_param(_text(fields[0]))
    cursor = _text(fields[1]) if fields[1] else None
    if cursor is not None and len(cursor) > 128:
        return  # Query(max_length=128): FastAPI's 422
    direction = Direction.FORWARD if fields[3][:1] == b"f" else Direction.BACKWARD
    _db().range(chat, cursor, _limit(fields[2]), direction)


def _chat_list(fields: list[bytes]) -> None:
    user = user_param(_text(fields[0]))
    cursor = _text(fields[1]) if fields[1] else None
    if cursor is not None and len(cursor) > 128:
        return
    _db().list_user_chats(user, cursor, _limit(fields[2]))


def _reads_by_id(fields: list[bytes]) -> None:
    chat = chat_param(_text(fields[0]))
    _db().list_members_with_info(chat)
    _db().chat_proof(chat)
    _db().get_identity(user_param(_text(fields[1])))


# endpoint -> (fields before the body, handler)
ENDPOINTS = [
    (0, _post_ops),
    (1, _put_identity),
    (2, _read_receipt),
    (0, _peer),
    (3, _history),
    (2, _chat_list),
    (1, _reads_by_id),
]


def one_input(data: bytes) -> None:
    if not data:
        return
    fields_before, handler = ENDPOINTS[data[0] % len(ENDPOINTS)]
    fields = data[1:].split(b"\n", fields_before)
    fields += [b""] * (fields_before + 1 - len(fields))
    try:
        handler(fields)
    except InvalidInput as exc:
        status = status_for(exc.reason)
        if not 400 <= status < 500:
            raise AssertionError(f"InvalidInput {exc.reason!r} maps to {status}") from exc
    except (NotJson, ValidationError):
        pass  # 422 (or 400 for a body FastAPI cannot parse at all)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def seeds() -> dict[str, bytes]:
    hlc = Hlc(NOW_MS - 500)
    msg = MsgV1.create(KEY, CHAT, hlc, b"hello")
    group = new_group(KEY, b"fuzz-http-group!")
    add = MembershipOp.create(KEY, group.chat_id(), USER, MembershipAction.ADD, hlc, proof=group)
    identity = make_identity(KEY, b"\x08" * 32, hlc)
    receipt = MsgV1.create(
        KEY, CHAT, Hlc(NOW_MS - 400), hlc.to_bytes(), kind=MessageKind.READ_RECEIPT, ref=msg.msg_id
    )

    ops = {
        "ops": [
            {"kind": int(op_kind(op)), "data": _b64(encode_op(op))} for op in (msg, add, identity)
        ]
    }
    cursor = encode_cursor(key_messages(CHAT, hlc.pack(), 2)).encode()
    user, chat = USER.hex().encode(), CHAT.hex().encode()
    return {
        "post-ops": b"\x00" + json.dumps(ops).encode(),
        "put-identity": b"\x01"
        + user
        + b"\n"
        + json.dumps({"data": _b64(identity.encode())}).encode(),
        "put-read": b"\x02"
        + receipt.sender.hex().encode()
        + b"\n"
        + chat
        + b"\n"
        + json.dumps({"receipt": _b64(receipt.encoded)}).encode(),
        "block": b"\x03" + b'{"peer_id": "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"}',
        "history": b"\x04" + chat + b"\n" + cursor + b"\n\x00\x03\nforward",
        "history-first": b"\x04" + chat + b"\n\n\x32\n",
        "chat-list": b"\x05" + user + b"\n\n\x0a",
        "reads-by-id": b"\x06" + chat + b"\n" + user,
        # Regression: 64 characters, but bytes.fromhex skips the spaces -> 20 bytes (was a 500).
        "regression-spaced-chat-id": b"\x04" + user + b" " * 24 + b"\n\n\x03\n",
        # Regression: a bignum version in an op's CBOR was a 500 (repr raised ValueError).
        "regression-bignum-op": b"\x00"
        + json.dumps(
            {"ops": [{"kind": 1, "data": _b64(cbor2.dumps([cbor2.CBORTag(2, b"\x01" * 2000)]))}]}
        ).encode(),
        "regression-spaced-user-id": b"\x06" + chat + b"\n" + user[:20] + b" " * 20,
    }


if __name__ == "__main__":
    main(TARGET, one_input, seeds)
