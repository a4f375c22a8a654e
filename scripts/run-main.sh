#!/usr/bin/env bash
# The main job: set up, then run the store demo on the embedded RocksDB default.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/chatsync demo "$@"
