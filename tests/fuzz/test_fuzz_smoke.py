"""Every fuzz harness's property on its seed corpus and a few thousand seeded random inputs.

No atheris needed: the harnesses' ``one_input`` is plain Python. The real runs (a million
inputs per target, coverage-guided) are ``scripts/fuzz.sh``; see docs/TESTING.md, "Fuzzing".
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable
from types import ModuleType

import pytest

from fuzz_support import read_corpus

TARGETS = ["records", "frames", "sync_session", "ops", "http", "dm3"]
RANDOM_INPUTS = 2000


def harness(target: str) -> ModuleType:
    return importlib.import_module(f"fuzz_{target}")


def mutate(rnd: random.Random, data: bytes) -> bytes:
    """A few byte flips, insertions, deletions and splices — libFuzzer's simplest moves."""
    raw = bytearray(data)
    for _ in range(rnd.randint(1, 6)):
        move = rnd.randrange(5)
        at = rnd.randrange(len(raw) + 1)
        if move == 0 and raw:
            raw[min(at, len(raw) - 1)] ^= 1 << rnd.randrange(8)
        elif move == 1:
            raw[at:at] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 4)))
        elif move == 2:
            del raw[at : at + rnd.randint(1, 8)]
        elif move == 3 and raw:
            raw[min(at, len(raw) - 1)] = rnd.choice((0, 0x17, 0x18, 0x40, 0x80, 0x9F, 0xFF))
        else:
            raw = raw[:at]  # truncation
    return bytes(raw)


def inputs(target: str, count: int) -> list[bytes]:
    rnd = random.Random(f"fuzz-smoke-{target}")
    corpus = read_corpus(target)
    out = list(corpus)
    for i in range(count):
        if i % 4 == 0 or not corpus:
            out.append(bytes(rnd.randrange(256) for _ in range(rnd.randrange(64))))
        else:
            out.append(mutate(rnd, rnd.choice(corpus)))
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_the_corpus_holds_every_current_seed(target: str) -> None:
    """Seeds are valid encodings made by the code: regenerate them if a format changes."""
    corpus = set(read_corpus(target))
    seeds: dict[str, bytes] = harness(target).seeds()
    stale = sorted(label for label, data in seeds.items() if data not in corpus)
    assert not stale, f"run: python tests/fuzz/fuzz_{target}.py --write-corpus ({stale})"


@pytest.mark.parametrize("target", TARGETS)
def test_no_input_crashes_the_harness(target: str) -> None:
    one_input: Callable[[bytes], None] = harness(target).one_input
    for data in inputs(target, RANDOM_INPUTS):
        try:
            one_input(data)
        except Exception as exc:
            raise AssertionError(f"{target} crashed on {data!r}") from exc
