"""What every user command shares: the console, a failure as one red line and an exit
status, the node and key options' defaults, hex arguments, and key files (refused when others
may read them, as ssh refuses a private key)."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from client.e2e import E2eError, UserKey, read_key_file
from client.http import ChatsyncClientError
from store.errors import InvalidInput

DEFAULT_KEY_FILE = "chatsync-user.key"
DEFAULT_NODE = "http://127.0.0.1:8080"

console = Console(highlight=False)

JSON_OPTION = typer.Option(False, "--json", help="Print JSON, every id and text whole.")


def fail(message: str, code: int = 1) -> typer.Exit:
    # soft_wrap: one line however long (rich would break ids at 80 columns when piped)
    console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


@contextmanager
def clear_errors() -> Iterator[None]:
    """Turn the errors a user can cause or meet into one line and exit status 1."""
    try:
        yield
    except ChatsyncClientError as exc:
        raise fail(str(exc)) from None
    except (InvalidInput, E2eError, ValueError, OSError) as exc:
        raise fail(str(exc)) from None


def parse_hex(value: str, length: int, what: str) -> bytes:
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise fail(f"{what} is not hex: {value!r}") from None
    if len(raw) != length:
        raise fail(f"{what} must be {2 * length} hex digits, got {len(value)}")
    return raw


def load_key(path: str) -> UserKey:
    """The key in ``path``, or one line: missing, a directory, readable by others (refused as
    ssh refuses a private key: anyone who reads it can post as you), not a key file."""
    key_path = Path(path)
    try:
        mode = key_path.stat().st_mode
    except FileNotFoundError:
        raise fail(f"no key file {path} (create one with `chatsync keygen --out {path}`)") from None
    except OSError as exc:
        raise fail(f"cannot read key file {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        what = "directory" if stat.S_ISDIR(mode) else "special file"
        raise fail(f"{path} is not a key file but a {what}")
    if mode & 0o077:
        raise fail(
            f"permissions {stat.S_IMODE(mode):04o} for '{path}' are too open: a key file must "
            f"be readable by you alone (chmod 600 {path})"
        )
    try:
        return read_key_file(key_path)
    except OSError as exc:
        raise fail(f"cannot read key file {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise fail(str(exc)) from None
