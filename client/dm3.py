"""``chatsync dm3``: use a chatsync key with dm3 clients, through chatsync nodes.

* ``register``: publish your identity (your dm3 signing and encryption keys), create your
  dm3 inbox and make the given nodes its delivery services (admins of the inbox: they post
  the envelopes sent to you and delete what you acknowledge; ``dm3/names.py``).
* ``name``: your dm3 name (``<user id>.user.chatsync``).
* ``keys``: your dm3 ``ProfileKeys`` (JSON; secret) for a dm3 client.
"""

from __future__ import annotations

import json

import httpx
import typer

from client.commands import DEFAULT_KEY_FILE, DEFAULT_NODE, clear_errors, console, fail, load_key
from client.http import ChatsyncClient
from dm3.crypto import profile_keys, unb64
from dm3.names import inbox_proof, name_of
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
