"""A cluster's ports lie below the kernel's range for outgoing connections, are free when
handed out and never handed out twice: a node started later must find its port unbound even
though the nodes before it have dialled their peers in between."""

from __future__ import annotations

import socket

import pytest

from cluster import local
from cluster.local import LOWEST_PORT, _ephemeral_low, free_port


def test_ports_are_below_the_ephemeral_range_and_never_repeat() -> None:
    ports = [free_port() for _ in range(400)]
    assert len(set(ports)) == len(ports)
    assert all(LOWEST_PORT <= port < _ephemeral_low() for port in ports)


def test_an_outgoing_connection_never_holds_a_handed_out_port() -> None:
    chosen = {free_port() for _ in range(50)}
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(200)
        clients = []
        try:
            for _ in range(200):  # each takes a local port from the ephemeral range
                client = socket.create_connection(server.getsockname())
                clients.append(client)
            local_ports = {client.getsockname()[1] for client in clients}
        finally:
            for client in clients:
                client.close()
    assert not local_ports & chosen
    assert all(port >= _ephemeral_low() for port in local_ports)


def test_a_taken_port_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        taken_port = taken.getsockname()[1]
        other = free_port()
        local._handed_out.discard(other)  # so it may be handed out again, below
        draws = iter([taken_port, other])
        monkeypatch.setattr(local.random, "randrange", lambda low, high: next(draws))
        monkeypatch.setattr(local, "LOWEST_PORT", 1_024)
        monkeypatch.setattr(local, "_ephemeral_low", lambda: 65_536)
        assert free_port() == other
