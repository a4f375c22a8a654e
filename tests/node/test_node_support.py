"""The tests' in-process node starts again on another port when its HTTP port was taken
between choosing it and binding it (free_port's race), and only then."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

import node_support
from node_support import running_node


async def test_a_taken_http_port_is_retried_with_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = [taken.getsockname()[1], node_support.free_port()]
        monkeypatch.setattr(node_support, "free_port", lambda: ports.pop(0))
        async with running_node(tmp_path) as (_, http):
            assert (await http.get("/health")).status_code == 200
        assert ports == []  # the taken port was tried first


async def test_a_node_that_fails_otherwise_is_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tries = []
    monkeypatch.setattr(
        node_support, "free_port", lambda: tries.append(1) or 70_000
    )  # no such port
    with pytest.raises(BaseException) as info:
        async with running_node(tmp_path):
            pass
    assert len(tries) == 1 and not node_support._address_in_use(info.value)
