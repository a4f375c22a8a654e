"""The mutation-testing program (scripts/mutate.py): its mutations, and a smoke run on one module.

The full run (every module of the pure core, minutes) is not part of pytest: tests/README.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from scripts.mutate import ROOT, enumerate_mutants, load_equivalents, mutated_code

SAMPLE = '''"""A docstring is not mutated."""
LIMIT = 10


def clamp(x: int, low: int = 0) -> int:
    """Nor is this one."""
    if x < low or x > LIMIT:
        return max(low, min(x, LIMIT))
    return x


def total(xs: list[int], n: int) -> int:
    out = 0
    for x in xs[:n]:
        out += x
    return out


def flagged(x: int) -> bool:
    return not x == 3  # pragma: no mutate
'''


def mutations(tmp_path: Path) -> dict[str, list[str | None]]:
    """Each mutation text -> the functions it occurs in."""
    path = tmp_path / "sample.py"
    path.write_text(SAMPLE)
    found: dict[str, list[str | None]] = {}
    for mutant in enumerate_mutants(path):
        found.setdefault(mutant.mutation, []).append(mutant.function)
    return found


def test_each_kind_of_mutation_is_generated_where_it_applies(tmp_path: Path) -> None:
    found = mutations(tmp_path)
    assert found["`x < low` -> `x <= low`"] == ["clamp"]
    assert found["`x > LIMIT` -> `x >= LIMIT`"] == ["clamp"]
    assert found["`x < low or x > LIMIT` -> `x < low and x > LIMIT`"] == ["clamp"]
    assert found["`max(low, min(x, LIMIT))` -> `min(low, min(x, LIMIT))`"] == ["clamp"]
    assert found["`return max(low, min(x, LIMIT))` -> `return None`"] == ["clamp"]
    assert found["`10` -> `11`"] == [None]  # a module-level constant
    assert found["`0` -> `1`"] == [None, "total"]  # a default runs where the def runs
    assert found["`:n` -> `:n + 1`"] == ["total"]
    assert found["`out += x` -> `out -= x`"] == ["total"]
    assert found["`out += x` -> `(deleted)`"] == ["total"]


def test_docstrings_annotations_and_no_mutate_lines_are_left_alone(tmp_path: Path) -> None:
    texts = " ".join(mutations(tmp_path))
    assert "docstring" not in texts and "Nor is this" not in texts
    assert "x == 3" not in texts  # the line says "pragma: no mutate"
    assert "int" not in texts  # annotations are types, not behaviour


def test_a_mutant_compiles_to_the_mutated_behaviour(tmp_path: Path) -> None:
    path = tmp_path / "sample.py"
    path.write_text(SAMPLE)
    (mutant,) = [m for m in enumerate_mutants(path) if m.mutation == "`x > LIMIT` -> `x >= LIMIT`"]
    original: dict[str, object] = {}
    mutated: dict[str, object] = {}
    exec(compile(SAMPLE, str(path), "exec"), original)
    exec(mutated_code(path, mutant.index), mutated)
    assert original["clamp"](10) == 10  # type: ignore[operator]
    assert mutated["clamp"](10) == 10  # the same value by another branch: equivalent here
    assert [original["clamp"](x) for x in range(-2, 14)] == [  # type: ignore[operator]
        mutated["clamp"](x)  # type: ignore[operator]
        for x in range(-2, 14)
    ]


def test_the_equivalents_file_parses_and_names_real_mutations() -> None:
    for (module, source, mutation), reason in load_equivalents().items():
        assert reason.strip(), (module, source, mutation)
        assert any(
            m.source == source and m.mutation == mutation for m in enumerate_mutants(ROOT / module)
        ), f"stale equivalent in {module}: {source} {mutation}"


def test_a_smoke_run_kills_a_broken_clock_and_writes_the_summary(tmp_path: Path) -> None:
    out = tmp_path / "mutation.json"
    command = [sys.executable, "-m", "scripts.mutate", "store/hlc.py", "--match", "_advance"]
    command += ["--tests", "tests/store/test_hlc.py", "--out", str(out)]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=300)
    entry = json.loads(out.read_text())["modules"]["store/hlc.py"]
    for name in ("mutants", "killed", "timed_out", "survived", "equivalent", "score"):
        assert isinstance(entry[name], int | float), name
    assert (
        entry["mutants"]
        == entry["killed"] + entry["timed_out"] + entry["survived"] + entry["equivalent"]
    )
    assert entry["mutants"] >= 5 and entry["sampled"]
    # A clock whose counter steps backwards is a bug the HLC tests must catch.
    survivors = {s["mutation"] for s in entry["survivors"]}
    assert "`logical + 1` -> `logical - 1`" not in survivors
    assert entry["killed"] >= 1
