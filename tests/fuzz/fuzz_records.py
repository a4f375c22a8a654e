"""Fuzz target ``records``: every record decoder of ``store.records`` on the same bytes.

Properties: each decoder either raises ``DecodeError`` (a subclass) or returns a record whose
re-encoding is exactly the input — one value, one encoding. Any other exception is a crash.
The ``trusted=True`` fast paths (for bytes read back from our own RocksDB) agree with the full
decode: the same record whenever the full decode accepts, a ``DecodeError`` whenever it
refuses for any reason but ``non_canonical`` (the one check the fast path skips).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import cbor2

from fuzz_support import NOW_MS, instrumented, main

with instrumented(__name__ == "__main__"):
    from store.authz import DmProof
    from store.errors import DecodeError
    from store.hlc import Hlc
    from store.ops import MembershipAction, MembershipOp, make_identity
    from store.records import (
        ChatKind,
        ChatMeta,
        InboxEntry,
        MemberInfo,
        MemberRecord,
        MessageKind,
        MsgV1,
        Role,
        decode_chat_meta,
        decode_identity_record,
        decode_identity_value,
        decode_inbox_entry,
        decode_member_info,
        decode_member_record,
        decode_msg,
        dm_chat_id,
        encode_identity_value,
    )
    from store.signing import key_from_seed, public_key, user_id_from_key

TARGET = "records"


def _msg(v: MsgV1) -> bytes:
    return dataclasses.replace(v).encoded  # a fresh instance: encoded again, not the cached input


def _identity_value(v: tuple[Hlc, bytes]) -> bytes:
    return encode_identity_value(*v)


def _encode(v: Any) -> bytes:
    encoded: bytes = v.encode()
    return encoded


# (decoder, re-encoder)
DECODERS: list[tuple[Callable[[bytes], Any], Callable[[Any], bytes]]] = [
    (decode_msg, _msg),
    (decode_member_info, _encode),
    (decode_member_record, _encode),
    (decode_identity_record, _encode),
    (decode_identity_value, _identity_value),
    (decode_chat_meta, _encode),
    (decode_inbox_entry, _encode),
]


# decoders with a ``trusted`` fast path
TRUSTED: list[Callable[..., Any]] = [decode_msg, decode_inbox_entry]


def one_input(data: bytes) -> None:
    for decode, encode in DECODERS:
        try:
            value = decode(data)
        except DecodeError:
            continue
        again = encode(value)
        if again != data:
            raise AssertionError(f"{decode.__name__}: re-encoding differs: {again!r} != {data!r}")
    for decode in TRUSTED:
        _same_when_trusted(decode, data)


def _same_when_trusted(decode: Callable[..., Any], data: bytes) -> None:
    try:
        full = decode(data)
    except DecodeError as exc:
        full, refused = None, exc.reason
    try:
        fast = decode(data, trusted=True)
    except DecodeError:
        fast = None
    if full is not None and fast != full:
        raise AssertionError(f"{decode.__name__}(trusted=True) differs: {fast!r} != {full!r}")
    if full is None and fast is not None and refused != "non_canonical":
        raise AssertionError(f"{decode.__name__}(trusted=True) accepts what is {refused!r}")


def seeds() -> dict[str, bytes]:
    alice, bob = key_from_seed(b"\x01" * 32), key_from_seed(b"\x02" * 32)
    a_id, b_id = user_id_from_key(public_key(alice)), user_id_from_key(public_key(bob))
    chat = dm_chat_id(a_id, b_id)
    hlc = Hlc(NOW_MS - 5_000, 3)
    first = MsgV1.create(alice, chat, hlc, b"hello")
    reply = MsgV1.create(
        bob, chat, Hlc(NOW_MS), b"\x00" * 40, kind=MessageKind.REPLY, ref=first.msg_id
    )
    add = MembershipOp.create(
        alice, chat, b_id, MembershipAction.ADD, hlc, proof=DmProof(a_id, b_id)
    )
    leave = MembershipOp.create(
        bob, chat, b_id, MembershipAction.LEAVE, Hlc(NOW_MS), proof=DmProof(a_id, b_id)
    )
    info = MemberInfo(Role.PARTICIPANT, hlc, Hlc(NOW_MS), add.encode(), leave.encode())
    identity = make_identity(alice, b"\x07" * 32, hlc)
    return {
        "msg-new": first.encoded,
        "msg-reply": reply.encoded,
        "member-info-plain": MemberInfo(Role.ADMIN, hlc).encode(),
        "member-info-signed": info.encode(),
        "member-record": MemberRecord(chat, b_id, info).encode(),
        "member-record-plain": MemberRecord(chat, a_id, MemberInfo(Role.PARTICIPANT, hlc)).encode(),
        "identity-record": identity.encode(),
        "identity-value": encode_identity_value(identity.hlc, identity.blob),
        "chat-meta-empty": ChatMeta().encode(),
        "chat-meta": ChatMeta(
            hlc.physical_ms, 7, first.msg_id, (a_id, b_id), hlc.pack(), 0, b"dm", b"\x01" * 32
        ).encode(),
        # Regression: a bignum version made the error message raise ValueError.
        "regression-bignum-version": cbor2.dumps([cbor2.CBORTag(2, b"\x01" * 2000), 1]),
        "inbox-entry": InboxEntry(
            chat, ChatKind.DM, hlc.physical_ms, first.msg_id, a_id, 7, "hi"
        ).encode(),
    }


if __name__ == "__main__":
    main(TARGET, one_input, seeds)
