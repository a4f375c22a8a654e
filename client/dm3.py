"""``chatsync dm3``: use a chatsync key with dm3 clients, through chatsync nodes.

* ``register``: publish your identity (your dm3 signing and encryption keys), create your
  dm3 inbox and make the given nodes its delivery services (admins of the inbox: they post
  the envelopes sent to you and delete what you acknowledge; ``dm3/names.py``).
* ``name``: your dm3 name (``<user id>.user.chatsync``).
* ``keys``: your dm3 ``ProfileKeys`` (JSON; secret) for a dm3 client.
* ``send``: a dm3 message to a name, through a node's JSON-RPC (as any dm3 client would).
* ``inbox``: the dm3 messages waiting for you on a node, decrypted; ``--ack`` deletes them
  (on every node).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import httpx
import typer

from client.e2e import UserKey
from client.http import ChatsyncClient
from client.shell import DEFAULT_KEY_FILE, DEFAULT_NODE, clear_errors, console, fail, load_key
from dm3.crypto import encryption_keys, profile_keys, sign_text, stringify, unb64
from dm3.envelope import (
    EnvelopeError,
    build_envelope,
    check_message_signature,
    open_envelope,
    sign_message,
)
from dm3.names import UnknownName, inbox_proof, name_of, user_of, user_or_none
from store.ops import MembershipAction, Op
from store.records import Role
from store.signing import user_id_from_key

dm3_app = typer.Typer(
    help="Use your chatsync key with dm3 clients, chatsync nodes as your delivery services.",
    no_args_is_help=True,
)
KEY = typer.Option(DEFAULT_KEY_FILE, "--key", help="Your key file.")


@dm3_app.command("register")
def register(
    key_file: str = KEY,
    node: str = typer.Option(DEFAULT_NODE, "--node", help="Node HTTP URL to post to."),
    services: list[str] = typer.Option(
        None, "--service", help="A node (HTTP URL) to make your delivery service [default: --node]."
    ),
) -> None:
    """Publish your identity, create your dm3 inbox, add the delivery service nodes to it."""
    key = load_key(key_file)
    urls = services or [node]
    gateways = [_gateway_user(url) for url in urls]
    proof = inbox_proof(bytes(key.signing_key.verify_key))
    inbox = proof.chat_id()
    with clear_errors(), ChatsyncClient(node, key=key.signing_key) as client:
        client.put_identity(key.identity(client.now()))
        ops: list[Op] = [
            client.membership_op(
                key.signing_key, inbox, user, MembershipAction.ADD, Role.ADMIN, proof=proof
            )
            for user in [key.user_id, *gateways]
        ]
        client.post_ops(ops)
    console.print(f"dm3 name {name_of(key.user_id)}", soft_wrap=True)
    console.print(f"inbox {inbox.hex()}; delivery services: {', '.join(urls)}", soft_wrap=True)


def _gateway_user(url: str) -> bytes:
    try:
        response = httpx.get(f"{url.rstrip('/')}/dm3/profile", timeout=10)
        response.raise_for_status()
        return user_id_from_key(unb64(response.json()["publicSigningKey"], "publicSigningKey"))
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:  # Dm3CryptoError too
        raise fail(f"{url} gave no dm3 delivery service profile: {exc}") from None


@dm3_app.command("name")
def name(key_file: str = KEY) -> None:
    """Print your dm3 name."""
    print(name_of(load_key(key_file).user_id))


@dm3_app.command("keys")
def keys(key_file: str = KEY) -> None:
    """Print your dm3 ProfileKeys as JSON (secret: they are your key)."""
    print(json.dumps(profile_keys(load_key(key_file).signing_key), indent=2))


class Dm3Session:
    """One user's dm3 calls to one node: sign-in (``/auth/{name}``), then the token."""

    def __init__(self, url: str, key: UserKey) -> None:
        self.url, self.key = url.rstrip("/"), key
        self.name = name_of(key.user_id)
        self.http = httpx.Client(base_url=self.url, timeout=30)
        challenge = self.json("GET", f"/auth/{self.name}")["challenge"]
        signature = sign_text(key.signing_key, challenge)
        self.token = self.json("POST", f"/auth/{self.name}", json={"signature": signature})["token"]
        self.http.headers["authorization"] = f"Bearer {self.token}"

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise fail(f"{self.url}{path}: {response.status_code} {response.text[:300]}")
        return response.json()

    def call(self, method: str, *params: Any) -> Any:
        """A JSON-RPC call; its error as a one-line failure with the code."""
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}
        answer = self.json("POST", "/rpc", json=body)
        if "error" in answer:
            raise fail(f"{method}: {answer['error']['code']} {answer['error']['message']}")
        return answer["result"]


@dm3_app.command("send")
def send(
    text: str = typer.Argument(..., help="The message text."),
    to: str = typer.Option(..., "--to", help="The recipient's dm3 name."),
    key_file: str = KEY,
    node: str = typer.Option(DEFAULT_NODE, "--node", help="A delivery service of the recipient."),
) -> None:
    """Send a dm3 message: signed, encrypted for the recipient, submitted by JSON-RPC."""
    key = load_key(key_file)
    try:
        recipient = user_of(to)
    except UnknownName as exc:
        raise fail(str(exc)) from None
    with clear_errors(), ChatsyncClient(node, key=key.signing_key) as client:
        doc = client.identity_doc(recipient)
    if doc is None:
        raise fail(f"{node} holds no identity of {to}")
    session = Dm3Session(node, key)
    service = session.json("GET", "/dm3/profile")
    message = sign_message(key.signing_key, session.name, to, text, int(time.time() * 1000))
    envelope = build_envelope(
        key.signing_key, message, doc.box_key, unb64(service["publicEncryptionKey"], "key"),
        os.urandom(88),
    )  # fmt: skip
    session.call("dm3_submitMessage", stringify(envelope), session.token)
    console.print(f"sent to {to} via {node}", soft_wrap=True)


@dm3_app.command("inbox")
def inbox(
    key_file: str = KEY,
    node: str = typer.Option(DEFAULT_NODE, "--node", help="One of your delivery services."),
    ack: bool = typer.Option(False, "--ack", help="Then delete them on every node."),
) -> None:
    """Print the dm3 messages waiting for you (decrypted, senders' signatures checked)."""
    key = load_key(key_file)
    session = Dm3Session(node, key)
    envelopes = session.json("GET", f"/delivery/messages/incoming/{session.name}")
    senders: set[str] = set()
    newest = 0  # acknowledge up to what was shown, not what came in since
    with clear_errors(), ChatsyncClient(node, key=key.signing_key) as client:
        for envelope in envelopes:
            try:
                message, postmark = open_envelope(encryption_keys(key.signing_key), envelope)
                newest = max(newest, int(postmark.get("incommingTimestamp", 0)))
            except EnvelopeError as exc:
                console.print(f"[red]unreadable envelope:[/] {exc}", soft_wrap=True)
                continue
            sender = str(message["metadata"].get("from", ""))
            sender_id = user_or_none(sender)
            doc = None if sender_id is None else client.identity_doc(sender_id)
            signed = doc is not None and check_message_signature(message, doc.sign_key)
            mark = "" if signed else " [red](signature not checked)[/]"
            console.print(f"{sender}: {message.get('message', '')}{mark}", soft_wrap=True)
            senders.add(sender)
    if ack and senders:
        body = {"acknoledgments": [{"contactAddress": s} for s in sorted(senders)]}
        path = f"/delivery/messages/{session.name}/syncAcknowledgment/{newest}"
        deleted = session.json("POST", path, json=body)
        console.print(f"acknowledged: {deleted['deleted']} deleted on every node")
