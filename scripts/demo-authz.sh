#!/usr/bin/env bash
# Who may post into a group (issue 14), shown on a local 3-node cluster through the user CLI
# (`chatsync keygen`, `publish`, `group create/add/remove/members`, `send`, `history`):
#
#   1. a stranger (a key never added) posting into a group is held and never shown;
#   2. a removed member: a post after the removal is refused (`not_a_member`) by a node that knows
#      the removal, and a post sent through a node that does not know it yet ends hidden on all
#      three once the removal arrives; their earlier posts stay visible;
#   3. a post that overtakes its member op (add through node 0, post through node 2) is held by
#      node 2, then shown on all three once the add arrives.
#
# The nodes are `python -m node.cli run` processes (as cluster/local.py starts them) in a temp
# dir, stopped on exit. The harness itself (not the claims) talks to the nodes' HTTP API with
# curl: GET /status for readiness, peer ids and Merkle roots, and the partition switch
# POST /admin/block|unblock, which stands in for a slow network: on loopback a member op's
# gossip reaches the other nodes in ~20 ms, sooner than a CLI process starts (~0.4 s), so the
# races of claims 2 and 3 can only be won reliably by cutting node 2 off for a moment.
#
# Usage: scripts/demo-authz.sh          (KEEP=1 keeps the temp dir; it is kept on failure)
# Prints a PASS/FAIL line per claim; exit status 1 if a claim failed.
set -euo pipefail
cd "$(dirname "$0")/.."

ROOT=$PWD
PY=$ROOT/.venv/bin/python
CHATSYNC=$ROOT/.venv/bin/chatsync
export COLUMNS=200 # rich: ids and table rows on one line each, so grep sees them whole
SYNC_INTERVAL=2    # seconds between anti-entropy rounds per peer (node default: 10)
WAIT_S=60          # the longest we wait for anything to propagate

WORK=$(mktemp -d -t chatsync-authz.XXXXXX)
KEYS=$WORK/keys
mkdir -p "$KEYS"
NODE_PIDS=()
URLS=()
PEER_IDS=()
FAILED_CLAIMS=()

# --- harness ----------------------------------------------------------------------------------

stop_nodes() {
    local pid i
    for pid in "${NODE_PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${NODE_PIDS[@]}"; do
        for ((i = 0; i < 150; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            echo "node process $pid did not stop on SIGTERM in 15 s: killed" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
        wait "$pid" 2>/dev/null || true
    done
    NODE_PIDS=()
}

cleanup() {
    local rc=$?
    trap - EXIT
    if ((${#NODE_PIDS[@]})); then
        echo
        echo "stopping the nodes"
        stop_nodes
    fi
    if ((rc != 0)) || [[ ${KEEP:-0} == 1 ]]; then
        echo "data, keys and node logs kept in $WORK"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

header() {
    printf '\n==== %s ====\n' "$*"
}

note() {
    printf '# %s\n' "$*"
}

# The command as a reader would type it: key files by name, node URLs as N0 N1 N2.
shown() {
    local text="chatsync" arg i
    for arg in "$@"; do
        if [[ $arg == *[[:space:]\']* ]]; then
            text+=" \"$arg\""
        else
            text+=" $arg"
        fi
    done
    text=${text//$KEYS\//}
    for i in "${!URLS[@]}"; do
        text=${text//${URLS[$i]}/N$i}
    done
    printf '%s' "$text"
}

# cs ARGS...: run `chatsync ARGS`, print it and its output; the output in OUT, the status in RC.
cs() {
    printf '$ %s\n' "$(shown "$@")"
    RC=0
    OUT=$("$CHATSYNC" "$@" 2>&1) || RC=$?
    if [[ -n $OUT ]]; then
        printf '%s\n' "$OUT" | sed 's/^/    /'
    fi
    if ((RC != 0)); then
        printf '    (exit status %s)\n' "$RC"
    fi
}

# Quiet variants for polling: output in OUT, nothing printed.
cs_quiet() {
    RC=0
    OUT=$("$CHATSYNC" "$@" 2>&1) || RC=$?
}

status_json() { # NODE_INDEX
    curl -sf --max-time 2 "${URLS[$1]}/status"
}

free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_nodes() {
    local i p2p http pid peer bootstrap=() t
    for i in 0 1 2; do
        p2p=$(free_port)
        http=$(free_port)
        mkdir -p "$WORK/node$i"
        # node i bootstraps from every node started before it (as cluster/local.py does)
        "$PY" -m node.cli run \
            --data "$WORK/node$i" \
            --listen "/ip4/127.0.0.1/tcp/$p2p" \
            --http "127.0.0.1:$http" \
            --sync-interval "$SYNC_INTERVAL" \
            --log-level INFO --no-durable \
            ${bootstrap[@]+"${bootstrap[@]}"} >"$WORK/node$i.log" 2>&1 &
        pid=$!
        NODE_PIDS+=("$pid")
        URLS+=("http://127.0.0.1:$http")
        peer=""
        for ((t = 0; t < 300; t++)); do
            kill -0 "$pid" 2>/dev/null || {
                echo "node $i exited; its log:" >&2
                cat "$WORK/node$i.log" >&2
                exit 1
            }
            peer=$(status_json "$i" 2>/dev/null | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["peer_id"])' 2>/dev/null) && break
            peer=""
            sleep 0.2
        done
        [[ -n $peer ]] || { echo "node $i not ready after 60 s; see $WORK/node$i.log" >&2; exit 1; }
        PEER_IDS+=("$peer")
        bootstrap+=(--bootstrap "/ip4/127.0.0.1/tcp/$p2p/p2p/$peer")
        echo "node $i (N$i): ${URLS[$i]}  peer $peer  pid $pid"
    done
}

# The partition switch (the same calls as cluster/local.py's partition/heal).
switch() { # block|unblock NODE_INDEX
    local what=$1 victim=$2 i
    for i in "${!URLS[@]}"; do
        ((i == victim)) && continue
        curl -sf --max-time 5 -H 'content-type: application/json' \
            -d "{\"peer_id\": \"${PEER_IDS[$victim]}\"}" "${URLS[$i]}/admin/$what" >/dev/null
        curl -sf --max-time 5 -H 'content-type: application/json' \
            -d "{\"peer_id\": \"${PEER_IDS[$i]}\"}" "${URLS[$victim]}/admin/$what" >/dev/null
    done
}

cut_off() {
    note "cut N$1 off from the others (partition switch: POST /admin/block both ways)"
    switch block "$1"
}

heal() {
    note "heal N$1 (POST /admin/unblock both ways)"
    switch unblock "$1"
}

# Messages and members Merkle roots (with counts) equal on all three nodes.
converged() {
    local i roots=()
    for i in 0 1 2; do
        roots+=("$(status_json "$i" | "$PY" -c '
import json, sys
d = json.load(sys.stdin)["domains"]
print(" ".join(f"{k}={d[k]['"'"'root'"'"'][:12]}/{d[k]['"'"'count'"'"']}" for k in ("messages", "members")))
')") || return 1
    done
    [[ ${roots[0]} == "${roots[1]}" && ${roots[0]} == "${roots[2]}" ]] || return 1
    ROOTS=${roots[0]}
}

wait_converged() {
    local t0=$SECONDS
    until converged; do
        if ((SECONDS - t0 > WAIT_S)); then
            note "the nodes did not converge within ${WAIT_S} s"
            return 1
        fi
        sleep 0.5
    done
    note "all three nodes converged (same Merkle roots: $ROOTS) after $((SECONDS - t0)) s"
}

history_of() { # NODE_INDEX: the history page of the group, in OUT
    cs_quiet history --chat "$GROUP" --node "${URLS[$1]}" --limit 200
    if ((RC != 0)); then
        printf '%s\n' "$OUT" >&2
        return 1
    fi
}

shows() { # NODE_INDEX TEXT: does the node's history show TEXT?
    history_of "$1" && grep -qF -- "$2" <<<"$OUT"
}

# wait_for NODE_INDEX shown|hidden TEXT: poll the node's history; the seconds it took in WAITED.
wait_for() {
    local node=$1 want=$2 text=$3 t0=$SECONDS
    while :; do
        if shows "$node" "$text"; then
            [[ $want == shown ]] && break
        else
            [[ $want == hidden ]] && break
        fi
        if ((SECONDS - t0 > WAIT_S)); then
            WAITED=-1
            return 1
        fi
        sleep 0.5
    done
    WAITED=$((SECONDS - t0))
}

CLAIM_OK=1
check() { # DESCRIPTION COMMAND...: one check of the current claim
    local what=$1
    shift
    if "$@"; then
        printf '  ok      %s\n' "$what"
    else
        printf '  NOT OK  %s\n' "$what"
        CLAIM_OK=0
    fi
}

not() { ! "$@"; }

claim_result() { # N SUMMARY
    if ((CLAIM_OK)); then
        printf 'PASS claim %s: %s\n' "$1" "$2"
    else
        printf 'FAIL claim %s: %s\n' "$1" "$2"
        FAILED_CLAIMS+=("$1")
    fi
    RESULTS+=("$(((CLAIM_OK)) && echo PASS || echo FAIL) claim $1: $2")
    CLAIM_OK=1
}
RESULTS=()

out_has() { grep -qF -- "$1" <<<"$OUT"; }

members_has() { # NODE_INDEX USER: is USER an active member by the node's `group members`?
    cs_quiet group members "$GROUP" --node "${URLS[$1]}"
    ((RC == 0)) && grep -qF -- "$2" <<<"$OUT"
}

on_all() { # CHECK TEXT: CHECK i TEXT for i = 0 1 2 (each node's answer is printed)
    local fn=$1 text=$2 i ok=0
    for i in 0 1 2; do
        if "$fn" "$i" "$text"; then
            printf '    N%s: yes\n' "$i"
        else
            printf '    N%s: no\n' "$i"
            ok=1
        fi
    done
    return "$ok"
}

on_none() {
    local fn=$1 text=$2 i ok=0
    for i in 0 1 2; do
        if "$fn" "$i" "$text"; then
            printf '    N%s: yes\n' "$i"
            ok=1
        else
            printf '    N%s: no\n' "$i"
        fi
    done
    return "$ok"
}

show_history() { # NODE_INDEX
    cs history --chat "$GROUP" --node "${URLS[$1]}"
}

user_of() { # the user id `chatsync keygen` printed, from OUT
    grep -oE '[0-9a-f]{40}' <<<"$OUT" | head -1
}

# --- the cluster ------------------------------------------------------------------------------

header "Setup: a local 3-node cluster (temp dir $WORK)"
start_nodes
note "waiting until every node is connected to the other two"
t0=$SECONDS
for i in 0 1 2; do
    until [[ $(status_json "$i" | "$PY" -c 'import json, sys; print(len(json.load(sys.stdin)["connected_peers"]))') == 2 ]]; do
        ((SECONDS - t0 > WAIT_S)) && { echo "node $i did not connect to its peers" >&2; exit 1; }
        sleep 0.3
    done
done
note "connected after $((SECONDS - t0)) s"

header "Setup: keys, identities, a group with one member"
cs keygen --out "$KEYS/admin.key"
ADMIN=$(user_of)
cs keygen --out "$KEYS/member.key"
MEMBER=$(user_of)
cs keygen --out "$KEYS/stranger.key"
STRANGER=$(user_of)
cs keygen --out "$KEYS/newcomer.key"
NEWCOMER=$(user_of)
for who in admin member stranger newcomer; do
    cs publish --key "$KEYS/$who.key" --node "${URLS[0]}"
done
note "(publishing an identity makes no one a member: the stranger published too)"

cs group create --name "authz demo" --key "$KEYS/admin.key" --node "${URLS[0]}"
GROUP=$(grep -oE '[0-9a-f]{64}' <<<"$OUT" | head -1)
[[ -n $GROUP ]] || { echo "no group id in the output of group create" >&2; exit 1; }
cs group add "$GROUP" "$MEMBER" --key "$KEYS/admin.key" --node "${URLS[0]}"
note "waiting until every node lists the member"
for i in 0 1 2; do
    t0=$SECONDS
    until members_has "$i" "$MEMBER"; do
        ((SECONDS - t0 > WAIT_S)) && { echo "N$i does not list the member" >&2; exit 1; }
        sleep 0.5
    done
done
cs group members "$GROUP" --key "$KEYS/admin.key" --node "${URLS[2]}"
MEMBER_EARLY="member says hello, before the removal"
cs send "$MEMBER_EARLY" --key "$KEYS/member.key" --node "${URLS[1]}" --chat "$GROUP"

# --- claim 1 ----------------------------------------------------------------------------------

header "Claim 1: a stranger (a key never added) posting into the group is held and never shown"
STRANGER_TEXT="stranger wants in"
cs send "$STRANGER_TEXT" --key "$KEYS/stranger.key" --node "${URLS[1]}" --chat "$GROUP"
check "N1 answers 'held (not_a_member)'" out_has "held (not_a_member)"
S1_RC=$RC
cs send "$STRANGER_TEXT (again, through N0)" --key "$KEYS/stranger.key" --node "${URLS[0]}" --chat "$GROUP"
check "N0 answers 'held (not_a_member)' too" out_has "held (not_a_member)"
check "both sends exited 0 (a held post is not an error)" test "$S1_RC" -eq 0 -a "$RC" -eq 0
note "letting gossip and two anti-entropy rounds pass ($((3 * SYNC_INTERVAL)) s)"
sleep $((3 * SYNC_INTERVAL))
wait_converged || true
note "histories (the member's post, synced everywhere, shows that the nodes talk):"
for i in 0 1 2; do show_history "$i"; done
note "does each node's history show the member's post?"
check "the member's post is shown on all 3 nodes" on_all shows "$MEMBER_EARLY"
note "does each node's history show the stranger's post?"
check "the stranger's posts are shown on none of the 3 nodes" on_none shows "$STRANGER_TEXT"
claim_result 1 "a stranger's post is held (not_a_member) and shown on no node"

# --- claim 2 ----------------------------------------------------------------------------------

header "Claim 2: a removed member: refused where the removal is known, hidden everywhere once it arrives"
note "N2 is cut off, so the removal (posted through N0) cannot reach it for now"
cut_off 2
cs group remove "$GROUP" "$MEMBER" --key "$KEYS/admin.key" --node "${URLS[0]}"
cs group members "$GROUP" --node "${URLS[0]}"
check "N0 no longer lists the member" not members_has 0 "$MEMBER"
cs group members "$GROUP" --node "${URLS[2]}"
check "N2 (cut off) still lists the member" members_has 2 "$MEMBER"

REFUSED_TEXT="member posts after the removal, through N0"
cs send "$REFUSED_TEXT" --key "$KEYS/member.key" --node "${URLS[0]}" --chat "$GROUP"
check "N0, which knows the removal, refuses the post (exit 1, not_a_member)" \
    test "$RC" -eq 1 -a -n "$(grep -F not_a_member <<<"$OUT")"

RACE_TEXT="member posts after the removal, through N2"
cs send "$RACE_TEXT" --key "$KEYS/member.key" --node "${URLS[2]}" --chat "$GROUP"
check "N2, which does not know the removal yet, takes the post (sent, not held)" \
    test "$RC" -eq 0 -a -n "$(grep -F 'sent message' <<<"$OUT")" -a -z "$(grep -F held <<<"$OUT")"
show_history 2
check "N2 shows it for now" shows 2 "$RACE_TEXT"

heal 2
if wait_for 2 hidden "$RACE_TEXT"; then
    note "the removal reached N2: the post is hidden there after ${WAITED} s"
else
    note "N2 still shows the post after ${WAIT_S} s"
fi
wait_converged || CLAIM_OK=0
note "(equal message roots: N0 and N1 now store the post N2 took, too)"
for i in 0 1 2; do show_history "$i"; done
note "does each node's history show the post sent through N2 after the removal?"
check "it is hidden on all 3 nodes" on_none shows "$RACE_TEXT"
note "does each node's history show the post N0 refused?"
check "it is on none of the 3 nodes" on_none shows "$REFUSED_TEXT"
note "does each node's history show the member's post from before the removal?"
check "it stays visible on all 3 nodes" on_all shows "$MEMBER_EARLY"
note "does each node list the member?"
check "no node lists the removed member" on_none members_has "$MEMBER"
REFUSED_AGAIN="member tries again through N2, after the removal arrived"
cs send "$REFUSED_AGAIN" --key "$KEYS/member.key" --node "${URLS[2]}" --chat "$GROUP"
check "now N2 refuses them too (exit 1, not_a_member)" \
    test "$RC" -eq 1 -a -n "$(grep -F not_a_member <<<"$OUT")"
claim_result 2 "after the removal: refused (not_a_member) where it is known; the post that raced it is hidden on all nodes; earlier posts stay"

# --- claim 3 ----------------------------------------------------------------------------------

header "Claim 3: a post that overtakes its member op is held, then shown everywhere"
note "N2 is cut off, so the add (posted through N0) reaches N2 only after the newcomer's post"
cut_off 2
cs group add "$GROUP" "$NEWCOMER" --key "$KEYS/admin.key" --node "${URLS[0]}"
NEWCOMER_TEXT="newcomer's first post, through N2"
cs send "$NEWCOMER_TEXT" --key "$KEYS/newcomer.key" --node "${URLS[2]}" --chat "$GROUP"
check "N2 answers 'held'" out_has "held (not_a_member)"
show_history 2
check "N2 does not show it yet" not shows 2 "$NEWCOMER_TEXT"
heal 2
t0=$SECONDS
for i in 0 1 2; do
    if wait_for "$i" shown "$NEWCOMER_TEXT"; then
        note "N$i shows the post $((SECONDS - t0)) s after the heal"
    else
        note "N$i does not show the post after ${WAIT_S} s"
    fi
done
for i in 0 1 2; do show_history "$i"; done
note "does each node's history show the newcomer's post?"
check "it is shown on all 3 nodes" on_all shows "$NEWCOMER_TEXT"
cs group members "$GROUP" --key "$KEYS/admin.key" --node "${URLS[1]}"
claim_result 3 "a post ahead of its add is held by the node, then shown on all nodes once the add arrives"

# --- summary ----------------------------------------------------------------------------------

header "Summary"
printf '%s\n' "${RESULTS[@]}"
if ((${#FAILED_CLAIMS[@]})); then
    echo "FAIL: claim(s) ${FAILED_CLAIMS[*]}"
    exit 1
fi
echo "PASS: all 3 claims"
