"""dm3's JSON-RPC 2.0 framing and error codes (seed 001, "RPC Error Codes"). Pure.

Every refusal is an ``RpcError`` with the seed's code; ``response``/``error_response`` build
the JSON-RPC answer objects. A request is an object with ``jsonrpc: "2.0"``, a string
``method``, an array ``params`` (dm3 passes arguments positionally) and an optional ``id``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

PARSE_ERROR = -32700  # not JSON
INVALID_REQUEST = -32600  # JSON, but not a request object
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
INVALID_INPUT = -32000  # dm3: missing or invalid parameters (an envelope that does not open)
NOT_FOUND = -32001  # dm3: requested resource not found (an unknown recipient)
UNAVAILABLE = -32002  # dm3: resource not available (this node is not the recipient's service)
UNAUTHORIZED = -32003
NOT_SUPPORTED = -32004  # dm3: method not implemented
LIMIT_EXCEEDED = -32005  # dm3: request exceeds a limit (a rate)
VERSION_NOT_SUPPORTED = -32006  # jsonrpc other than "2.0"
SPAM = -32010
TOO_BIG = -32011  # the envelope is over the service's size limit

Id = str | int | None


class RpcError(Exception):
    def __init__(self, code: int, message: str, request_id: Id = None) -> None:
        super().__init__(message)
        self.code, self.message, self.request_id = code, message, request_id


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    params: list[Any]
    id: Id


def parse_request(body: bytes) -> Request:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise RpcError(PARSE_ERROR, "Parse error: the body is not JSON") from None
    if not isinstance(data, dict):
        raise RpcError(INVALID_REQUEST, "Invalid Request: send one request object (no batches)")
    request_id = data.get("id")
    if not (request_id is None or isinstance(request_id, str | int)) or isinstance(
        request_id, bool
    ):
        raise RpcError(INVALID_REQUEST, "Invalid Request: id must be a string, number or null")
    if "jsonrpc" not in data:
        raise RpcError(INVALID_REQUEST, "Invalid Request: jsonrpc is missing", request_id)
    if data["jsonrpc"] != "2.0":
        raise RpcError(VERSION_NOT_SUPPORTED, "JSON-RPC version not supported: use 2.0", request_id)
    method, params = data.get("method"), data.get("params", [])
    if not isinstance(method, str):
        raise RpcError(INVALID_REQUEST, "Invalid Request: method must be a string", request_id)
    if not isinstance(params, list):
        raise RpcError(INVALID_PARAMS, "Invalid params: params must be an array", request_id)
    return Request(method, params, request_id)


def response(request_id: Id, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def error_response(error: RpcError) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": error.request_id,
        "error": {"code": error.code, "message": error.message},
    }
