#!/usr/bin/env bash
# Edits, reactions and deletes (issue 15, MESSAGES.md) on a local 3-node cluster, through the
# user CLI (`chatsync group`, `send`, `edit`, `react`, `delete`, `history`):
#
#   1. a post, its edit, reactions and a retraction: every node shows the same folded view;
#   2. a delete while one node is partitioned — which meanwhile takes a reaction to the deleted
#      post —, then the heal: every node shows the tombstone, none the text, the edit or the
#      reaction, and the payload's bytes are in no file of any node's data directory.
#
# The harness (scripts/demo_lib.sh) starts the nodes, prints each command as a reader would type
# it, cuts a node off with the partition switch (POST /admin/block) and polls the histories.
#
# Usage: scripts/demo-kinds.sh          (KEEP=1 keeps the temp dir; it is kept on failure)
# Prints a PASS/FAIL line per claim; exit status 1 if a claim failed.
set -euo pipefail
cd "$(dirname "$0")/.."

DEMO=kinds
CONVERGED_DOMAINS="messages members deletes"
# shellcheck source=scripts/demo_lib.sh
source scripts/demo_lib.sh

files_holding() { # NODE_INDEX TEXT: the node's data files holding TEXT's bytes
    grep -rlaF -- "$2" "$WORK/node$1" 2>/dev/null || true
}

no_file_holds() { # NODE_INDEX TEXT
    local found
    found=$(files_holding "$1" "$2")
    [[ -z $found ]] || { printf '    N%s: %s\n' "$1" "$found"; return 1; }
}

header "Setup: keys, identities, a group of two"
cs keygen --out "$KEYS/alice.key"
cs keygen --out "$KEYS/bob.key"
BOB=$(user_of)
for who in alice bob; do
    cs publish --key "$KEYS/$who.key" --node "${URLS[0]}"
done
cs group create --name "kinds demo" --key "$KEYS/alice.key" --node "${URLS[0]}"
GROUP=$(grep -oE '[0-9a-f]{64}' <<<"$OUT" | head -1)
[[ -n $GROUP ]] || { echo "no group id in the output of group create" >&2; exit 1; }
cs group add "$GROUP" "$BOB" --key "$KEYS/alice.key" --node "${URLS[0]}"
wait_listed "$BOB"

# --- claim 1 ----------------------------------------------------------------------------------

header "Claim 1: a post, its edit, reactions and a retraction: the same view on every node"
SECRET="alice's first draft $RANDOM$RANDOM"
EDITED="alice's second draft $RANDOM$RANDOM"
cs send "$SECRET" --key "$KEYS/alice.key" --node "${URLS[0]}" --chat "$GROUP"
POST=$(grep -oE 'message [0-9a-f]{64}' <<<"$OUT" | grep -oE '[0-9a-f]{64}')
cs edit "$POST" "$EDITED" --key "$KEYS/alice.key" --node "${URLS[1]}" --chat "$GROUP"
cs react "$POST" "+1" --key "$KEYS/bob.key" --node "${URLS[2]}" --chat "$GROUP"
cs react "$POST" "+1" --key "$KEYS/alice.key" --node "${URLS[0]}" --chat "$GROUP"
cs react "$POST" "+1" --retract --key "$KEYS/alice.key" --node "${URLS[1]}" --chat "$GROUP"
wait_converged
show_history 2
note "does each node show the edited text, marked, with one +1 (bob's; alice retracted hers)?"
check "the same folded view on all 3 nodes" on_all shows "$EDITED (edited)  +1 1"
note "does any node still show the first draft?"
check "the first draft is shown nowhere" on_none shows "$SECRET"
claim_result 1 "edits and reactions fold alike on every node"

# --- claim 2 ----------------------------------------------------------------------------------

header "Claim 2: a delete while N2 is partitioned; after the heal the payload is gone everywhere"
note "before the delete, the files of every node hold the first draft's bytes (the control)"
for i in 0 1 2; do
    [[ -n $(files_holding "$i" "$SECRET") ]] && printf '    N%s: yes\n' "$i" || printf '    N%s: no\n' "$i"
done
cut_off 2
cs delete "$POST" --key "$KEYS/alice.key" --node "${URLS[0]}" --chat "$GROUP"
wait_for 1 hidden "$EDITED" || true
note "N0 and N1 show the tombstone; N2, cut off, still shows the post and takes a reaction to it"
show_history 1
check "N1 shows the tombstone" shows 1 "[deleted by"
check "N2 still shows the post" shows 2 "$EDITED"
cs react "$POST" "ok" --key "$KEYS/bob.key" --node "${URLS[2]}" --chat "$GROUP"
heal 2
wait_converged
show_history 2
note "does any node show the post, its edit or the reaction made during the partition?"
check "no node shows the post" on_none shows "$EDITED"
check "no node shows the reaction made on N2 during the partition" on_none shows "ok 1"
check "every node shows the tombstone" on_all shows "[deleted by"
note "does any file of any node hold the first draft or its edit? (the erasure task compacts within 1 s)"
sleep 2
check "no file of any node holds the first draft" on_all no_file_holds "$SECRET"
check "no file of any node holds the edit" on_all no_file_holds "$EDITED"
claim_result 2 "a delete made during a partition erases the post, its edit and its reactions on every node, down to the files"

# --- summary ----------------------------------------------------------------------------------

header "Summary"
printf '%s\n' "${RESULTS[@]}"
if ((${#FAILED_CLAIMS[@]})); then
    echo "FAIL: claim(s) ${FAILED_CLAIMS[*]}"
    exit 1
fi
echo "PASS: all 2 claims"
