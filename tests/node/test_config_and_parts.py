"""Config layering, reconnect backoff, the Prometheus rendering."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from node.config import NodeConfig, load_config
from node.metrics import Metrics
from node.peers import backoff_delays


def test_defaults_then_toml_then_flags(tmp_path: Path) -> None:
    toml = tmp_path / "node.toml"
    toml.write_text(
        '[node]\ndata = "/srv/a"\nhttp = "127.0.0.1:9000"\nbootstrap = ["/ip4/1.2.3.4/tcp/1/p2p/x"]\n'
    )
    cfg = load_config(str(toml), {"http": "127.0.0.1:9100", "durable": None})
    assert cfg.data == "/srv/a" and cfg.http == "127.0.0.1:9100" and cfg.durable is False
    assert cfg.bootstrap == ("/ip4/1.2.3.4/tcp/1/p2p/x",)
    assert cfg.http_host_port == ("127.0.0.1", 9100)
    assert load_config(None, {}) == NodeConfig()
    assert NodeConfig(data="/d").key_path == Path("/d/node.key")


def test_unknown_keys_are_an_error(tmp_path: Path) -> None:
    toml = tmp_path / "node.toml"
    toml.write_text("[node]\ndatta = 1\n")
    with pytest.raises(ValueError, match="datta"):
        load_config(str(toml), {})


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    delay = backoff_delays(0.5, 30.0, random.Random(1))
    samples = [delay(n) for n in range(12)]
    assert all(0.5 <= s <= 30.0 for s in samples)
    assert max(samples[8:]) > max(samples[:2])  # grows
    assert len(set(samples)) == len(samples)  # jittered


def test_prometheus_rendering() -> None:
    m = Metrics()
    m.inc("gossip_rejected", reason="bad_signature", help="rejected")
    m.inc("gossip_rejected", reason="bad_signature")
    m.gauge("records", lambda: {(("domain", "messages"),): 7.0}, help="records")
    m.observe_latency(12)
    text = m.render()
    assert 'chatsync_gossip_rejected_total{reason="bad_signature"} 2' in text
    assert 'chatsync_records{domain="messages"} 7' in text
    assert "# TYPE chatsync_op_latency_ms summary" in text
    assert m.latency_quantiles()["p50"] == 12
