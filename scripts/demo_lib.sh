# The harness of the demo scripts (scripts/demo-*.sh): a local 3-node cluster of `python -m
# node.cli run` processes in a temp dir (stopped on exit), `chatsync` commands printed as a reader
# would type them, the partition switch, convergence and history polls, PASS/FAIL per claim.
# Sourced, not run: the script sets DEMO (the temp dir's name) first, and may set
# CONVERGED_DOMAINS (the domains whose Merkle roots must agree; default messages and members).
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
CHATSYNC=("$PY" -m cli.main) # the CLI of this checkout (the repo is the working directory)
export COLUMNS=200 # rich: ids and table rows on one line each, so grep sees them whole
SYNC_INTERVAL=2    # seconds between anti-entropy rounds per peer (node default: 10)
WAIT_S=60          # the longest we wait for anything to propagate

WORK=$(mktemp -d -t "chatsync-$DEMO.XXXXXX")
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
    OUT=$("${CHATSYNC[@]}" "$@" 2>&1) || RC=$?
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
    OUT=$("${CHATSYNC[@]}" "$@" 2>&1) || RC=$?
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

# POST /admin/{block|unblock} to node I with its admin token (beside its database).
admin_call() { # NODE_INDEX block|unblock PEER_ID
    curl -sf --max-time 5 -H 'content-type: application/json' \
        -H "authorization: Bearer $(cat "$WORK/node$1/admin.token")" \
        -d "{\"peer_id\": \"$3\"}" "${URLS[$1]}/admin/$2" >/dev/null
}

# The partition switch (the same calls as cluster/local.py's partition/heal).
switch() { # block|unblock NODE_INDEX
    local what=$1 victim=$2 i
    for i in "${!URLS[@]}"; do
        ((i == victim)) && continue
        admin_call "$i" "$what" "${PEER_IDS[$victim]}"
        admin_call "$victim" "$what" "${PEER_IDS[$i]}"
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
print(" ".join(f"{k}={d[k]['"'"'root'"'"'][:12]}/{d[k]['"'"'count'"'"']}" for k in sys.argv[1:]))
' ${CONVERGED_DOMAINS:-messages members})") || return 1
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
    cs_quiet history --chat "$GROUP" --node "${URLS[$1]}" --limit 200 --key "$READER_KEY"
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
    cs_quiet group members "$GROUP" --node "${URLS[$1]}" --key "$READER_KEY"
    ((RC == 0)) && grep -qF -- "$2" <<<"$OUT"
}

create_group() { # NAME KEY_NAME: `chatsync group create` on N0; the new group's id into GROUP,
    # and the creator's key into READER_KEY (reads of a chat are for its members)
    READER_KEY="$KEYS/$2.key"
    cs group create --name "$1" --key "$READER_KEY" --node "${URLS[0]}"
    GROUP=$(grep -oE '[0-9a-f]{64}' <<<"$OUT" | head -1)
    [[ -n $GROUP ]] || { echo "no group id in the output of group create" >&2; exit 1; }
}

wait_listed() { # USER: until every node lists USER as an active member of the group
    local i t0
    for i in 0 1 2; do
        t0=$SECONDS
        until members_has "$i" "$1"; do
            ((SECONDS - t0 > WAIT_S)) && { echo "N$i does not list $1" >&2; exit 1; }
            sleep 0.5
        done
    done
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
    cs history --chat "$GROUP" --node "${URLS[$1]}" --key "$READER_KEY"
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

