#!/usr/bin/env bash
# dm3 interop (issue 17, docs/DM3.md) on a local 3-node cluster:
#
#   1. a dm3 client made of the real dm3 libraries (npm, tests/interop/dm3) submits an envelope
#      to node N0 by JSON-RPC; N0 is killed; Bob's dm3 client falls back to N1 (the libraries'
#      own fallback to the next delivery service), fetches, decrypts, checks Alice's signature
#      and N0's postmark, and acknowledges — and the envelope is gone from N2 as well;
#   2. the same with the chatsync CLI: `chatsync dm3 send` to N1, `chatsync dm3 inbox` read on N2
#      (any replica), acknowledged on N1 (one of Bob's delivery services; N2 may not delete).
#
# Needs Node.js 20 + npm (installs the pinned packages with `npm ci`).
# Usage: scripts/demo-dm3.sh          (KEEP=1 keeps the temp dir; it is kept on failure)
# Prints a PASS/FAIL line per claim; exit status 1 if a claim failed.
set -euo pipefail
cd "$(dirname "$0")/.."

DEMO=dm3
# shellcheck source=scripts/demo_lib.sh
source scripts/demo_lib.sh
INTEROP=$ROOT/tests/interop/dm3

js() { # COMMAND: the dm3 libraries' client, its JSON lines printed
    printf '$ node dm3_client.js %s config.json\n' "$1"
    RC=0
    OUT=$(cd "$INTEROP" && node dm3_client.js "$1" "$WORK/config.json" 2>/dev/null) || RC=$?
    grep -v '"level"' <<<"$OUT" | sed 's/^/    /'
}

inbox_count() { # NODE_INDEX: envelopes waiting for Bob there (signed in as Bob)
    "$PY" - "${URLS[$1]}" "$KEYS/bob.key" <<'PY'
import sys
from pathlib import Path
from client.dm3 import Dm3Session
from client.e2e import read_key_file
session = Dm3Session(sys.argv[1], read_key_file(Path(sys.argv[2])))
print(len(session.json("GET", f"/delivery/messages/incoming/{session.name}")))
PY
}

wait_inbox() { # NODE_INDEX COUNT
    local t0=$SECONDS
    until [[ $(inbox_count "$1") == "$2" ]]; do
        ((SECONDS - t0 > WAIT_S)) && return 1
        sleep 0.5
    done
}

header "start three nodes; install the dm3 libraries (npm ci)"
start_nodes
(cd "$INTEROP" && npm ci --no-audit --no-fund --silent)

header "Alice and Bob register: Bob's delivery services are N0 and N1"
for who in alice bob mallory; do
    cs_quiet keygen --out "$KEYS/$who.key"
done
cs dm3 register --key "$KEYS/alice.key" --node "${URLS[0]}"
cs_quiet dm3 register --key "$KEYS/mallory.key" --node "${URLS[0]}"  # the hostile sender of claim 1
cs dm3 register --key "$KEYS/bob.key" --node "${URLS[0]}" --service "${URLS[0]}" --service "${URLS[1]}"
BOB=$("${CHATSYNC[@]}" dm3 name --key "$KEYS/bob.key")
"$PY" - "$WORK/config.json" "${URLS[0]}" "${URLS[1]}" "$KEYS" <<'PY'
import json, subprocess, sys
config, a, b, keys = sys.argv[1:]
def user(who):
    run = lambda *args: subprocess.run([sys.executable, "-m", "cli.main", "dm3", *args, "--key", f"{keys}/{who}.key"], capture_output=True, text=True, check=True).stdout
    return {"name": run("name").strip(), "keys": json.loads(run("keys"))}
import httpx
services = {"node-a.ds": httpx.get(f"{a}/dm3/profile").json(), "node-b.ds": httpx.get(f"{b}/dm3/profile").json()}
text = "gm Bob: sent to N0 by dm3's own libraries"
json.dump({"alice": user("alice"), "bob": user("bob"), "mallory": user("mallory"), "nodeA": a,
           "services": services, "text": text, "strangerName": "07" * 20 + ".user.chatsync"}, open(config, "w"))
PY

# --- claim 1 ----------------------------------------------------------------------------------
header "claim 1: submitted to N0 by a dm3 client, fetched from N1 after N0 died"
js submit
check "dm3-lib-messaging's envelope accepted by N0 (and 14 hostile requests refused)" test "$RC" = 0
check "the envelope reached N1" wait_inbox 1 1
check "and N2" wait_inbox 2 1
note "kill -9 N0"
kill -KILL "${NODE_PIDS[0]}"
wait "${NODE_PIDS[0]}" 2>/dev/null || true
js fetch
check "Bob's dm3 client fell back to N1, decrypted it, checked the signatures, acknowledged" test "$RC" = 0
check "acknowledged on N1: gone from N2 too" wait_inbox 2 0
claim_result 1 "a dm3 envelope sent to one node survives its loss and is read from another"

# --- claim 2 ----------------------------------------------------------------------------------
header "claim 2: the chatsync CLI as a dm3 client"
cs dm3 send "and one through the CLI" --to "$BOB" --key "$KEYS/alice.key" --node "${URLS[1]}"
check "sent through N1" test "$RC" = 0
check "waiting on N2" wait_inbox 2 1
cs dm3 inbox --key "$KEYS/bob.key" --node "${URLS[2]}"
check "read on N2 (any replica serves it), Alice's signature checked" out_has ": and one through the CLI"
check "no warning about the signature" not out_has "signature not checked"
cs dm3 inbox --key "$KEYS/bob.key" --node "${URLS[2]}" --ack
check "N2 is not one of Bob's delivery services: it may not delete for him" out_has "not_a_delivery_service"
cs dm3 inbox --key "$KEYS/bob.key" --node "${URLS[1]}" --ack
check "acknowledged on N1" out_has "1 deleted on every node"
check "gone from N2" wait_inbox 2 0
claim_result 2 "chatsync dm3 send / inbox speak the same protocol"

header "result"
printf '%s\n' "${RESULTS[@]}"
if ((${#FAILED_CLAIMS[@]})); then
    echo "FAIL: claim(s) ${FAILED_CLAIMS[*]}"
    exit 1
fi
echo "PASS: all 2 claims"
