"""The HTTP API (FastAPI on hypercorn's trio worker). Errors are JSON: {"code", "message"}.

Endpoints (ids are lowercase hex in paths and JSON; bytes are URL-safe base64):

=======  ======================================  ===================================================
POST     /ops                                    submit signed ops -> 201 {"accepted", "new"}
POST     /auth/challenge, /auth/token            sign in with the user's key -> a token (auth)
GET      /chats/{chat}/messages                  history page: ?cursor=&limit=1..200&direction=
GET      /chats/{chat}/messages/{id}/delivery    per recipient: pending, delivered, read (events)
GET      /chats/{chat}/members                   active members with role and added_at
GET      /chats/{chat}/member-ops, /deletes      the signed originals, paged: ?cursor=&limit=
GET      /users/{user}/chats                     the user's chat list, newest first, with unread
GET/PUT  /users/{user}/chats/{chat}/read         read position: PUT a signed READ_RECEIPT
GET      /users/{user}/events, /delivery         what is new: ?since=TOKEN (events)
WS       /users/{user}/stream                    the same, pushed; acked frame by frame (events)
GET/PUT  /identity/{user}                        the user's identity record (PUT: the signed record)
POST     /admin/block, /admin/unblock            partition switch {"peer_id"}
GET      /status, /metrics, /health              node state, Prometheus text, liveness
GET      /debug/latency                          gossip latency quantiles, arrival logs (benchmarks)
GET      /openapi.json, /docs                    the schema and its browser
=======  ======================================  ===================================================

The package, one concern a module: ``app`` (the app, hypercorn), ``interface`` (``NodeApi``,
the narrow interface handlers have to the node), ``errors`` (every refusal and its status),
``body_limit`` (413 before parsing), ``models`` (bodies), ``decode`` (ids, base64, ops), and
one router per area: ``ops``, ``auth`` (sign-in, and who may call what), ``chats``, ``users``,
``events``, ``identity``, ``admin``, ``debug``.
Nothing is written when a request is refused, and the node keeps running. Reads run in a
worker thread (``trio.to_thread``) because RocksDB calls block; every write goes through the
node's writer.
"""

from node.api.app import create_app, serve_http
from node.api.interface import NodeApi

__all__ = ["NodeApi", "create_app", "serve_http"]
