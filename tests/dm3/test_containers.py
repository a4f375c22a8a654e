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


def test_well_sealed_but_wrong_contents_are_refused() -> None:
    key = storage_key(ALICE.signing_key)
    files = build(sample_history())
    name = chunk_names(files)[0]
    entries = json.loads(decrypt(key, json.loads(files[name])))["messages"]

    def with_entries(changed: list[object], match: str) -> None:
        copy = dict(files)
        reseal(copy, name, {"messages": changed})
        assert refused(copy, match).startswith(name)

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
