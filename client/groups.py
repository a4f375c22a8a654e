"""``chatsync group ...``: create a group chat and manage its members (mounted by ``cli/main.py``).

A group's id commits to its creator's key and a random nonce (``store.authz``), and every
member op carries that proof; the commands other than ``create`` fetch it from the node
(``GET /chats/{chat}/proof``). The node decides what is allowed: the creator adds and removes
anyone, with any role; an admin adds participants and removes anyone but the creator; anyone
may leave. An admin shows the creator's grant, a signature over (chat, admin): the creator
prints it with ``group grant`` (or ``group add --admin``) and the admin passes it as
``--grant HEX``. Failures are one red line and exit status 1, as in ``client.commands``.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.table import Table

from client.commands import format_ms
from client.display import dumps
from client.e2e import UserKey
from client.group_keys import GroupKeys
from client.http import ChatsyncClient, ChatsyncClientError, Member
from client.sealing import identity_ops
from client.shell import (
    DEFAULT_KEY_FILE,
    DEFAULT_NODE,
    JSON_OPTION,
    clear_errors,
    console,
    fail,
    load_key,
    parse_hex,
)
from store.authz import NONCE_LEN, AdminGrant, ChatProof, GroupProof, grant_admin, new_group
from store.keys import CHAT_ID_LEN, USER_ID_LEN
from store.messages import MAX_PAGE_LIMIT
from store.ops import MembershipAction, Op
from store.records import MsgV1, Role
from store.signing import SIGNATURE_LEN

GROUP_HELP = """Create a group chat and manage its members.

\b
Who may do what (the node checks every op):
  the creator     adds and removes anyone, as participant or admin
  an admin        adds participants, removes anyone but the creator
  anyone          leaves (group leave)

\b
Admins: the creator makes USER an admin with
  chatsync group add CHAT USER --admin     (or: chatsync group grant CHAT USER)
which prints a grant (128 hex digits, the creator's signature over the chat and USER).
USER passes it to every add and remove:
  chatsync group add CHAT OTHER --key user.key --grant HEX
A grant cannot be revoked: to demote an admin, make a new group.
"""

group_app = typer.Typer(name="group", help=GROUP_HELP, no_args_is_help=True)

KEY_OPTION = typer.Option(DEFAULT_KEY_FILE, "--key", help="Your key file.")
NODE_OPTION = typer.Option(DEFAULT_NODE, "--node", help="Node HTTP URL.")
GRANT_OPTION = typer.Option(
    None, "--grant", help="Your admin grant (hex, from the creator's `group grant`)."
)


@contextmanager
def group_errors() -> Iterator[None]:
    """``clear_errors``, and a refused member op said plainly (the node's code stays shown)."""
    with clear_errors():
        try:
            yield
        except ChatsyncClientError as exc:
            if exc.code == "unauthorized":
                raise fail(f"not allowed: {exc}") from None
            raise


def chat_arg(chat: str) -> bytes:
    return parse_hex(chat, CHAT_ID_LEN, "CHAT")


def user_arg(user: str) -> bytes:
    return parse_hex(user, USER_ID_LEN, "USER")


def parse_grant(value: str | None, key: UserKey) -> AdminGrant | None:
    """The grant a creator gave this key's user (the signature alone: the admin is us)."""
    if value is None:
        return None
    return AdminGrant(key.user_id, parse_hex(value, SIGNATURE_LEN, "--grant"))


def known_proof(client: ChatsyncClient, chat_id: bytes) -> ChatProof:
    proof = client.chat_proof(chat_id)
    if proof is None:
        raise fail(
            f"unknown chat {chat_id.hex()}: the node holds no member op of it "
            "(a wrong id, or not synced to this node yet)"
        )
    return proof


def group_proof(client: ChatsyncClient, chat_id: bytes) -> GroupProof:
    proof = known_proof(client, chat_id)
    if not isinstance(proof, GroupProof):
        raise fail(f"chat {chat_id.hex()} is a DM, not a group")
    return proof


def post_member_op(
    client: ChatsyncClient,
    key: UserKey,
    chat_id: bytes,
    user_id: bytes,
    action: MembershipAction,
    *,
    role: Role = Role.PARTICIPANT,
    grant: AdminGrant | None = None,
) -> GroupProof:
    """Sign one member op with the group's proof and post it; the proof, for what follows."""
    proof = group_proof(client, chat_id)
    op = client.membership_op(
        key.signing_key, chat_id, user_id, action, role, proof=proof, grant=grant
    )
    client.post_ops([op])
    return proof


def active_role(client: ChatsyncClient, chat_id: bytes, user_id: bytes) -> Role | None:
    """The user's role in the chat as this node has it (None: not an active member, or we
    may not read the list; the node decides the add then)."""
    try:
        rows = client.member_list(chat_id)
    except ChatsyncClientError as exc:
        if exc.code in ("not_a_member", "unknown_chat"):
            return None
        raise
    return next((m.role for m in rows if m.user_id == user_id), None)


def article(role: Role) -> str:
    return f"{'an' if role is Role.ADMIN else 'a'} {role.name.lower()}"


def say(text: str) -> None:
    console.print(text, soft_wrap=True)  # ids whole on one line, to copy


def show_grant(proof: GroupProof, key: UserKey, user_id: bytes) -> None:
    grant = grant_admin(key.signing_key, proof, user_id)
    say(f"admin grant for {user_id.hex()}:\n{grant.sig.hex()}")
    say("they pass it to `chatsync group add` and `group remove` as --grant HEX")


# --- commands ------------------------------------------------------------------------------


@group_app.command("create")
def create(
    name: str = typer.Option(
        None, "--name", help="Posted as the group's first message (nodes keep no chat names)."
    ),
    key_file: str = KEY_OPTION,
    node: str = NODE_OPTION,
) -> None:
    """Create a group (new random id) with you as its creator and admin; prints the chat id."""
    key = load_key(key_file)
    proof = new_group(key.signing_key, secrets.token_bytes(NONCE_LEN))
    chat_id = proof.chat_id()
    with group_errors(), ChatsyncClient(node, key=key.signing_key) as client:
        ops: list[Op] = [
            client.membership_op(
                key.signing_key, chat_id, key.user_id, MembershipAction.ADD, Role.ADMIN,
                proof=proof,
            )
        ]  # fmt: skip
        if name:  # after the add: its stamp is later, so the creator is a member by then
            me = [Member(key.user_id, Role.ADMIN, ops[0].hlc)]  # the node knows none yet
            sealed, stamp = GroupKeys(client, key, chat_id).seal(name.encode(), client.now, me)
            ops += [*identity_ops(client, key), *sealed.grants]
            ops.append(MsgV1.create(key.signing_key, chat_id, stamp, sealed.payload))
        client.post_ops(ops)
    say(f"created group {chat_id.hex()}")


@group_app.command("add")
def add(
    chat: str = typer.Argument(..., metavar="CHAT", help="Group chat id (hex)."),
    user: str = typer.Argument(..., metavar="USER", help="User id to add (hex)."),
    admin: bool = typer.Option(
        False, "--admin", help="Add as admin (creator only); prints their admin grant."
    ),
    history: int = typer.Option(
        0,
        "--history",
        min=0,
        max=MAX_PAGE_LIMIT,
        help="Also let them read the newest N messages (you can read) from before their add.",
    ),
    grant: str = GRANT_OPTION,
    key_file: str = KEY_OPTION,
    node: str = NODE_OPTION,
) -> None:
    """Add USER to the group (the creator, or an admin with --grant). They read what is sent
    from their add on, the group's name, and (--history N) the newest N messages before it."""
    chat_id, user_id = chat_arg(chat), user_arg(user)
    key = load_key(key_file)
    role = Role.ADMIN if admin else Role.PARTICIPANT
    with group_errors(), ChatsyncClient(node, key=key.signing_key) as client:
        if active_role(client, chat_id, user_id) is role:
            say(
                f"{user_id.hex()} is already {article(role)} of group {chat_id.hex()}: "
                "nothing to do"
            )
            return  # exit 0: what was asked for holds (as `mkdir -p`); nothing is posted
        proof = post_member_op(
            client, key, chat_id, user_id, MembershipAction.ADD,
            role=role, grant=parse_grant(grant, key),
        )  # fmt: skip
        say(f"added {user_id.hex()} as {role.name.lower()} to group {chat_id.hex()}")
        share_past(client, key, chat_id, user_id, history)
        if admin:  # the node took it, so we are the creator: the grant is ours to sign
            show_grant(proof, key, user_id)


def share_past(
    client: ChatsyncClient, key: UserKey, chat_id: bytes, user_id: bytes, newest: int
) -> None:
    """Grant a member just added the keys of the group's name (its first message) and of the
    ``newest`` messages before the add: what the group shows them of its past."""
    keys = GroupKeys(client, key, chat_id)
    if keys.box_key(user_id) is None:
        say(
            f"note: {user_id.hex()} has published no identity, so nothing sealed reaches them "
            "until they do (`chatsync publish`)"
        )
        return
    first = client.history(chat_id, limit=1, direction="forward").messages  # content only
    past = client.history(chat_id, limit=newest).messages if newest else []
    shown = [m for item in [*first, *past] for m in (item.msg, item.edit) if m is not None]
    msgs = {m.msg_id: m for m in shown}  # the first may be among the newest
    grants = keys.grant_past(user_id, list(msgs.values()), client.now)
    if grants:
        client.post_ops(list(grants))


@group_app.command("remove")
def remove(
    chat: str = typer.Argument(..., metavar="CHAT", help="Group chat id (hex)."),
    user: str = typer.Argument(..., metavar="USER", help="User id to remove (hex)."),
    grant: str = GRANT_OPTION,
    key_file: str = KEY_OPTION,
    node: str = NODE_OPTION,
) -> None:
    """Remove USER from the group (the creator, or an admin with --grant)."""
    chat_id, user_id = chat_arg(chat), user_arg(user)
    key = load_key(key_file)
    with group_errors(), ChatsyncClient(node, key=key.signing_key) as client:
        post_member_op(
            client, key, chat_id, user_id, MembershipAction.REMOVE, grant=parse_grant(grant, key)
        )
    say(f"removed {user_id.hex()} from group {chat_id.hex()}")


@group_app.command("leave")
def leave(
    chat: str = typer.Argument(..., metavar="CHAT", help="Group chat id (hex)."),
    key_file: str = KEY_OPTION,
    node: str = NODE_OPTION,
) -> None:
    """Leave the group (anyone may)."""
    chat_id = chat_arg(chat)
    key = load_key(key_file)
    with group_errors(), ChatsyncClient(node, key=key.signing_key) as client:
        post_member_op(client, key, chat_id, key.user_id, MembershipAction.LEAVE)
    say(f"left group {chat_id.hex()}")


@group_app.command("grant")
def print_grant(
    chat: str = typer.Argument(..., metavar="CHAT", help="Group chat id (hex)."),
    user: str = typer.Argument(..., metavar="USER", help="User id to make an admin (hex)."),
    key_file: str = typer.Option(DEFAULT_KEY_FILE, "--key", help="The creator's key file."),
    node: str = NODE_OPTION,
) -> None:
    """Print USER's admin grant (creator only; posts nothing, and the same grant every time)."""
    chat_id, user_id = chat_arg(chat), user_arg(user)
    key = load_key(key_file)
    with group_errors(), ChatsyncClient(node, key=key.signing_key) as client:
        proof = group_proof(client, chat_id)
    if proof.creator != key.user_id:
        raise fail(f"only the group's creator ({proof.creator.hex()}) can grant admin")
    show_grant(proof, key, user_id)


@group_app.command("members")
def members(
    chat: str = typer.Argument(..., metavar="CHAT", help="Chat id (hex)."),
    key_file: str = typer.Option(
        DEFAULT_KEY_FILE, "--key", help="Your key file: to sign in (members read the list)."
    ),
    node: str = NODE_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """The chat's active members: user, role (creator, admin, participant), when added (UTC)."""
    chat_id = chat_arg(chat)
    key = load_key(key_file)
    me = key.user_id
    with group_errors(), ChatsyncClient(node, key=key.signing_key) as client:
        proof = known_proof(client, chat_id)
        rows = client.member_list(chat_id)
    creator = proof.creator if isinstance(proof, GroupProof) else None
    if as_json:
        items = [
            {
                "user_id": m.user_id.hex(), "role": m.role.name.lower(),
                "creator": m.user_id == creator, "me": m.user_id == me,
                "added_at_ms": m.added_at.physical_ms,
            }
            for m in rows
        ]  # fmt: skip
        typer.echo(dumps({"chat_id": chat_id.hex(), "members": items}))
        return
    table = Table(title=f"chat {chat_id.hex()}", title_justify="left")
    table.add_column("user", no_wrap=True)  # whole, to copy into other commands
    table.add_column("role", no_wrap=True)
    table.add_column("added_at (UTC)", overflow="fold")
    for m in rows:
        # the creator's powers come from the chat id, not from the row's role
        role = "creator" if m.user_id == creator else m.role.name.lower()
        role += " (me)" if m.user_id == me else ""
        table.add_row(m.user_id.hex(), role, format_ms(m.added_at.physical_ms))
    if not rows:
        table.add_row("-", "no active members", "-")
    console.print(table)
