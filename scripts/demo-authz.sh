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
# The posts are sent with --plain: the node's rules are what is shown here, and a client that
# seals (the default) refuses to post where it sees no members to seal for, before any node
# is asked. The nodes are `python -m node.cli run` processes (as cluster/local.py starts them) in a temp
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

DEMO=authz
# shellcheck source=scripts/demo_lib.sh
source scripts/demo_lib.sh

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

create_group "authz demo" admin
cs group add "$GROUP" "$MEMBER" --key "$KEYS/admin.key" --node "${URLS[0]}"
note "waiting until every node lists the member"
wait_listed "$MEMBER"
cs group members "$GROUP" --key "$KEYS/admin.key" --node "${URLS[2]}"
MEMBER_EARLY="member says hello, before the removal"
cs send "$MEMBER_EARLY" --key "$KEYS/member.key" --node "${URLS[1]}" --chat "$GROUP" --plain

# --- claim 1 ----------------------------------------------------------------------------------

header "Claim 1: a stranger (a key never added) posting into the group is held and never shown"
STRANGER_TEXT="stranger wants in"
cs send "$STRANGER_TEXT" --key "$KEYS/stranger.key" --node "${URLS[1]}" --chat "$GROUP" --plain
check "N1 answers 'held, not shown'" out_has "held, not shown"
S1_RC=$RC
cs send "$STRANGER_TEXT (again, through N0)" --key "$KEYS/stranger.key" --node "${URLS[0]}" --chat "$GROUP" --plain
check "N0 answers 'held, not shown' too" out_has "held, not shown"
check "both sends exited 3 (held: taken, not shown)" test "$S1_RC" -eq 3 -a "$RC" -eq 3
note "letting gossip and two anti-entropy rounds pass ($((3 * SYNC_INTERVAL)) s)"
sleep $((3 * SYNC_INTERVAL))
wait_converged || true
note "histories (the member's post, synced everywhere, shows that the nodes talk):"
for i in 0 1 2; do show_history "$i"; done
note "does each node's history show the member's post?"
check "the member's post is shown on all 3 nodes" on_all shows "$MEMBER_EARLY"
note "does each node's history show the stranger's post?"
check "the stranger's posts are shown on none of the 3 nodes" on_none shows "$STRANGER_TEXT"
claim_result 1 "a stranger's post is held and shown on no node"

# --- claim 2 ----------------------------------------------------------------------------------

header "Claim 2: a removed member: refused where the removal is known, hidden everywhere once it arrives"
note "N2 is cut off, so the removal (posted through N0) cannot reach it for now"
cut_off 2
cs group remove "$GROUP" "$MEMBER" --key "$KEYS/admin.key" --node "${URLS[0]}"
cs group members "$GROUP" --node "${URLS[0]}" --key "$READER_KEY"
check "N0 no longer lists the member" not members_has 0 "$MEMBER"
cs group members "$GROUP" --node "${URLS[2]}" --key "$READER_KEY"
check "N2 (cut off) still lists the member" members_has 2 "$MEMBER"

REFUSED_TEXT="member posts after the removal, through N0"
cs send "$REFUSED_TEXT" --key "$KEYS/member.key" --node "${URLS[0]}" --chat "$GROUP" --plain
check "N0, which knows the removal, refuses the post (exit 1, not_a_member)" \
    test "$RC" -eq 1 -a -n "$(grep -F not_a_member <<<"$OUT")"

RACE_TEXT="member posts after the removal, through N2"
cs send "$RACE_TEXT" --key "$KEYS/member.key" --node "${URLS[2]}" --chat "$GROUP" --plain
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
cs send "$REFUSED_AGAIN" --key "$KEYS/member.key" --node "${URLS[2]}" --chat "$GROUP" --plain
check "now N2 refuses them too (exit 1, not_a_member)" \
    test "$RC" -eq 1 -a -n "$(grep -F not_a_member <<<"$OUT")"
claim_result 2 "after the removal: refused (not_a_member) where it is known; the post that raced it is hidden on all nodes; earlier posts stay"

# --- claim 3 ----------------------------------------------------------------------------------

header "Claim 3: a post that overtakes its member op is held, then shown everywhere"
note "N2 is cut off, so the add (posted through N0) reaches N2 only after the newcomer's post"
cut_off 2
cs group add "$GROUP" "$NEWCOMER" --key "$KEYS/admin.key" --node "${URLS[0]}"
NEWCOMER_TEXT="newcomer's first post, through N2"
cs send "$NEWCOMER_TEXT" --key "$KEYS/newcomer.key" --node "${URLS[2]}" --chat "$GROUP" --plain
check "N2 answers 'held'" out_has "held, not shown"
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
