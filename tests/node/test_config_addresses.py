"""The addresses a node is given, checked before it starts: ``--listen``, ``--bootstrap`` and
``--http`` (``node/p2p/addresses.py``, ``node/config.py``), the ports probed
(``node/startup.py``), and a refusal found inside trio's exception groups (``node/run.py``)."""

from __future__ import annotations

import errno
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.config import NodeConfig, load_config, parse_http
from node.errors import InvalidAddress, PortInUse, StartupRefused
from node.p2p.addresses import ListenAddress, parse_listen, parse_peer_address
from node.run import startup_refusal
from node.startup import check_startup, refuse_taken_ports

PEER_ID = "12D3KooWK99VoVxNE7XzyBwXEzW7xhK7Gpv85r9F3V3fyKSUKPH5"


def test_listen_addresses_that_parse() -> None:
    assert parse_listen("/ip4/127.0.0.1/tcp/4001") == ListenAddress("127.0.0.1", 4001)
    assert parse_listen("/ip4/0.0.0.0/tcp/0") == ListenAddress("0.0.0.0", 0)
    assert parse_listen("/ip6/::1/tcp/65535") == ListenAddress("::1", 65535)
    assert str(parse_listen("/ip6/::1/tcp/5")) == "[::1]:5"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "not a multiaddr (no leading /)"),
        ("127.0.0.1:4001", "not a multiaddr (no leading /)"),
        ("ip4/127.0.0.1/tcp/4001", "not a multiaddr (no leading /)"),
        ("/", "not /ip4/HOST/tcp/PORT"),
        ("/ip4/127.0.0.1", "not /ip4/HOST/tcp/PORT"),
        ("/ip4/127.0.0.1/udp/4001", "not /ip4/HOST/tcp/PORT"),
        ("/tcp/4001", "not /ip4/HOST/tcp/PORT"),
        ("/dns4/localhost/tcp/4001", "not /ip4/HOST/tcp/PORT"),
        ("/ip4/127.0.0.1/tcp/4001/ws", "not /ip4/HOST/tcp/PORT"),
        ("/ip4/127.0.0.1/tcp/4001/tcp/4002", "not /ip4/HOST/tcp/PORT"),
        (f"/ip4/127.0.0.1/tcp/4001/p2p/{PEER_ID}", "not /ip4/HOST/tcp/PORT"),
        ("/ip4/127.0.0.1/tcp/", "not a multiaddr (missing value for protocol: tcp)"),
        ("/ip4/127.0.0.1/tcp/65536", "not a multiaddr (integer not in range"),
        ("/ip4/127.0.0.1/tcp/-1", "not a multiaddr (integer not in range"),
        ("/ip4/127.0.0.1/tcp/abc", "not a multiaddr (invalid base 10 integer)"),
        ("/ip4/127.0.0.1/tcp/http", "not a multiaddr (expected value for protocol tcp"),
        ("/ip4/300.1.2.3/tcp/1", "not a multiaddr (base address '300.1.2.3' is not IPv4)"),
        ("/ip4/::1/tcp/1", "not a multiaddr"),
        ("/ipx/1.2.3.4/tcp/1", "not a multiaddr (unknown protocol: ipx)"),
    ],
)
def test_malformed_listen_addresses_are_invalid(text: str, reason: str) -> None:
    with pytest.raises(InvalidAddress) as caught:
        parse_listen(text)
    assert str(caught.value).startswith(reason), str(caught.value)


def test_peer_addresses_that_parse() -> None:
    for text in (
        f"/ip4/127.0.0.1/tcp/4001/p2p/{PEER_ID}",
        f"/ip6/::1/tcp/4001/p2p/{PEER_ID}",
        f"/dns4/node.example/tcp/4001/p2p/{PEER_ID}",
    ):
        address = parse_peer_address(text)
        assert (address.text, address.peer_id) == (text, PEER_ID)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "not a multiaddr (no leading /)"),
        (PEER_ID, "not a multiaddr (no leading /)"),
        ("127.0.0.1:4001", "not a multiaddr (no leading /)"),
        ("/ip4/127.0.0.1/tcp/4001", "no /p2p/<peer id> at its end"),
        (f"/ip4/127.0.0.1/tcp/4001/p2p/{PEER_ID}/ws", "no /p2p/<peer id> at its end"),
        (f"/p2p/{PEER_ID}", "no /tcp/ port"),
        (f"/ip4/127.0.0.1/udp/4001/p2p/{PEER_ID}", "no /tcp/ port"),
        ("/ip4/127.0.0.1/tcp/4001/p2p/", "not a multiaddr (missing value for protocol: p2p)"),
        ("/ip4/127.0.0.1/tcp/4001/p2p/x", "not a multiaddr (Invalid CID: x)"),
        ("/ip4/127.0.0.1/tcp/4001/p2p/0OIl", "not a multiaddr (Invalid CID"),
        (f"/ip4/127.0.0.1/tcp/99999/p2p/{PEER_ID}", "not a multiaddr (integer not in range"),
    ],
)
def test_malformed_peer_addresses_are_invalid(text: str, reason: str) -> None:
    with pytest.raises(InvalidAddress) as caught:
        parse_peer_address(text)
    assert str(caught.value).startswith(reason), str(caught.value)


def test_http_addresses() -> None:
    assert parse_http("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_http(":8080") == ("127.0.0.1", 8080)  # an empty host: loopback
    assert parse_http("0.0.0.0:1") == ("0.0.0.0", 1)
    assert parse_http("localhost:65535") == ("localhost", 65535)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("127.0.0.1", "no port (HOST:PORT)"),
        ("8080", "no port (HOST:PORT)"),
        ("127.0.0.1:", "port '' is not a number"),
        ("127.0.0.1:http", "port 'http' is not a number"),
        ("127.0.0.1:-1", "port '-1' is not a number"),
        ("127.0.0.1:80.5", "port '80.5' is not a number"),
        ("127.0.0.1: 80", "port ' 80' is not a number"),
        ("127.0.0.1:٨٠", "port '٨٠' is not a number"),  # digits, but not ASCII ones
        ("127.0.0.1:0", "port 0 is out of range (1-65535)"),
        ("127.0.0.1:65536", "port 65536 is out of range (1-65535)"),
        ("127.0.0.1:99999999999", "port 99999999999 is out of range (1-65535)"),
    ],
)
def test_malformed_http_addresses_are_refused(text: str, reason: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_http(text)
    assert str(caught.value) == reason


def test_load_config_names_the_flag_or_the_file_key(tmp_path: Path) -> None:
    toml = tmp_path / "node.toml"
    toml.write_text('[node]\nlisten = "/ip4/127.0.0.1/udp/1"\nbootstrap = ["/ip4/1.2.3.4/tcp/1"]\n')
    with pytest.raises(StartupRefused) as caught:
        load_config(str(toml), {})
    assert str(caught.value) == (
        f"listen in {toml} '/ip4/127.0.0.1/udp/1': not /ip4/HOST/tcp/PORT or /ip6/HOST/tcp/PORT"
    )
    with pytest.raises(StartupRefused) as caught:
        load_config(str(toml), {"listen": "/ip4/127.0.0.1/tcp/1"})
    assert str(caught.value) == (
        f"bootstrap in {toml} '/ip4/1.2.3.4/tcp/1': no /p2p/<peer id> at its end"
    )
    with pytest.raises(StartupRefused) as caught:
        load_config(None, {"http": "127.0.0.1:x"})
    assert str(caught.value) == "--http '127.0.0.1:x': port 'x' is not a number"
    good = f"/ip4/1.2.3.4/tcp/1/p2p/{PEER_ID}"
    assert load_config(None, {"bootstrap": [good]}).bootstrap == (good,)
    assert load_config(None, {"http": ""}).http == ""  # no HTTP API


def test_listen_and_http_on_one_port_are_refused() -> None:
    for listen, http in [
        ("/ip4/127.0.0.1/tcp/4001", "127.0.0.1:4001"),
        ("/ip4/0.0.0.0/tcp/4001", "127.0.0.1:4001"),
        ("/ip4/127.0.0.1/tcp/4001", "0.0.0.0:4001"),
    ]:
        with pytest.raises(StartupRefused, match="use the same port"):
            load_config(None, {"listen": listen, "http": http})
    load_config(None, {"listen": "/ip4/127.0.0.1/tcp/4001", "http": "127.0.0.2:4001"})
    load_config(None, {"listen": "/ip4/127.0.0.1/tcp/4001", "http": "127.0.0.1:4002"})


def test_a_missing_or_broken_config_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StartupRefused, match="No such file or directory"):
        load_config(str(tmp_path / "absent.toml"), {})
    broken = tmp_path / "broken.toml"
    broken.write_text("[node\n")
    with pytest.raises(StartupRefused, match=re.escape(f"config {broken}: ")):
        load_config(str(broken), {})


@pytest.fixture
def listening() -> Iterator[int]:
    """A port listened on as py-libp2p does: SO_REUSEADDR and SO_REUSEPORT."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_taken_port_is_refused_even_one_shared_with_so_reuseport(listening: int) -> None:
    taken = f"/ip4/127.0.0.1/tcp/{listening}"
    with pytest.raises(StartupRefused) as caught:
        refuse_taken_ports(NodeConfig(listen=taken, http=""))
    assert str(caught.value) == f"libp2p port 127.0.0.1:{listening} is in use (listen {taken})"
    assert isinstance(caught.value, PortInUse)
    assert isinstance(caught.value.__cause__, OSError)
    assert caught.value.__cause__.errno == errno.EADDRINUSE
    with pytest.raises(StartupRefused) as caught:
        refuse_taken_ports(NodeConfig(http=f"127.0.0.1:{listening}"))
    assert str(caught.value) == f"HTTP port 127.0.0.1:{listening} is in use"
    with pytest.raises(StartupRefused) as caught:
        refuse_taken_ports(NodeConfig(http=f":{listening}"))
    assert str(caught.value) == f"HTTP port 127.0.0.1:{listening} is in use (http :{listening})"


def test_port_zero_and_a_port_in_time_wait_pass() -> None:
    """A node restarted on its ports finds them in TIME_WAIT (its last run closed
    connections first): free, though a bind without SO_REUSEADDR fails."""
    refuse_taken_ports(NodeConfig(listen="/ip4/127.0.0.1/tcp/0", http=""))
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            accepted, _ = server.accept()
            accepted.close()  # the server's side closes first: TIME_WAIT on its port
    with socket.socket() as plain, pytest.raises(OSError) as caught:
        plain.bind(("127.0.0.1", port))
    assert caught.value.errno == errno.EADDRINUSE  # the TIME_WAIT is there
    refuse_taken_ports(NodeConfig(listen=f"/ip4/127.0.0.1/tcp/{port}", http=""))
    refuse_taken_ports(NodeConfig(http=f"127.0.0.1:{port}"))


def test_an_address_not_ours_is_refused() -> None:
    # TEST-NET-1 (RFC 5737): on no interface of this machine
    with pytest.raises(StartupRefused, match=r"libp2p address 192\.0\.2\.1:0 cannot be bound: "):
        refuse_taken_ports(NodeConfig(listen="/ip4/192.0.2.1/tcp/0", http=""))


def test_a_config_made_in_code_is_checked_too() -> None:
    with pytest.raises(StartupRefused) as caught:
        check_startup(NodeConfig(bootstrap=("/ip4/1.2.3.4/tcp/1",), http=""))
    assert str(caught.value) == "bootstrap '/ip4/1.2.3.4/tcp/1': no /p2p/<peer id> at its end"


def test_a_refusal_is_found_inside_exception_groups() -> None:
    refused = StartupRefused("data directory x is in use by another process")
    nested = BaseExceptionGroup("outer", [BaseExceptionGroup("inner", [refused])])
    assert startup_refusal(nested) is refused
    assert startup_refusal(ExceptionGroup("mixed", [refused, KeyError("a bug")])) is None
    assert startup_refusal(ExceptionGroup("other", [KeyError("a bug")])) is None
