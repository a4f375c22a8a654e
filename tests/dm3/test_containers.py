"""dm3/containers.py: a history as dm3 storage containers, and back — keys, chunk sizes,
and every way a container can be wrong refused with the file named."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os

import pytest

from client.e2e import UserKey
from dm3 import containers as c
from dm3.crypto import decrypt, encrypt, sign_text, storage_key, stringify
from store.authz import ChatProof, DmProof, new_group
from store.hlc import Hlc
from store.kinds import Claims, reaction_payload
from store.ops import MembershipAction, MembershipOp, Op
from store.records import MessageKind, MsgV1, dm_chat_id

ALICE = UserKey.from_seed(b"\x0a" * 32)
BOB = UserKey.from_seed(b"\x0b" * 32)
GROUP = new_group(ALICE.signing_key, b"containers-test!")
DM = DmProof(ALICE.user_id, BOB.user_id)


def add(proof: ChatProof, user: UserKey, ms: int) -> MembershipOp:
    return MembershipOp.create(
        ALICE.signing_key, proof.chat_id(), user.user_id, MembershipAction.ADD, Hlc(ms),
        proof=proof,
    )  # fmt: skip


def msg(
    chat: bytes,
    ms: int,
    payload: bytes,
    kind: MessageKind = MessageKind.NEW,
    ref: bytes | None = None,
) -> MsgV1:
    return MsgV1.create(ALICE.signing_key, chat, Hlc(ms), payload, kind=kind, ref=ref)


def sample_history() -> c.History:
    group, dm = GROUP.chat_id(), dm_chat_id(ALICE.user_id, BOB.user_id)
    first = msg(group, 1_000, b"hello")
    gone = msg(group, 1_001, b"to delete")
    group_ops: list[Op] = [
        add(GROUP, ALICE, 900),
        add(GROUP, BOB, 901),
        first,
        msg(group, 1_002, b"hello!", kind=MessageKind.EDIT, ref=first.msg_id),
        msg(group, 1_003, reaction_payload(b"+1"), kind=MessageKind.REACTION, ref=first.msg_id),
        msg(group, 1_004, b"re", kind=MessageKind.REPLY, ref=first.msg_id),
        msg(group, 1_005, Claims.of(gone).encode(), kind=MessageKind.DELETE, ref=gone.msg_id),
        msg(group, 1_006, first.hlc.to_bytes(), kind=MessageKind.READ_RECEIPT, ref=first.msg_id),
    ]
    dm_ops: list[Op] = [add(DM, ALICE, 800), add(DM, BOB, 800), msg(dm, 850, b"psst")]
    identity = ALICE.identity(Hlc(700))
    return c.History(ALICE.user_id, identity, {group: group_ops, dm: dm_ops})


def build(history: c.History, max_chunk_bytes: int = c.DEFAULT_CHUNK_BYTES) -> dict[str, bytes]:
    return c.build_containers(ALICE.signing_key, history, os.urandom, max_chunk_bytes)


def by_stamp(ops: list[Op]) -> list[Op]:
    return sorted(ops, key=lambda op: (op.hlc, c.entry_of(op)))


def test_a_history_comes_back_op_for_op() -> None:
    history = sample_history()
    files = build(history)
    assert len(files) == 1 + 2 * 2  # root, and a conversation and one chunk per chat
    opened = c.open_containers(files, ALICE.signing_key)
    assert opened.history.identity == history.identity
    assert opened.history.chats.keys() == history.chats.keys()
    for chat, ops in history.chats.items():
        assert opened.history.chats[chat] == by_stamp(ops)  # time-sorted, byte for byte
    assert (opened.containers, opened.chunks) == (5, 2)
    assert opened.bytes == sum(map(len, files.values()))
    assert opened.history.op_count == 12


def test_keys_follow_the_dm3_formulas_and_containers_the_dm3_shapes() -> None:
    history = sample_history()
    files = build(history)

    def sha(text: str) -> str:
        return "0x" + hashlib.sha256(text.encode()).hexdigest()

    key = storage_key(ALICE.signing_key)
    root = sha(sign_text(ALICE.signing_key, ALICE.user_id.hex()))
    plain = json.loads(decrypt(key, json.loads(files[root + ".json"])))
    assert plain["conversations"] == [chat.hex() for chat in history.chats]
    assert plain["user"] == ALICE.user_id.hex() and plain["identity"]["kind"] == "identity"
    for chat in history.chats:
        conversation = sha(root + chat.hex())
        [chunk_id] = json.loads(decrypt(key, json.loads(files[conversation + ".json"])))["chunks"]
        first = min(op.hlc.physical_ms for op in history.chats[chat])
        assert chunk_id == {"id": 0, "timestamp": first}
        chunk = sha(conversation + stringify(chunk_id))
        entries = json.loads(decrypt(key, json.loads(files[chunk + ".json"])))["messages"]
        assert [e["timestamp"] for e in entries] == sorted(e["timestamp"] for e in entries)
        assert set(entries[0]) == {"kind", "op", "data", "timestamp"}
        assert {e["kind"] for e in entries} <= c.LABELS
        assert base64.b64decode(entries[-1]["data"])  # standard base64 of the signed op


def test_sealed_size_is_the_file_size() -> None:
    key = storage_key(ALICE.signing_key)
    for n in (0, 1, 2046, 2047, 2048, 2049, 4095, 4096, 100_000):
        sealed = stringify(encrypt(key, "x" * n, bytes(12))).encode()
        assert c.sealed_size(n) == len(sealed), n


@pytest.mark.parametrize("max_chunk_bytes", [c.MIN_CHUNK_BYTES, c.DEFAULT_CHUNK_BYTES])
def test_chunks_of_a_history_of_several_megabytes_honour_the_limit(max_chunk_bytes: int) -> None:
    group = GROUP.chat_id()
    big = [msg(group, 2_000 + i, bytes([i]) * (150_000 + 9_000 * i)) for i in range(12)]
    small = [msg(group, 3_000 + i, b"s%d" % i * 20) for i in range(2_000)]
    ops: list[Op] = [add(GROUP, ALICE, 1_000), *big, *small]
    history = c.History(ALICE.user_id, None, {group: ops})
    files = build(history, max_chunk_bytes)
    opened = c.open_containers(files, ALICE.signing_key)
    assert opened.history.chats[group] == by_stamp(ops)
    assert opened.chunks >= 4 and sum(map(len, files.values())) > 3_000_000
    # re-cut the same entries: each chunk's file is within the limit, and the next entry
    # would have taken it over (else it would have gone in)
    entries = [c.entry_of(op) for op in by_stamp(ops)]
    chunks = c.chunk_entries(entries, max_chunk_bytes)
    assert len(chunks) == opened.chunks and list(itertools.chain(*chunks)) == entries
    empty = len('{"messages":[]}')
    for chunk, after in itertools.zip_longest(chunks, chunks[1:]):
        size = empty + sum(map(len, chunk)) + len(chunk) - 1
        assert c.sealed_size(size) <= max_chunk_bytes
        if after is not None:
            assert c.sealed_size(size + 1 + len(after[0])) > max_chunk_bytes
            # a closed chunk misses at most one entry (< 460 kB sealed) of the maximum
            assert c.sealed_size(size) > max_chunk_bytes - c.sealed_size(len(after[0]))
            if max_chunk_bytes == c.DEFAULT_CHUNK_BYTES:
                assert c.sealed_size(size) >= c.MIN_CHUNK_BYTES
    file_sizes = [len(data) for data in files.values()]
    assert max(file_sizes) <= max_chunk_bytes


@pytest.mark.parametrize("size", [0, c.MIN_CHUNK_BYTES - 1, c.MAX_CHUNK_BYTES + 1])
def test_a_chunk_size_outside_500kb_to_10mb_is_refused(size: int) -> None:
    with pytest.raises(c.ContainerError, match=r"500,000\.\.10,000,000"):
        build(sample_history(), size)


# --- refused, with the file named ---


def root_name() -> str:
    return c.root_key(ALICE.signing_key) + ".json"


def chunk_names(files: dict[str, bytes]) -> list[str]:
    key = storage_key(ALICE.signing_key)
    return [n for n, d in files.items() if "messages" in decrypt(key, json.loads(d))]


def refused(files: dict[str, bytes], match: str) -> str:
    with pytest.raises(c.ContainerError, match=match) as info:
        c.open_containers(files, ALICE.signing_key)
    return str(info.value)


def test_a_flipped_ciphertext_byte_is_refused() -> None:
    files = build(sample_history())
    name = chunk_names(files)[0]
    sealed = json.loads(files[name])
    raw = bytearray(base64.b64decode(sealed["ciphertext"]))
    raw[len(raw) // 2] ^= 0x01
    sealed["ciphertext"] = base64.b64encode(bytes(raw)).decode()
    files[name] = json.dumps(sealed).encode()
    assert refused(files, "does not open").startswith(name)


def test_a_truncated_file_is_refused() -> None:
    files = build(sample_history())
    name = chunk_names(files)[-1]
    files[name] = files[name][: len(files[name]) // 2]
    assert refused(files, "truncated").startswith(name)


def test_a_missing_chunk_and_a_missing_conversation_are_refused() -> None:
    files = build(sample_history())
    name = chunk_names(files)[0]
    assert refused({n: d for n, d in files.items() if n != name}, "missing").startswith(name)
    files.pop(root_name())
    assert "a wrong key" in refused(files, "missing")


def test_another_users_key_finds_no_root_and_opens_nothing() -> None:
    files = build(sample_history())
    with pytest.raises(c.ContainerError, match=r"missing \(a wrong key"):
        c.open_containers(files, BOB.signing_key)


def reseal(files: dict[str, bytes], name: str, plain: object) -> None:
    """What a writer holding the storage key could put there (a bug, or a forger)."""
    key = storage_key(ALICE.signing_key)
    files[name] = stringify(encrypt(key, json.dumps(plain), os.urandom(12))).encode()


def refused_with_entries(
    files: dict[str, bytes], name: str, changed: list[object], match: str
) -> None:
    """The chunk ``name`` resealed with ``changed`` entries is refused, the file named."""
    copy = dict(files)
    reseal(copy, name, {"messages": changed})
    assert refused(copy, match).startswith(name)


def test_well_sealed_but_wrong_contents_are_refused() -> None:
    key = storage_key(ALICE.signing_key)
    files = build(sample_history())
    name = chunk_names(files)[0]
    entries = json.loads(decrypt(key, json.loads(files[name])))["messages"]

    def with_entries(changed: list[object], match: str) -> None:
        refused_with_entries(files, name, changed, match)

    signed = base64.b64decode(entries[-1]["data"])
    forged = dict(entries[-1], data=base64.b64encode(signed[:-1] + b"\x00").decode())  # its sig
    with_entries([*entries[:-1], forged], r"entry \d+: .*signature")
    with_entries([*entries[:-1], dict(entries[-1], kind="edit")], "does not match")
    with_entries([*entries[:-1], dict(entries[-1], timestamp=1)], "does not match|time-sorted")
    with_entries(list(reversed(entries)), "time-sorted")
    with_entries([], "no messages")
    with_entries([*entries, "extra"], "not an entry")
    with_entries([*entries[:-1], dict(entries[-1], data="%%%")], "base64")
    with_entries([*entries[:-1], dict(entries[-1], op=9)], "unknown op kind")
    root = json.loads(decrypt(key, json.loads(files[root_name()])))
    for plain, match in [
        (dict(root, user=BOB.user_id.hex()), "another user"),
        (dict(root, identity=json.loads(c.entry_of(BOB.identity(Hlc(5))))), "another user's"),
        (dict(root, conversations=["zz"]), "not a chat id"),
        (dict(root, conversations=root["conversations"] * 2), "distinct"),
        ({"conversations": []}, "fields"),
        ([1, 2], "fields"),
    ]:
        copy = dict(files)
        reseal(copy, root_name(), plain)
        assert refused(copy, match).startswith(root_name())


def test_an_oversized_file_is_refused_before_it_is_opened() -> None:
    files = build(sample_history())
    files[root_name()] = b" " * (c.MAX_FILE_BYTES + 1)
    refused(files, "over 10,000,000")


# --- the edges the mutation run asked for ---


def test_the_default_chunk_is_a_mebibyte_and_the_limits_are_inclusive() -> None:
    group = GROUP.chat_id()
    ops: list[Op] = [add(GROUP, ALICE, 1_000)]
    ops += [msg(group, 2_000 + i, bytes([i]) * 50_000) for i in range(40)]  # ~3.6 MB sealed
    history = c.History(ALICE.user_id, None, {group: ops})
    files = c.build_containers(ALICE.signing_key, history, os.urandom)
    sizes = sorted(len(files[name]) for name in chunk_names(files))
    assert 950_000 < sizes[-1] <= 1 << 20  # cut at 1 MiB (an entry is ~89 kB sealed)
    for limit in (c.MIN_CHUNK_BYTES, c.MAX_CHUNK_BYTES):  # both ends are allowed
        assert c.open_containers(build(sample_history(), limit), ALICE.signing_key).chunks == 2


def entries_of_chunk_plaintext(total: int) -> list[str]:
    """An add and two messages of ~2.7 kB whose one chunk's plaintext is ``total`` bytes."""
    group = GROUP.chat_id()
    first = c.entry_of(add(GROUP, ALICE, 1_000))
    second = c.entry_of(msg(group, 1_001, b"a" * 2_000))
    for n in range(1_500, 2_500):
        for ms in (1_002, 10_002, 100_002, 1_000_002):
            entries = [first, second, c.entry_of(msg(group, ms, b"b" * n))]
            if len('{"messages":[' + ",".join(entries) + "]}") == total:
                return entries
    raise AssertionError(f"no entries make {total} bytes")


def test_a_chunk_fills_to_the_exact_byte() -> None:
    # 6,143 bytes: one short of a padding block (2,048), so its sealed size is the limit exactly
    entries = entries_of_chunk_plaintext(3 * 2048 - 1)
    exact = c.sealed_size(3 * 2048 - 1)
    assert c.sealed_size(3 * 2048) > exact  # one byte more would take another block
    assert c.chunk_entries(entries, exact) == [entries]  # fits: one chunk
    assert c.chunk_entries(entries, exact - 1) == [entries[:2], entries[2:]]


def test_an_entry_bigger_than_a_chunk_is_refused() -> None:
    with pytest.raises(c.ContainerError, match="does not fit"):
        c.chunk_entries(["x" * 5_000], 4_000)


def test_a_container_over_the_file_limit_is_not_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(c, "MAX_FILE_BYTES", 3_000)  # a root of a few chats is ~2.8 kB sealed
    with pytest.raises(c.ContainerError, match="is over 3,000 bytes"):
        build(sample_history())
    monkeypatch.setattr(c, "MAX_FILE_BYTES", 10_000_000)
    files = build(sample_history())
    files[root_name()] = b" " * c.MAX_FILE_BYTES  # at the limit: opened (and found not JSON)
    refused(files, "not a sealed JSON container")


def test_an_empty_chat_is_left_out_and_the_next_one_kept() -> None:
    history = sample_history()
    empty_first = {bytes(32): [], **history.chats}
    files = build(c.History(ALICE.user_id, history.identity, empty_first))
    opened = c.open_containers(files, ALICE.signing_key).history
    assert set(opened.chats) == set(history.chats)


def test_chunks_may_meet_at_one_millisecond() -> None:
    """Entries of the same ms on both sides of a cut (HLCs differ in their logical part)."""
    group = GROUP.chat_id()
    ops: list[Op] = [add(GROUP, ALICE, 1_000)]
    ops += [
        MsgV1.create(ALICE.signing_key, group, Hlc(5_000, i), bytes([i]) * 120_000)
        for i in range(8)
    ]
    files = build(c.History(ALICE.user_id, None, {group: ops}), c.MIN_CHUNK_BYTES)
    opened = c.open_containers(files, ALICE.signing_key)
    assert opened.chunks >= 2 and opened.history.chats[group] == by_stamp(ops)


def conversation_name(files: dict[str, bytes]) -> str:
    key = storage_key(ALICE.signing_key)
    return next(n for n, d in files.items() if "chunks" in decrypt(key, json.loads(d)))


def test_a_wrong_chunk_list_is_refused() -> None:
    key = storage_key(ALICE.signing_key)
    files = build(sample_history())
    name = conversation_name(files)
    chunks = json.loads(decrypt(key, json.loads(files[name])))["chunks"]
    first = chunks[0]
    for plain, match in [
        ({"chunks": []}, "no chunk list"),
        ({"chunks": "0"}, "no chunk list"),
        ({"chunks": [dict(first, id=1)]}, "identifier is wrong"),
        ({"chunks": [[0, first["timestamp"]]]}, "identifier is wrong"),
        ({"chunks": [dict(first, id=True)]}, "identifier is wrong"),
        (
            {"chunks": [first, dict(first, id=1, timestamp=first["timestamp"] - 1)]},
            "identifier is wrong",
        ),
    ]:
        copy = dict(files)
        reseal(copy, name, plain)
        assert refused(copy, match).startswith(name)
    copy = dict(files)
    reseal(copy, name, {"chunks": [dict(first, timestamp=first["timestamp"] + 1)]})
    refused(copy, "missing")  # the chunk's key is made of its identifier: none is there
    copy[name] = stringify(encrypt(key, "not json", os.urandom(12))).encode()
    assert refused(copy, "inside is not JSON").startswith(name)


def test_entries_out_of_place_are_refused() -> None:
    key = storage_key(ALICE.signing_key)
    files = build(sample_history())
    name = chunk_names(files)[0]
    entries = json.loads(decrypt(key, json.loads(files[name])))["messages"]

    def with_entries(changed: list[object], match: str) -> None:
        refused_with_entries(files, name, changed, match)

    other_chat = json.loads(c.entry_of(msg(bytes(32), entries[0]["timestamp"], b"elsewhere")))
    identity = json.loads(c.entry_of(ALICE.identity(Hlc(entries[0]["timestamp"]))))
    with_entries([other_chat, *entries[1:]], "not of chat")
    with_entries([identity, *entries[1:]], "not of chat")
    with_entries([*entries[:-1], dict(entries[-1], extra=1)], "not an entry")
    with_entries([*entries[:-1], dict(entries[-1], kind="bogus")], "unknown op kind or label")
    with_entries([*entries[:-1], dict(entries[-1], op="1")], "unknown op kind or label")
    later = [dict(e) for e in entries]  # sorted, but not from the identifier's stamp
    with_entries(later[1:], "time-sorted from its identifier")
    root = json.loads(decrypt(key, json.loads(files[root_name()])))
    copy = dict(files)
    reseal(copy, root_name(), dict(root, identity=json.loads(c.entry_of(add(GROUP, ALICE, 5)))))
    assert refused(copy, "not an identity record").startswith(root_name())


def test_a_history_from_the_epoch_and_a_file_at_the_limit_are_fine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = GROUP.chat_id()
    ops: list[Op] = [add(GROUP, ALICE, 0), msg(group, 0, b"at ms 0")]  # chunk 0 stamped 0
    history = c.History(ALICE.user_id, None, {group: ops})
    assert c.open_containers(build(history), ALICE.signing_key).history.chats[group] == by_stamp(
        ops
    )
    largest = max(map(len, build(history).values()))  # sizes do not depend on the nonces
    monkeypatch.setattr(c, "MAX_FILE_BYTES", largest)
    build(history)  # a file of exactly the limit is written
    monkeypatch.setattr(c, "MAX_FILE_BYTES", largest - 1)
    with pytest.raises(c.ContainerError, match="is over"):
        build(history)
