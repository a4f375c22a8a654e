#!/usr/bin/env bash
# The main job: set up, then run a 3-node cluster on loopback (embedded RocksDB per node) through
# the scripted scenario: messages on every node, one node cut off and healed, convergence shown.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/chatsync cluster --nodes 3 --scenario "$@"
