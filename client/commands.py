"""The user commands of ``chatsync``: keygen, publish, send, history, chats, status (mounted
by ``cli/main.py``).

They talk to a node over HTTP (``client.http``). Messages are signed with the
user's ed25519 key from the key file; DMs (``send --to``) are end-to-end
encrypted to the recipient's published box key (``client.e2e``); ``send --chat``
posts the text as it is (encrypting for a group is the client's business).
Every failure — node unreachable, a refusal, a bad key file — is one red line
and exit status 1, never a traceback (``client.shell``); a post the node holds (not shown) is
one line and exit status 3 (``client.posting``). The read commands show what they read
through ``client.display`` (short ids and previews on screen, everything whole with ``--json``).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import base58
import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from client.display import SHORT_ID, dumps, msg_json, preview, short
from client.e2e import (
    E2eError,
    UserKey,
    decode_envelope,
    open_dm,
    seal_dm,
    write_key_file,
)
from client.group_e2e import Undecryptable, is_group_sealed
from client.group_keys import BoxKeys, GroupKeys
from client.http import ChatsyncClient, ChatsyncClientError, Message
from client.posting import FILE_OPTION, TEXT_HELP, member_errors, message_text, post_shown
from client.sealing import identity_ops, open_reaction_key, seal_text
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
from store.authz import DmProof
from store.keys import CHAT_ID_LEN, USER_ID_LEN
from store.kinds import Tombstone, decode_reaction
from store.ops import Op
from store.reads import UNREAD_CAP
from store.records import MessageKind, MsgV1, dm_chat_id

# --- commands ------------------------------------------------------------------------------


def keygen(
    out: str = typer.Option(DEFAULT_KEY_FILE, "--out", help="Key file to create (mode 0600)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing key file."),
) -> None:
    """Create a user key (ed25519 seed) and print the user id derived from it."""
    key = UserKey.generate()
    try:
        write_key_file(Path(out), key, force=force)
    except FileExistsError:
        raise fail(f"{out} exists; pass --force to overwrite it (the old key is lost)") from None
    except OSError as exc:
        raise fail(str(exc)) from None
    console.print(f"user id [bold]{key.user_id.hex()}[/]  (key in {escape(out)})")


def publish(
    key_file: str = typer.Option(DEFAULT_KEY_FILE, "--key", help="Your key file."),
    node: str = typer.Option(DEFAULT_NODE, "--node", help="Node HTTP URL."),
    home: list[str] = typer.Option(
        [],
        "--home",
        help="A home node's peer id (repeatable): nodes run with --scope auto serve you.",
    ),
) -> None:
    """Publish your identity (signing and box keys, home nodes) so others can send you DMs."""
    key = load_key(key_file)
    home_nodes = [peer_id_bytes(p) for p in home]
    with clear_errors(), ChatsyncClient(node, key=key.signing_key) as client:
        new = client.put_identity(key.identity(client.now(), home_nodes))
    console.print(f"identity of {key.user_id.hex()} {'published' if new else 'already current'}")


def peer_id_bytes(text: str) -> bytes:
    """A peer id as libp2p prints it (base58) -> its bytes, as a home-node list holds them."""
    try:
        return base58.b58decode(text.strip())
    except ValueError:
        raise fail(f"--home {text!r}: a peer id in base58, as `chatsync status` shows it") from None


def send(
    text: str = typer.Argument(None, help=TEXT_HELP),
    key_file: str = typer.Option(DEFAULT_KEY_FILE, "--key", help="Your key file."),
    node: str = typer.Option(DEFAULT_NODE, "--node", help="Node HTTP URL."),
    to: str = typer.Option(None, "--to", help="Recipient user id (hex): an encrypted DM."),
    chat: str = typer.Option(
        None, "--chat", help="Chat id (hex): sealed for its members (a group) or the other party."
    ),
    plain: bool = typer.Option(
        False, "--plain", help="Send the text as is, readable by every node (--chat only)."
    ),
    file: str = FILE_OPTION,
) -> None:
    """Sign and send a message, end-to-end encrypted: a DM to --to, or to --chat's members
    (the group's keys follow its members: SECURITY.md, "Group encryption").
    Exit status 3 when the node holds it (no add of you to the chat known there yet)."""
    if (to is None) == (chat is None):
        raise fail("give exactly one of --to USER or --chat CHAT")
    if plain and to is not None:
        raise fail("--plain is for --chat: a DM is always encrypted")
    content = message_text(text, file)
    key = load_key(key_file)
    with clear_errors(), ChatsyncClient(node, key=key.signing_key) as client:
        if to is not None:
            recipient = parse_hex(to, USER_ID_LEN, "--to")
            chat_id, payload, ops = prepare_dm(client, key, recipient, content)
            stamp = client.now()
        else:
            chat_id = parse_hex(chat, CHAT_ID_LEN, "--chat")
            with member_errors(client, chat_id):
                sealed = seal_text(client, key, chat_id, content, plain=plain)
            payload, ops, stamp = sealed.payload, list(sealed.before), sealed.hlc
        msg = MsgV1.create(key.signing_key, chat_id, stamp, payload)
        post_shown(client, [*ops, msg])
    what = "encrypted DM" if to is not None else "message"
    console.print(
        f"sent {what} [bold]{msg.msg_id.hex()}[/] in chat {chat_id.hex()}"
        + (" (plain: every node reads it)" if plain else ""),
        soft_wrap=True,
    )


def prepare_dm(
    client: ChatsyncClient, key: UserKey, recipient: bytes, text: bytes
) -> tuple[bytes, bytes, list[Op]]:
    """The DM chat id, the sealed payload, and the ops a first contact needs first."""
    doc = client.identity_doc(recipient)
    if doc is None:
        raise fail(
            f"user {recipient.hex()} has not published an identity on this node "
            "(they can run `chatsync publish`), so there is no key to encrypt to"
        )
    chat_id = dm_chat_id(key.user_id, recipient)
    ops = identity_ops(client, key)
    try:
        members = set(client.members(chat_id))
    except ChatsyncClientError as exc:  # a DM no member op names yet: nobody may read it
        if exc.code != "not_a_member":
            raise
        members = set()
    proof = DmProof(key.user_id, recipient)
    for user in sorted({key.user_id, recipient} - members):
        ops.append(client.membership_op(key.signing_key, chat_id, user, proof=proof))
    return chat_id, seal_dm(key, doc.box_key, text), ops


def history(
    chat: str = typer.Option(..., "--chat", help="Chat id (hex)."),
    node: str = typer.Option(DEFAULT_NODE, "--node", help="Node HTTP URL."),
    key_file: str = typer.Option(
        DEFAULT_KEY_FILE, "--key", help="Your key file: to sign in (members read), decrypt DMs."
    ),
    limit: int = typer.Option(20, "--limit", min=1, max=200, help="Messages per page."),
    direction: str = typer.Option(
        "backward", "--direction", help="backward (newest first) | forward."
    ),
    cursor: str = typer.Option(None, "--cursor", help="next_cursor of a previous page."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Show one page of a chat's history (you must be a member); decrypt the DMs to you.
    Ids are cut to 12 hex digits and texts to a preview; --json gives both whole."""
    if direction not in ("backward", "forward"):
        raise fail("--direction is backward or forward")
    chat_id = parse_hex(chat, CHAT_ID_LEN, "--chat")
    key = load_key(key_file)
    with clear_errors(), ChatsyncClient(node, key=key.signing_key) as client:
        page = client.history(chat_id, cursor=cursor, limit=limit, direction=direction)
        render = Reader(client, key)
        rows = [(m.msg.hlc, m) for m in page.messages] + [(t.hlc, t) for t in page.tombstones]
        rows.sort(key=lambda row: row[0], reverse=direction == "backward")
        shown = [(item, None if isinstance(item, Tombstone) else render(item)) for _, item in rows]
        reactions = {m.id: render.reactions(m) for _, m in rows if isinstance(m, Message)}
    if as_json:
        items = [history_json(item, text, reactions) for item, text in shown]
        typer.echo(
            dumps({"chat_id": chat_id.hex(), "messages": items, "next_cursor": page.next_cursor})
        )
        return
    table = Table(title=f"chat {chat_id.hex()}", title_justify="left")
    for column in ("seq", "id", "time (UTC)", "sender", "kind", "text"):
        table.add_column(column, overflow="fold")
    for item, text in shown:
        if isinstance(item, Tombstone):
            table.add_row(
                "", short(item.msg_id), format_ms(item.hlc.physical_ms), who(item.sender, key),
                "deleted", Text(f"[deleted by {who(item.deleted_by, key)}]"),
            )  # fmt: skip
            continue
        m = item.msg
        line = preview(text or "") + (" (edited)" if item.edit is not None else "")
        if item.reactions:
            line += "  " + reactions_text(reactions[item.id])
        table.add_row(
            str(item.seq), short(m.msg_id), format_ms(m.hlc.physical_ms), who(m.sender, key),
            MessageKind(m.kind).name.lower(), Text(line),
        )  # fmt: skip
    console.print(table)
    if page.next_cursor:
        console.print(Text(f"more: --cursor {page.next_cursor}"))


def history_json(
    item: Message | Tombstone,
    text: str | None,
    reactions: dict[bytes, dict[str, tuple[bytes, ...]]],
) -> dict[str, Any]:
    if isinstance(item, Tombstone):
        return {
            "id": item.msg_id.hex(), "kind": "deleted", "sender": item.sender.hex(),
            "time_ms": item.hlc.physical_ms, "deleted_by": item.deleted_by.hex(),
            "deleted_at_ms": item.deleted_at.physical_ms,
        }  # fmt: skip
    shown = {k: [u.hex() for u in us] for k, us in reactions.get(item.id, {}).items()}
    return {
        **msg_json(item.msg, text), "seq": item.seq, "edited": item.edit is not None,
        "reactions": shown,
    }  # fmt: skip


def chats(
    key_file: str = typer.Option(DEFAULT_KEY_FILE, "--key", help="Your key file."),
    node: str = typer.Option(DEFAULT_NODE, "--node", help="Node HTTP URL."),
    limit: int = typer.Option(50, "--limit", min=1, max=200, help="Chats per page."),
    cursor: str = typer.Option(None, "--cursor", help="next_cursor of a previous page."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Your chats, newest first, with what is unread: counted from your signed read receipts
    (``chatsync read``), so every node shows the same numbers."""
    key = load_key(key_file)
    with clear_errors(), ChatsyncClient(node, key=key.signing_key) as client:
        page = client.chats(key.user_id, cursor=cursor, limit=limit)
    if as_json:
        typer.echo(dumps(page))
        return
    table = Table(title=f"chats of {key.user_id.hex()}", title_justify="left")
    # no preview column: the node never reads a message's content, so it has none to give
    for column in ("chat", "kind", "unread", "last (UTC)", "last id", "from"):
        table.add_column(column, overflow="fold")
    for c in page["chats"]:
        unread = f"{UNREAD_CAP - 1}+" if c["unread"] >= UNREAD_CAP else str(c["unread"])
        table.add_row(
            c["chat_id"], c["kind"], unread, format_ms(c["last_ts"]), c["last_msg_id"][:SHORT_ID],
            who(bytes.fromhex(c["last_sender"]), key),
        )  # fmt: skip
    console.print(table)
    if page["next_cursor"]:
        console.print(Text(f"more: --cursor {page['next_cursor']}"))


def reactions_text(reactions: dict[str, tuple[bytes, ...]]) -> str:
    """``+1 2  ok 1``: each reaction and how many users reacted with it."""
    return "  ".join(f"{k} {len(users)}" for k, users in reactions.items())


def who(user: bytes, key: UserKey | None) -> str:
    return "me" if key is not None and user == key.user_id else user.hex()[:12]


class Reader:
    """What a user is shown of the messages they may read: DMs and group messages opened with
    their keys (anything else as text, or its size), and group reactions opened too. Keys
    are read from the node once per chat, and again when a message names a newer one (a
    long ``watch`` sees epochs start)."""

    def __init__(self, client: ChatsyncClient, key: UserKey | None) -> None:
        self.client, self.key = client, key
        self._box_keys = None if key is None else BoxKeys(client, key)
        self._groups: dict[bytes, GroupKeys] = {}

    def __call__(self, item: Message) -> str:
        shown = item.edit if item.edit is not None else item.msg  # the latest edit's place
        payload = shown.payload
        if is_group_sealed(payload):
            return self._open_group(shown)
        try:
            decode_envelope(payload)
        except E2eError:
            try:
                return payload.decode("utf-8")
            except UnicodeDecodeError:
                return f"[{len(payload)} bytes]"
        if self.key is None:
            return f"[encrypted DM, {len(payload)} bytes]"
        assert self._box_keys is not None  # a key: the reader's own box key is known
        box_key = self._box_keys(item.msg.sender)
        if box_key is None:
            return "[encrypted DM; the sender has no identity here]"
        try:
            return open_dm(self.key, payload, box_key).decode("utf-8", errors="replace")
        except E2eError as exc:
            return f"[cannot decrypt: {exc}]"

    def reaction(self, target: MsgV1 | None, key: bytes) -> str:
        """A reaction's key as text (sealed ones opened with their target's key)."""
        if target is None or self.key is None or not is_group_sealed(target.payload):
            return key.decode(errors="replace")
        return open_reaction_key(self._keys(target.chat_id), target, key)

    def reactions(self, item: Message) -> dict[str, tuple[bytes, ...]]:
        """A message's reactions as text with their users (keys that show alike, such as two
        that do not open, are counted together)."""
        shown: dict[str, tuple[bytes, ...]] = {}
        for key, users in item.reactions.items():
            text = self.reaction(item.msg, key)
            shown[text] = shown.get(text, ()) + users
        return shown

    def reaction_of(self, msg: MsgV1) -> tuple[bool, str]:
        """A REACTION message: (reacts — False for a retraction, its reaction as text)."""
        reacts, key = decode_reaction(msg.payload)
        target = None
        if msg.ref is not None and self.key is not None:
            try:
                target = self.client.message(msg.chat_id, msg.ref)
            except ChatsyncClientError:
                target = None  # deleted, or not readable here: shown as it is
        return reacts, self.reaction(target, key)

    def _open_group(self, msg: MsgV1) -> str:
        if self.key is None:
            return f"[encrypted, {len(msg.payload)} bytes]"
        for fresh in (False, True):
            try:
                return self._keys(msg.chat_id, fresh=fresh).open(msg).decode(errors="replace")
            except Undecryptable:
                continue  # grants read before this message's: read them again, once
            except E2eError as exc:
                return f"[cannot decrypt: {exc}]"
        return "[encrypted: no key for it reached you]"

    def _keys(self, chat_id: bytes, *, fresh: bool = False) -> GroupKeys:
        assert self.key is not None
        if fresh or chat_id not in self._groups:
            self._groups[chat_id] = GroupKeys(self.client, self.key, chat_id, self._box_keys)
        return self._groups[chat_id]


def status(
    node: str = typer.Option(DEFAULT_NODE, "--node", help="Node HTTP URL."),
    as_json: bool = JSON_OPTION,
) -> None:
    """The node's peer id, peers, Merkle root and record count per domain, last sync per peer."""
    with clear_errors(), ChatsyncClient(node) as client:
        info = client.status()
    if as_json:
        typer.echo(dumps(info))
        return
    console.print(status_tables(info))


def status_tables(info: dict[str, Any]) -> Table:
    grid = Table.grid(padding=(0, 1))
    summary = Table(show_header=False, title="node", title_justify="left")
    summary.add_column("what", no_wrap=True)
    summary.add_column("value", overflow="fold")
    summary.add_row("peer id", str(info.get("peer_id", "")))
    summary.add_row("listen", "\n".join(info.get("listen", [])) or "-")
    summary.add_row("connected peers", "\n".join(info.get("connected_peers", [])) or "none")
    summary.add_row("blocked peers", "\n".join(info.get("blocked_peers", [])) or "none")
    summary.add_row("durable", str(info.get("durable", "")))
    grid.add_row(summary)
    domains = Table(title="domains", title_justify="left")
    for column in ("domain", "records", "merkle root"):
        domains.add_column(column, overflow="fold")
    for name, d in info.get("domains", {}).items():
        domains.add_row(name, str(d.get("count")), str(d.get("root")))
    grid.add_row(domains)
    syncs = Table(title="last sync per peer", title_justify="left")
    for column in ("peer", "role", "result", "when (UTC)", "ms", "applied"):
        syncs.add_column(column, overflow="fold")
    for peer, o in sorted(info.get("last_sync", {}).items()):
        result = escape(o.get("error") or ("converged" if o.get("converged") else "not converged"))
        syncs.add_row(
            peer, str(o.get("role")), result, format_ms(int(o.get("started_ms", 0))),
            f"{o.get('duration_ms', 0):.0f}", str(o.get("records_applied")),
        )  # fmt: skip
    if not info.get("last_sync"):
        syncs.add_row("-", "-", "no sync yet", "-", "-", "-")
    grid.add_row(syncs)
    return grid


def format_ms(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def register(app: typer.Typer) -> None:
    app.command("keygen")(keygen)
    app.command("publish")(publish)
    app.command("send")(send)
    app.command("history")(history)
    app.command("chats")(chats)
    app.command("status")(status)
