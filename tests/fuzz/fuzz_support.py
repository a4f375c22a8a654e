"""What every atheris harness shares: instrumentation, the fuzzer entry point, seed corpora.

A harness (``fuzz_<target>.py``) is a plain module with ``one_input(data: bytes)`` — the
property checked on one input — and ``seeds()`` — valid encodings to start from. Run as a
script it hands ``one_input`` to atheris (libFuzzer flags pass through: ``-runs=N``,
``-max_total_time=S``, corpus directories); imported (``test_fuzz_smoke.py``) it needs no
atheris at all. ``--write-corpus`` writes ``seeds()`` to ``corpus/<target>/``.

The project's packages are imported under ``atheris.instrument_imports()`` when the
harness runs as a fuzzer, so libFuzzer sees their branches as coverage.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

CORPUS_ROOT = Path(__file__).parent / "corpus"
PROJECT_PACKAGES = ["store", "sync", "dm3", "node"]
# One fixed "now" for every harness: drift checks must not depend on the wall clock.
NOW_MS = 1_700_000_000_000


@contextlib.contextmanager
def instrumented(active: bool) -> Iterator[None]:
    """Instrument the project's packages imported in this block (only when fuzzing)."""
    writing = "--write-corpus" in sys.argv[1:]
    if not active or writing or importlib.util.find_spec("atheris") is None:
        yield
        return
    import atheris  # type: ignore[import-untyped]

    with atheris.instrument_imports(include=PROJECT_PACKAGES):
        yield


def corpus_dir(target: str) -> Path:
    return CORPUS_ROOT / target


def read_corpus(target: str) -> list[bytes]:
    directory = corpus_dir(target)
    if not directory.is_dir():
        return []
    return [p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()]


def write_corpus(target: str, seeds: dict[str, bytes]) -> Path:
    """Replace ``corpus/<target>/`` with ``seeds`` (file name: label + content hash)."""
    directory = corpus_dir(target)
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.iterdir():
        old.unlink()
    for label, data in seeds.items():
        digest = hashlib.sha1(data).hexdigest()[:12]
        (directory / f"{label}-{digest}").write_bytes(data)
    return directory


def main(
    target: str, one_input: Callable[[bytes], None], seeds: Callable[[], dict[str, bytes]]
) -> None:
    """The harness as a script: ``--write-corpus``, or fuzz with libFuzzer's arguments."""
    if "--write-corpus" in sys.argv[1:]:
        directory = write_corpus(target, seeds())
        print(f"wrote {len(list(directory.iterdir()))} seeds to {directory}")
        return
    import atheris

    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
