"""What storing a gossiped op costs is measured on ops a real store keeps: a measure of ops it
held back (no add op for their sender) is refused, not reported."""

from __future__ import annotations

import pytest

from bench.gossip_bench import Signer
from bench.store_floor import store_us_per_op
from store import Hlc


def test_storing_costs_cpu_per_op_and_every_op_is_stored() -> None:
    signer = Signer(authors=4, chats=3, payload=200)
    ops = [signer.sign(n, Hlc(1_800_000_000_000 + n)) for n in range(600)]
    assert store_us_per_op(signer.joins, list(ops), per_message=64) > 0
    with pytest.raises(ValueError, match="stored 0 of 600 ops"):
        store_us_per_op([], list(ops), per_message=64)  # no adds: every message waits
