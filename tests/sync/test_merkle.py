"""Merkle trees: incremental == rebuilt, order independence, salted hashes, pure-cell decoding."""

from __future__ import annotations

from pathlib import Path

import blake3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import ChatDb, ChatDbConfig, Hlc
from sync.frames import Domain
from sync.merkle import DEPTH, FANOUT, MerkleTree, check_hash, children, node_hash
from sync.protocol import decode_pure_cell
from sync.replica import DbReplica

from sync_support import USERS, member, message

ids32 = st.binary(min_size=32, max_size=32)


@given(st.lists(ids32, unique=True, max_size=200), st.randoms())
def test_incremental_equals_rebuild_in_any_order(ids: list[bytes], rnd) -> None:
    shuffled = ids[:]
    rnd.shuffle(shuffled)
    tree = MerkleTree()
    for record_id in shuffled:
        tree.insert(record_id)
    rebuilt = MerkleTree.from_ids(ids)
    assert tree == rebuilt
    assert tree.root() == rebuilt.root()
    assert tree.count == len(ids)


@given(st.lists(ids32, unique=True, min_size=1, max_size=100), st.data())
def test_remove_and_replace_undo_inserts(ids: list[bytes], data: st.DataObject) -> None:
    keep = data.draw(st.lists(st.sampled_from(ids), unique=True))
    tree = MerkleTree.from_ids(ids)
    for record_id in ids:
        if record_id not in keep:
            tree.remove(record_id)
    assert tree == MerkleTree.from_ids(keep)
    if keep:
        new_id = data.draw(ids32.filter(lambda x: x not in ids))
        tree.replace(keep[0], new_id)
        assert tree == MerkleTree.from_ids([new_id, *keep[1:]])


def test_every_level_sums_to_the_root() -> None:
    ids = [bytes([i, j]) + bytes(30) for i in range(0, 256, 17) for j in range(0, 256, 51)]
    tree = MerkleTree.from_ids(ids)
    for depth in range(DEPTH + 1):
        xor = count = 0
        for index in range(FANOUT**depth):
            node_xor, node_count = tree.node(depth, index)
            xor ^= node_xor
            count += node_count
        assert (xor.to_bytes(32, "big"), count) == tree.root()


def test_remove_from_empty_bucket_is_refused() -> None:
    with pytest.raises(ValueError, match="empty bucket"):
        MerkleTree().remove(bytes(32))
    with pytest.raises(ValueError):
        MerkleTree().insert(b"short")


def test_node_hashes_depend_on_salt_and_width() -> None:
    tree = MerkleTree.from_ids([bytes([1]) * 32])
    a = tree.hashes(2, [0, 1], b"s" * 16, 4)
    assert len(a) == 8
    assert a != tree.hashes(2, [0, 1], b"t" * 16, 4)
    assert len(tree.hashes(2, [0], b"s" * 16, 6)) == 6
    assert node_hash(b"s", 0, 0, 4) != node_hash(b"s", 0, 1, 4)  # the count is hashed too


def test_children_indexes() -> None:
    assert children(0, [0]) == list(range(16))
    assert children(3, [2]) == list(range(32, 48))


@given(st.lists(ids32, unique=True, max_size=20), ids32)
def test_a_cell_differing_by_one_id_decodes_to_it(shared: list[bytes], extra: bytes) -> None:
    bucket = (extra[0] << 8) | extra[1]
    same_bucket = [bytes(extra[:2]) + s[2:] for s in shared]
    same_bucket = [s for s in dict.fromkeys(same_bucket) if s != extra]
    a = MerkleTree.from_ids(same_bucket)
    b = MerkleTree.from_ids([*same_bucket, extra])
    assert decode_pure_cell(bucket, a.cell(bucket), b.cell(bucket)) == (1, extra)
    assert decode_pure_cell(bucket, b.cell(bucket), a.cell(bucket)) == (-1, extra)


@given(st.lists(ids32, unique=True, min_size=2, max_size=6))
def test_a_cell_differing_by_several_ids_does_not_decode(extras: list[bytes]) -> None:
    extras = list(dict.fromkeys(b"\x00\x07" + e[2:] for e in extras))
    if len(extras) < 2:
        return
    a = MerkleTree()
    b = MerkleTree.from_ids(extras)
    # count differs by >= 2: never decodes; equal-size swaps: the check hash rejects them
    assert decode_pure_cell(7, a.cell(7), b.cell(7)) is None
    swap_a = MerkleTree.from_ids(extras[:1])
    swap_b = MerkleTree.from_ids(extras[1:2])
    assert decode_pure_cell(7, swap_a.cell(7), swap_b.cell(7)) is None
    assert check_hash(extras[0]) != check_hash(extras[1]) or extras[0] == extras[1]


@settings(max_examples=15)
@given(
    st.lists(st.integers(0, 40), unique=True, max_size=25),
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(1, 9), st.booleans())),
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 9), st.binary(max_size=8))),
)
def test_tree_rebuilt_from_chatdb_equals_incremental(
    tmp_path_factory: pytest.TempPathFactory,
    msgs: list[int],
    member_ops: list[tuple[int, int, int, bool]],
    identity_ops: list[tuple[int, int, bytes]],
) -> None:
    path: Path = tmp_path_factory.mktemp("db")
    with ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=path) as db:
        replica = DbReplica(db)  # trees built from an empty DB, then maintained incrementally
        incremental = replica.trees
        for result in db.put_messages([message(n) for n in msgs]):
            if not result.duplicate:
                incremental[Domain.MESSAGES].insert(result.msg_id)
        for chat, user, hlc, add in member_ops:
            applied = db.apply_member_ops([member(chat, user, hlc, remove=not add, role=1)])
            if applied.new[0]:
                incremental[Domain.MEMBERS].insert(applied.op_ids[0])
        for user, hlc, blob in identity_ops:
            ichange = db.put_identity(USERS[user], Hlc(hlc), blob)
            incremental[Domain.IDENTITY].replace(ichange.old_id, ichange.new_id)
        rebuilt = DbReplica(db).trees
        for domain in Domain:
            assert rebuilt[domain] == incremental[domain]
            assert rebuilt[domain].root() == incremental[domain].root()


def test_db_replica_reports_the_messages_sync_stored_that_were_new(tmp_path: Path) -> None:
    """The node logs these as arrivals by anti-entropy (GET /debug/latency?arrivals=1)."""
    told: list[list[bytes]] = []
    with ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=tmp_path) as db:
        replica = DbReplica(db, admit_all=True)
        replica.on_new_messages = lambda msgs: told.append([m.msg_id for m in msgs])
        first, second = [message(n) for n in (1, 2)], [message(n) for n in (2, 3)]
        assert replica.apply(Domain.MESSAGES, list(first)) == 2
        assert replica.apply(Domain.MESSAGES, list(second)) == 1  # message 2 is held already
        assert replica.apply(Domain.MESSAGES, list(second)) == 0  # nothing new: not told
    assert told == [[m.msg_id for m in first], [second[1].msg_id]]


def nodes_by_definition(ids: list[bytes], depth: int) -> dict[int, tuple[int, int]]:
    """Node i at depth k: the XOR and count of the ids whose top 4k bits of bucket are i."""
    nodes: dict[int, tuple[int, int]] = {}
    for record_id in ids:
        index = int.from_bytes(record_id[:2], "big") >> (4 * (DEPTH - depth))
        xor, count = nodes.get(index, (0, 0))
        nodes[index] = (xor ^ int.from_bytes(record_id, "big"), count + 1)
    return nodes


def assert_tree_is(tree: MerkleTree, ids: list[bytes]) -> None:
    for depth in range(DEPTH + 1):
        expected = nodes_by_definition(ids, depth)
        for index in range(FANOUT**depth):
            assert tree.node(depth, index) == expected.get(index, (0, 0)), (depth, index)
    buckets = {int.from_bytes(i[:2], "big") for i in ids}
    for bucket in buckets | {0, 0xFFFF}:
        in_bucket = [i for i in ids if int.from_bytes(i[:2], "big") == bucket]
        check = 0
        for record_id in in_bucket:
            check ^= check_hash(record_id)
        xor, count = expected_leaf = nodes_by_definition(in_bucket, DEPTH).get(bucket, (0, 0))
        assert tree.cell(bucket) == (count, xor, check), expected_leaf
    assert tree.count == len(ids)


# Ids spread over few buckets, so that buckets and their ancestors hold several.
clustered_ids = st.lists(
    st.tuples(st.sampled_from([0x0000, 0x0001, 0x0010, 0x0100, 0x1000, 0xFFFF]), ids32).map(
        lambda t: t[0].to_bytes(2, "big") + t[1][2:]
    ),
    unique=True,
    max_size=40,
)


@given(clustered_ids, st.data())
def test_every_node_is_the_xor_and_count_of_the_ids_below_it(
    ids: list[bytes], data: st.DataObject
) -> None:
    assert_tree_is(MerkleTree.from_ids(ids), ids)
    removed = data.draw(st.lists(st.sampled_from(ids), unique=True) if ids else st.just([]))
    tree = MerkleTree()
    for record_id in ids:
        tree.insert(record_id)
    for record_id in removed:
        tree.remove(record_id)
    assert_tree_is(tree, [i for i in ids if i not in removed])


def test_a_copy_is_equal_and_independent() -> None:
    ids = [bytes([i]) * 32 for i in range(1, 6)]
    tree = MerkleTree.from_ids(ids)
    copy = tree.copy()
    assert copy == tree and copy.root() == tree.root() and copy.cell(0x0101) == tree.cell(0x0101)
    copy.remove(ids[0])
    assert copy != tree and tree.count == 5 and copy.count == 4
    assert_tree_is(tree, ids)


def test_equal_trees_need_equal_check_hashes_too() -> None:
    # {a, b} and {c, a^b^c} in one bucket: equal XORs and counts, different ids
    a, b, c = (bytes(2) + bytes([n]) * 30 for n in (1, 2, 4))
    d = (int.from_bytes(a, "big") ^ int.from_bytes(b, "big") ^ int.from_bytes(c, "big")).to_bytes(
        32, "big"
    )
    left, right = MerkleTree.from_ids([a, b]), MerkleTree.from_ids([c, d])
    assert left.root() == right.root()
    assert left != right
    assert MerkleTree() == MerkleTree() and MerkleTree() != "a tree"
    assert (MerkleTree() == "a tree") is False  # not equal, rather than unknown
    with pytest.raises(TypeError):
        hash(MerkleTree())


def test_replace_swaps_one_id_for_another() -> None:
    a, b = bytes([1]) * 32, bytes([2]) * 32
    tree = MerkleTree.from_ids([a])
    tree.replace(a, a)  # unchanged
    assert tree == MerkleTree.from_ids([a])
    tree.replace(a, b)
    assert tree == MerkleTree.from_ids([b])
    tree.replace(None, a)
    tree.replace(b, None)
    assert tree == MerkleTree.from_ids([a])
    tree.replace(None, None)
    assert tree == MerkleTree.from_ids([a])


def test_wrong_length_ids_are_refused_everywhere() -> None:
    for bad in (bytes(31), bytes(33)):
        with pytest.raises(ValueError, match="32 bytes"):
            MerkleTree.from_ids([bad])
        with pytest.raises(ValueError, match="32 bytes"):
            MerkleTree().insert(bad)


def test_the_root_digest_and_node_hash_cover_the_xor_and_the_count() -> None:
    one, two = MerkleTree.from_ids([bytes([1]) * 32]), MerkleTree.from_ids([bytes([3]) * 32])
    assert len(one.root_digest()) == 32
    assert one.root_digest() != two.root_digest() != MerkleTree().root_digest()
    xor, count = one.root()
    assert one.root_digest() == MerkleTree.from_ids([bytes([1]) * 32]).root_digest()
    assert (xor, count) == (bytes([1]) * 32, 1)
    # the hash is salted, covers every byte of the 32-byte XOR and of the 8-byte count
    base = node_hash(b"salt", 1 << 255, 1 << 63, 8)
    assert len(base) == 8 and node_hash(b"salt", 1 << 255, 1 << 63, 4) == base[:4]
    assert base != node_hash(b"salt", 0, 1 << 63, 8) != node_hash(b"salt", 1 << 255, 0, 8)
    assert check_hash(bytes(32)) < 1 << 32 and check_hash(bytes(32)) != check_hash(
        bytes(31) + b"\1"
    )


def test_node_hash_is_the_wire_format_of_sync_md() -> None:
    # SYNC.md: BLAKE3(salt ‖ xor ‖ count)[:w], the XOR as 32 big-endian bytes and the count
    # as 8: peers of different versions must hash the same node to the same bytes
    salt, xor, count = bytes(range(16)), (1 << 200) + 5, 7
    wire = salt + xor.to_bytes(32, "big") + count.to_bytes(8, "big")
    assert node_hash(salt, xor, count, 6) == blake3.blake3(wire).digest(6)
