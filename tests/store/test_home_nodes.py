"""Home nodes in the signed identity document (store/ops.py, SYNC.md "Scopes"): a user names
the nodes that serve it; the list is signed with the rest of the document, bounded, and one
encoding per set. Forged, oversized and malformed documents are refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store import BadSignature, DecodeError, Hlc
from store.errors import InvalidInput, TooLarge
from store.ingress import validate_op
from store.ops import (
    MAX_HOME_NODES,
    MAX_NODE_ID,
    IdentityDoc,
    decode_identity_doc,
    make_identity,
    verify_identity,
)
from store.records import IdentityRecord, canonical_cbor
from store.signing import key_from_seed, public_key, user_id_from_key

KEY = key_from_seed(b"\x42" * 32)
USER = user_id_from_key(public_key(KEY))
BOX = b"\x07" * 32
N1, N2, N3 = b"\x00\x24node-one", b"\x00\x24node-two", b"\x00\x24node-three"


def _v2(doc: IdentityDoc, nodes: list[object]) -> bytes:
    """A version-2 blob with ``nodes`` as given (unchecked: what a hostile peer sends)."""
    return canonical_cbor([2, doc.sign_key, doc.box_key, nodes, doc.sig])


def test_home_nodes_are_signed_sorted_and_read_back() -> None:
    record = make_identity(KEY, BOX, Hlc(5), [N2, N1, N2])
    doc = verify_identity(record)
    assert doc.home_nodes == (N1, N2) and doc.box_key == BOX
    assert decode_identity_doc(record.blob) == doc and record.blob[:2] == b"\x85\x02"


def test_without_home_nodes_the_document_is_version_1_as_before() -> None:
    record = make_identity(KEY, BOX, Hlc(5))
    assert record.blob[:2] == b"\x84\x01" and verify_identity(record).home_nodes == ()


def test_forged_home_nodes_are_refused() -> None:
    record = make_identity(KEY, BOX, Hlc(5), [N1])
    doc = decode_identity_doc(record.blob)
    swapped = IdentityRecord(USER, record.hlc, _v2(doc, [N2]))  # another node, same signature
    added = IdentityRecord(USER, record.hlc, _v2(doc, [N1, N2]))  # a node slipped in
    dropped = IdentityRecord(USER, record.hlc, IdentityDoc(doc.sign_key, BOX, doc.sig).encode())
    for forged in (swapped, added, dropped):
        with pytest.raises(BadSignature):
            verify_identity(forged)
        with pytest.raises(BadSignature):  # the node's ingress checks the same
            validate_op(forged, now_ms=10, max_offset_ms=60_000)


def test_a_version_1_signature_does_not_sign_a_version_2_list() -> None:
    plain = decode_identity_doc(make_identity(KEY, BOX, Hlc(5)).blob)
    with pytest.raises(BadSignature):
        verify_identity(IdentityRecord(USER, Hlc(5), _v2(plain, [N1])))


def test_another_users_key_cannot_name_home_nodes_for_me() -> None:
    thief = make_identity(key_from_seed(b"\x43" * 32), BOX, Hlc(5), [N1])
    with pytest.raises(BadSignature):
        verify_identity(IdentityRecord(USER, Hlc(5), thief.blob))


def test_an_oversized_list_or_id_is_refused() -> None:
    many = [bytes([i]) * 4 for i in range(MAX_HOME_NODES + 1)]
    with pytest.raises(TooLarge):
        make_identity(KEY, BOX, Hlc(5), many)
    doc = decode_identity_doc(make_identity(KEY, BOX, Hlc(5), [N1]).blob)
    with pytest.raises(TooLarge):
        decode_identity_doc(_v2(doc, many))  # type: ignore[arg-type]
    with pytest.raises(TooLarge):
        decode_identity_doc(_v2(doc, [b"\x01" * (MAX_NODE_ID + 1)]))
    longest = make_identity(KEY, BOX, Hlc(5), [bytes([i]) * MAX_NODE_ID for i in range(8)])
    assert len(verify_identity(longest).home_nodes) == MAX_HOME_NODES  # fits the 1,024-byte blob


@pytest.mark.parametrize(
    ("nodes", "reason"),
    [
        ([], "wrong_type"),  # version 2 names at least one node
        ([N2, N1], "non_canonical"),  # out of order: two encodings of one set
        ([N1, N1], "non_canonical"),
        ([b""], "wrong_length"),
        (["node"], "wrong_type"),
        ([1], "wrong_type"),
    ],
)
def test_malformed_home_nodes_are_refused(nodes: list[object], reason: str) -> None:
    doc = decode_identity_doc(make_identity(KEY, BOX, Hlc(5), [N1]).blob)
    with pytest.raises(DecodeError) as info:
        decode_identity_doc(_v2(doc, nodes))
    assert info.value.reason == reason


def test_a_version_2_document_of_the_wrong_shape_is_refused() -> None:
    doc = decode_identity_doc(make_identity(KEY, BOX, Hlc(5), [N1]).blob)
    for blob in (
        canonical_cbor([2, doc.sign_key, doc.box_key, N1, doc.sig]),  # not an array
        canonical_cbor([2, doc.sign_key, doc.box_key, [N1]]),  # no signature
        canonical_cbor([2, doc.sign_key, doc.box_key, [N1], doc.sig, b""]),
        canonical_cbor([3, doc.sign_key, doc.box_key, [N1], doc.sig]),
    ):
        with pytest.raises(DecodeError):
            decode_identity_doc(blob)


@given(
    st.lists(st.binary(min_size=1, max_size=MAX_NODE_ID), max_size=MAX_HOME_NODES, unique=True),
    st.data(),
)
def test_any_changed_byte_of_a_signed_document_is_refused(
    nodes: list[bytes], data: st.DataObject
) -> None:
    record = make_identity(KEY, BOX, Hlc(9), nodes)
    assert verify_identity(record).home_nodes == tuple(sorted(nodes))
    at = data.draw(st.integers(0, len(record.blob) - 1))
    flip = data.draw(st.integers(1, 255))
    blob = bytearray(record.blob)
    blob[at] ^= flip
    with pytest.raises(InvalidInput):
        verify_identity(IdentityRecord(USER, record.hlc, bytes(blob)))
