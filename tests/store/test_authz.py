"""Who may change a chat's membership (store/authz.py): the five rules, proofs and grants.

``may`` states the rules of the module docstring as a table of who may do what,
independently of how ``authorize`` orders its checks; the test compares the two on every
combination of actor, target, add or remove, role and grant.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from store.authz import (
    AdminGrant,
    DmProof,
    GroupProof,
    Unauthorized,
    authorize,
    decode_grant,
    decode_proof,
    grant_admin,
    group_chat_id,
    new_group,
)
from store.errors import DecodeError, InvalidInput
from store.records import dm_chat_id
from store.signing import key_from_seed, public_key, user_id_from_key

KEYS = [key_from_seed(bytes([0x51 + i]) * 32) for i in range(4)]
CREATOR, ADMIN, OTHER, PARTY = (user_id_from_key(public_key(k)) for k in KEYS)
NONCE = b"authz-test-nonce"
GROUP = new_group(KEYS[0], NONCE)
ANOTHER_GROUP = new_group(KEYS[0], b"another-nonce-16")
DM = DmProof(OTHER, PARTY)

# Grants as a peer may present them: real, for someone else, signed by a non-creator, or
# signed by the creator for another of its groups.
GRANTS: dict[str, AdminGrant | None] = {
    "none": None,
    "admin's": grant_admin(KEYS[0], GROUP, ADMIN),
    "other's": grant_admin(KEYS[0], GROUP, OTHER),
    "forged": AdminGrant(ADMIN, grant_admin(KEYS[0], GROUP, ADMIN).sig[:-1] + b"\x00"),
    "another group's": grant_admin(KEYS[0], ANOTHER_GROUP, ADMIN),
}
VALID_GRANT_HOLDER = {"admin's": ADMIN, "other's": OTHER}  # the others make nobody an admin


def may(
    proof: GroupProof | DmProof,
    actor: bytes,
    user: bytes,
    removes: bool,
    admin_role: bool,
    grant: str,
) -> bool:
    """The module docstring's rules, one line each."""
    leaves = removes and user == actor  # 3. anyone may remove themself
    if isinstance(proof, DmProof):  # 4. a DM's parties, as participants
        parties = {proof.user_a, proof.user_b}
        return leaves or (actor in parties and user in parties and not admin_role)
    creator = actor == CREATOR  # 1. the creator: anything
    is_admin = VALID_GRANT_HOLDER.get(grant) == actor
    admin_may = (not removes and not admin_role) or (removes and user != CREATOR)  # 2.
    return leaves or creator or (is_admin and admin_may)  # 5. nothing else


def test_authorize_follows_the_rules_in_every_case() -> None:
    # 640 cases: few enough to try them all rather than sample
    wrong = []
    people = [CREATOR, ADMIN, OTHER, PARTY]
    flags = [False, True]
    for case in itertools.product([GROUP, DM], people, people, flags, flags, sorted(GRANTS)):
        proof, actor, user, removes, admin_role, grant = case
        try:
            authorize(
                chat_id=proof.chat_id(),
                user=user,
                removes=removes,
                admin_role=admin_role,
                actor=actor,
                proof=proof,
                grant=GRANTS[grant],
            )
            allowed = True
        except Unauthorized as exc:
            assert exc.reason == "unauthorized"
            allowed = False
        if allowed != may(*case):
            wrong.append((type(proof).__name__, people.index(actor), people.index(user), *case[3:]))
    assert wrong == []


@pytest.mark.parametrize("proof", [GROUP, DM], ids=["group", "dm"])
def test_a_proof_of_another_chat_authorizes_nobody(proof: GroupProof | DmProof) -> None:
    # even the creator leaving: the proof must derive the chat id before any rule applies
    with pytest.raises(Unauthorized, match="does not derive"):
        authorize(
            chat_id=ANOTHER_GROUP.chat_id(),
            user=CREATOR,
            removes=True,
            admin_role=False,
            actor=CREATOR,
            proof=proof,
            grant=None,
        )
    with pytest.raises(ValueError, match="chat_id"):
        authorize(
            chat_id=proof.chat_id()[:-1],
            user=CREATOR,
            removes=True,
            admin_role=False,
            actor=CREATOR,
            proof=proof,
            grant=None,
        )


def test_a_group_id_commits_to_its_creator_and_nonce() -> None:
    assert GROUP.chat_id() == group_chat_id(public_key(KEYS[0]), NONCE)
    assert GROUP.creator == CREATOR
    assert GROUP.chat_id() != ANOTHER_GROUP.chat_id()
    assert GROUP.chat_id() != new_group(KEYS[1], NONCE).chat_id()
    for creator_key, nonce in [(public_key(KEYS[0])[:-1], NONCE), (public_key(KEYS[0]), b"x")]:
        with pytest.raises(ValueError):
            group_chat_id(creator_key, nonce)
    with pytest.raises(ValueError, match="nonce"):
        new_group(KEYS[0], NONCE + b"!")


def test_a_dm_id_and_its_parties_do_not_depend_on_the_order() -> None:
    swapped = DmProof(PARTY, OTHER)
    assert DM.chat_id() == swapped.chat_id() == dm_chat_id(OTHER, PARTY)
    assert DM.parties() == swapped.parties() == min(OTHER, PARTY) + max(OTHER, PARTY)


def test_only_the_creator_grants_admin() -> None:
    with pytest.raises(ValueError, match="creator"):
        grant_admin(KEYS[1], GROUP, ADMIN)
    with pytest.raises(ValueError, match="admin"):
        grant_admin(KEYS[0], GROUP, ADMIN[:-1])


@pytest.mark.parametrize("value", [GROUP, DM, GRANTS["admin's"]], ids=["group", "dm", "grant"])
def test_proofs_and_grants_round_trip(value: Any) -> None:
    decode = decode_grant if isinstance(value, AdminGrant) else decode_proof
    assert decode(value.to_cbor()) == value
    assert decode_grant(None) is None  # an op without a grant


KEY = public_key(KEYS[0])


@pytest.mark.parametrize(
    "value",
    [
        None,
        [],
        (0, KEY, NONCE),  # a tuple is not a CBOR array here
        [True, KEY, NONCE],  # a bool is not a kind
        ["0", KEY, NONCE],
        [0, KEY],
        [0, KEY, NONCE, b""],
        [1, CREATOR],
        [1, CREATOR, ADMIN, b""],
        [2, CREATOR, ADMIN],
        [0, KEY[:-1], NONCE],
        [0, KEY, NONCE[:-1]],
        [1, CREATOR[:-1], ADMIN],
        [1, CREATOR, ADMIN + b"\x00"],
        [1, CREATOR, "text"],
    ],
)
def test_malformed_proofs_are_decode_errors(value: Any) -> None:
    with pytest.raises(DecodeError):
        decode_proof(value)


SIG = GRANTS["admin's"].sig  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "value",
    [[], [ADMIN], [ADMIN, SIG, b""], (ADMIN, SIG), [ADMIN[:-1], SIG], [ADMIN, SIG[:-1]], b""],
)
def test_malformed_grants_are_decode_errors(value: Any) -> None:
    with pytest.raises(DecodeError):
        decode_grant(value)


def test_unauthorized_is_invalid_input_with_its_reason() -> None:
    assert issubclass(Unauthorized, InvalidInput)
    assert Unauthorized("x").reason == "unauthorized"
