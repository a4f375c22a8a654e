"""sim/scale.py: a healed partition converges within c * log2(N) + k rounds, a node's cost does
not grow with the network, and a node that uses only its bootstrap peers is caught."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.bugs import PeeringBug
from sim.cli import sim_app
from sim.scale import ScaleParams, ScaleResult, run_scale
from sim.scale_report import FLAT_MAX_RATIO, verdict
from sync.peering import EXCHANGE_MAX_PEERS

_runs: dict[int, ScaleResult] = {}


def _run(nodes: int) -> ScaleResult:
    """One run per size for the module (N=1,000 takes ~15 s)."""
    if nodes not in _runs:
        _runs[nodes] = run_scale(ScaleParams(nodes=nodes))
    return _runs[nodes]


@pytest.mark.parametrize("nodes", [100, 300, 1000])
def test_after_a_heal_every_node_holds_every_record_within_c_log2_n_plus_k_rounds(
    nodes: int,
) -> None:
    result = _run(nodes)
    assert result.converged_in_bound, (result.heal, result.bound)
    # the set model moved what the real sessions move
    assert result.sampled_sessions > 100 and result.model_mismatches == 0


def test_a_node_costs_the_same_in_100_and_in_1000_nodes() -> None:
    small, large = _run(100), _run(1000)
    for name in (
        "sessions_per_node",
        "records_per_node",
        "node_ops_per_node",
        "connections_mean",
        "bytes_per_node",
    ):
        a, b = small.steady[name], large.steady[name]
        assert max(a, b) / min(a, b) <= FLAT_MAX_RATIO, (name, a, b)
    # peer exchange: an answer names up to 32 peers the answerer reached, so it grows as books
    # fill (slower among 100 nodes) up to that cap, never with N; ~1 % of a node's bytes
    full_answer = EXCHANGE_MAX_PEERS * 120  # a peer id and one address, CBOR
    for result in (small, large):
        assert result.steady["exchange_bytes_per_node"] <= full_answer
        assert result.steady["exchange_bytes_per_node"] < 0.05 * result.steady["bytes_per_node"]
    assert large.steady["connections_max"] <= 10  # the high water, at the rounds' end


def test_a_node_that_uses_only_its_bootstrap_peers_is_caught() -> None:
    result = run_scale(ScaleParams(nodes=100, plant=PeeringBug.BOOTSTRAP_ONLY, heal_sample=1))
    assert result.heal["rounds_to_converge"] is None  # the bootstrap nodes stopped: nobody syncs
    assert result.steady["peak_degree"] >= 90  # everyone dials the three bootstrap nodes
    ok, problems = verdict([result])
    assert not ok and "not converged" in problems[0]


def test_the_scale_command_prints_the_table_and_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "scale"
    result = CliRunner().invoke(sim_app, ["scale", "--nodes", "50,100", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "heal rounds" in result.output and "OK" in result.output
    assert (out / "scale.json").exists() and (out / "scale.png").stat().st_size > 10_000
    planted = CliRunner().invoke(
        sim_app, ["scale", "--nodes", "50", "--out", str(out), "--plant", "bootstrap-only"]
    )
    assert planted.exit_code == 1 and "not converged" in planted.output
