#!/usr/bin/env bash
# Edits, reactions and deletes (issue 15, MESSAGES.md) on a local 3-node cluster, through the
# user CLI (`chatsync group`, `send`, `edit`, `react`, `delete`, `read`, `history`, `chats`):
#
#   1. a post, its edit, reactions and a retraction: every node shows the same folded view;
#   2. a delete while one node is partitioned — which meanwhile takes a reaction to the deleted
#      post —, then the heal: every node shows the tombstone, none the text, the edit or the
#      reaction, and the payload's bytes are in no file of any node's data directory;
#   3. read receipts: Bob marks the chat read on one node (`chatsync read`), and every node's
#      chat list (`chatsync chats`) counts the same unread messages for him, before and after
#      a new post.
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

unread_is() { # NODE_INDEX COUNT: does Bob's chat list on the node count COUNT unread in the group?
    cs_quiet chats --key "$KEYS/bob.key" --node "${URLS[$1]}"
    grep -F -- "${GROUP:0:16}" <<<"$OUT" | grep -qE "│ +$2 +│"
}

wait_unread() { # COUNT: until every node counts COUNT unread for Bob (or WAIT_S)
    local t0=$SECONDS
    until unread_is 0 "$1" && unread_is 1 "$1" && unread_is 2 "$1"; do
        ((SECONDS - t0 > WAIT_S)) && return 1
        sleep 0.5
    done
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
create_group "kinds demo" alice
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

# --- claim 3 ----------------------------------------------------------------------------------

header "Claim 3: Bob reads on N1; every node's chat list counts the same unread for him"
cs chats --key "$KEYS/bob.key" --node "${URLS[2]}"
note "unread for Bob: the group's name (the post was deleted; his own reactions never count)"
check "every node counts 1 unread for Bob" on_all unread_is 1
cs read --chat "$GROUP" --key "$KEYS/bob.key" --node "${URLS[1]}"
wait_unread 0 || true
cs chats --key "$KEYS/bob.key" --node "${URLS[2]}"
check "after his receipt on N1, every node counts 0" on_all unread_is 0
cs send "after the read" --key "$KEYS/alice.key" --node "${URLS[0]}" --chat "$GROUP"
wait_unread 1 || true
check "a new post by Alice: every node counts 1 again" on_all unread_is 1
claim_result 3 "read positions are signed receipts: the unread counts agree on every node"

# --- summary ----------------------------------------------------------------------------------

header "Summary"
printf '%s\n' "${RESULTS[@]}"
if ((${#FAILED_CLAIMS[@]})); then
    echo "FAIL: claim(s) ${FAILED_CLAIMS[*]}"
    exit 1
fi
echo "PASS: all 3 claims"
