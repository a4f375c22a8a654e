#!/usr/bin/env bash
# Set up, then lint, type-check and run every test (slow ones included).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports  # imports point down, no cycles (pyproject: [tool.importlinter])
.venv/bin/python -m pytest "$@"
