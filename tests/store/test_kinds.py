"""The rules of MESSAGES.md as ``store/kinds.py`` states them: examples for each rule, the
decoders on bad input, and properties — the view is a function of the sets (any order, any
duplication), and erasure is monotone (more messages, deletes or admins never bring back
what was erased)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from random import Random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from store import Hlc, MessageKind, MsgV1
from store.errors import DecodeError
from store.kinds import (
    ChatView,
    Claims,
    IsAdmin,
    MessageView,
    Tombstone,
    check_public_payload,
    decode_claims,
    decode_reaction,
    decode_receipt,
    delete_is_valid,
    erased_by,
    erases,
    fold_chat,
    reaction_payload,
)

from store_support import AUTHOR_IDS, CHATS, GROUP_CHAT, KEYS, receipt_of

ALICE, BOB, CAROL = range(3)  # CAROL is the admin where a test says so


def no_admin(user: bytes, hlc: Hlc) -> bool:
    return False


def carol_admin_from(stamp: int) -> IsAdmin:
    return lambda user, hlc: user == AUTHOR_IDS[CAROL] and hlc >= Hlc(stamp)


@cache
def post(author: int, stamp: int, text: bytes = b"hi") -> MsgV1:
    return MsgV1.create(KEYS[author], GROUP_CHAT, Hlc(stamp), text)


@cache
def reply(author: int, stamp: int, target: MsgV1) -> MsgV1:
    return MsgV1.create(
        KEYS[author], GROUP_CHAT, Hlc(stamp), b"re", kind=MessageKind.REPLY, ref=target.msg_id
    )


@cache
def edit(author: int, stamp: int, target: MsgV1, text: bytes) -> MsgV1:
    return MsgV1.create(
        KEYS[author], GROUP_CHAT, Hlc(stamp), text, kind=MessageKind.EDIT, ref=target.msg_id
    )


@cache
def delete(author: int, stamp: int, target: MsgV1, claims: Claims | None = None) -> MsgV1:
    payload = (claims or Claims.of(target)).encode()
    return MsgV1.create(
        KEYS[author], GROUP_CHAT, Hlc(stamp), payload, kind=MessageKind.DELETE, ref=target.msg_id
    )


@cache
def react(author: int, stamp: int, target: MsgV1, key: bytes, *, retract: bool = False) -> MsgV1:
    payload = reaction_payload(key, retract=retract)
    return MsgV1.create(
        KEYS[author], GROUP_CHAT, Hlc(stamp), payload, kind=MessageKind.REACTION, ref=target.msg_id
    )


@cache
def receipt(author: int, stamp: int, target: MsgV1) -> MsgV1:
    return MsgV1.create(
        KEYS[author],
        GROUP_CHAT,
        Hlc(stamp),
        target.hlc.to_bytes(),
        kind=MessageKind.READ_RECEIPT,
        ref=target.msg_id,
    )


def views(msgs: list[MsgV1], deletes: Sequence[MsgV1] = (), admin: IsAdmin = no_admin) -> ChatView:
    return fold_chat(msgs, deletes, admin)


# --- EDIT ---


def test_the_authors_latest_edit_is_shown_and_marked() -> None:
    m = post(ALICE, 10, b"first")
    view = views([m, edit(ALICE, 20, m, b"second"), edit(ALICE, 30, m, b"third")])
    (item,) = view.items
    assert isinstance(item, MessageView)
    assert (item.payload, item.edited_at) == (b"third", Hlc(30))


def test_an_edit_by_someone_else_or_stamped_before_its_target_changes_nothing() -> None:
    m = post(ALICE, 10, b"first")
    (item,) = views([m, edit(BOB, 20, m, b"bob's"), edit(ALICE, 5, m, b"early")]).items
    assert isinstance(item, MessageView)
    assert (item.payload, item.edited_at) == (b"first", None)


def test_an_edit_stamped_with_its_targets_own_stamp_does_not_apply() -> None:
    m = post(ALICE, 10, b"first")
    (item,) = views([m, edit(ALICE, 10, m, b"same stamp")]).items
    assert isinstance(item, MessageView) and item.edit is None


def test_an_edit_that_arrives_before_its_target_applies_once_it_is_there() -> None:
    m = post(ALICE, 10, b"first")
    assert views([edit(ALICE, 20, m, b"second")]).items == []  # nothing to show yet
    (item,) = views([edit(ALICE, 20, m, b"second"), m]).items
    assert isinstance(item, MessageView) and item.payload == b"second"


def test_a_hidden_edit_does_not_apply() -> None:
    m = post(ALICE, 10, b"first")
    e = edit(ALICE, 20, m, b"while removed")
    (item,) = fold_chat([m, e], [], no_admin, shown=lambda x: x != e).items
    assert isinstance(item, MessageView) and item.payload == b"first"


# --- DELETE ---


def test_the_author_deletes_the_message_its_edits_and_reactions_replies_stay() -> None:
    m = post(ALICE, 10, b"secret")
    r = reply(BOB, 12, m)
    d = delete(ALICE, 30, m)
    msgs = [m, edit(ALICE, 20, m, b"secret 2"), react(BOB, 21, m, b"+1"), r]
    view = views(msgs, [d])
    tomb, rep = view.items
    assert tomb == Tombstone(m.msg_id, Hlc(10), AUTHOR_IDS[ALICE], AUTHOR_IDS[ALICE], Hlc(30))
    assert isinstance(rep, MessageView) and rep.msg == r and rep.reply_state == "deleted"
    for x in msgs[:3]:
        assert erased_by(x, [d], no_admin) == d
    assert erased_by(r, [d], no_admin) is None


def test_of_several_deletes_erasing_a_message_the_earliest_is_named() -> None:
    m = post(ALICE, 10)
    first, second = delete(ALICE, 20, m), delete(ALICE, 30, m)
    assert erased_by(m, [second, first], no_admin) == first
    assert erased_by(m, [first, second], no_admin) == first


def test_the_rules_answer_true_or_false() -> None:
    """Not a falsy None: views and the HTTP layer pass these answers on."""
    m, other = post(ALICE, 10), post(BOB, 11)
    own, lie = delete(ALICE, 30, m), delete(BOB, 30, m, Claims(AUTHOR_IDS[BOB], m.hlc, m.kind))
    assert delete_is_valid(own, no_admin) is True
    assert delete_is_valid(delete(ALICE, 5, m), no_admin) is False  # before its target
    assert erases(own, m) is True
    assert erases(lie, m) is False  # the claims do not match the target
    assert erases(own, other) is False  # another message, not referring to the target
    assert erases(own, edit(BOB, 20, m, b"x")) is False  # an edit by someone else
    elsewhere = MsgV1.create(KEYS[ALICE], CHATS[0], Hlc(10), b"hi")
    assert erases(own, elsewhere) is False  # another chat


def test_an_admin_may_delete_anyone_s_message_a_member_may_not() -> None:
    m = post(ALICE, 10)
    by_bob, by_carol = delete(BOB, 20, m), delete(CAROL, 20, m)
    assert not delete_is_valid(by_bob, carol_admin_from(0))
    assert delete_is_valid(by_carol, carol_admin_from(15))
    assert not delete_is_valid(by_carol, carol_admin_from(21))  # made admin after the delete
    assert views([m], [by_bob, by_carol], carol_admin_from(21)).items[0] == MessageView(m)
    assert isinstance(views([m], [by_carol], carol_admin_from(15)).items[0], Tombstone)


def test_a_delete_must_be_of_content_stamped_before_it() -> None:
    m = post(ALICE, 10)
    assert not delete_is_valid(delete(ALICE, 10, m), no_admin)  # same stamp
    e = edit(ALICE, 20, m, b"x")
    assert not delete_is_valid(delete(ALICE, 30, e), no_admin)  # an edit is not content


def test_a_delete_that_lies_about_its_target_erases_the_reactions_and_nothing_else() -> None:
    """Bob claims Alice's message is his: the delete is valid on its face (the author's own),
    so every replica — also those that never saw the target — drops the reactions to that
    id; the message and Alice's edits stay, because they do not match the claims."""
    m = post(ALICE, 10, b"alice")
    lie = delete(BOB, 30, m, Claims(AUTHOR_IDS[BOB], m.hlc, m.kind))
    msgs = [m, edit(ALICE, 20, m, b"alice 2"), react(CAROL, 21, m, b"+1")]
    (item,) = views(msgs, [lie]).items
    assert isinstance(item, MessageView)
    assert (item.payload, item.reactions) == (b"alice 2", {})


def test_a_replica_without_the_target_erases_the_same_dependents() -> None:
    m = post(ALICE, 10)
    dependents = [edit(ALICE, 20, m, b"x"), react(BOB, 21, m, b"+1"), edit(BOB, 22, m, b"y")]
    d = delete(ALICE, 30, m)
    with_target = {x.msg_id for x in dependents if erased_by(x, [d], no_admin)}
    assert with_target == {dependents[0].msg_id, dependents[1].msg_id}  # Bob's edit: not Alice's
    (tomb,) = views(dependents, [d]).items  # the target never arrived here
    assert isinstance(tomb, Tombstone) and tomb.msg_id == m.msg_id


def test_a_reply_says_whether_its_target_is_present_deleted_or_unknown() -> None:
    m = post(ALICE, 10)
    r = reply(BOB, 12, m)

    def state(msgs: list[MsgV1], deletes: Sequence[MsgV1] = ()) -> str | None:
        (item,) = [i for i in views(msgs, deletes).items if i.order == (r.hlc, r.msg_id)]
        assert isinstance(item, MessageView)
        return item.reply_state

    assert state([m, r]) == "present"
    assert state([r]) == "unknown"  # not arrived (yet)
    assert state([m, r], [delete(ALICE, 30, m)]) == "deleted"
    assert state([r], [delete(ALICE, 30, m)]) == "deleted"  # the delete says so without it
    (item,) = views([m]).items
    assert isinstance(item, MessageView) and item.reply_state is None  # not a reply


# --- REACTION ---


def test_reactions_toggle_per_user_and_key_the_latest_wins() -> None:
    m = post(ALICE, 10)
    rs = [
        react(BOB, 20, m, b"+1"),
        react(BOB, 30, m, b"+1", retract=True),
        react(CAROL, 20, m, b"+1"),
        react(CAROL, 25, m, b"ok"),
        react(BOB, 40, m, b"ok"),
    ]
    (item,) = views([m, *rs]).items
    assert isinstance(item, MessageView)
    assert item.reactions == {
        b"+1": (AUTHOR_IDS[CAROL],),
        b"ok": tuple(sorted((AUTHOR_IDS[BOB], AUTHOR_IDS[CAROL]))),
    }


def test_a_malformed_reaction_is_skipped_and_the_rest_still_count() -> None:
    m = post(ALICE, 10)
    bad = MsgV1.create(
        KEYS[BOB], GROUP_CHAT, Hlc(20), b"\x02+", kind=MessageKind.REACTION, ref=m.msg_id
    )
    (item,) = views([m, bad, react(CAROL, 21, m, b"+1")]).items
    assert isinstance(item, MessageView) and item.reactions == {b"+1": (AUTHOR_IDS[CAROL],)}


# --- READ_RECEIPT and unread ---


def test_unread_counts_others_content_after_the_greatest_receipt() -> None:
    a1, b1, a2, b2 = post(ALICE, 10), post(BOB, 20), post(ALICE, 30), post(BOB, 40)
    noise = [edit(BOB, 41, b2, b"x"), react(BOB, 42, a1, b"+1")]
    receipts = [receipt(ALICE, 25, b1), receipt(ALICE, 50, a1)]  # the second moves back
    view = views([a1, b1, a2, b2, *noise, *receipts])
    assert view.read_positions[AUTHOR_IDS[ALICE]] == Hlc(20)
    assert view.unread(AUTHOR_IDS[ALICE]) == 1  # b2; own posts and other kinds never count
    assert view.unread(AUTHOR_IDS[BOB]) == 2  # a1, a2: Bob sent no receipt
    assert views([a1, b1, a2, b2], [delete(BOB, 45, b2)]).unread(AUTHOR_IDS[ALICE]) == 1  # b1


# --- decoders ---


@pytest.mark.parametrize(
    "payload",
    [b"", bytes(28), bytes(30), bytes(20) + Hlc(1).to_bytes() + b"\x09"],
)
def test_malformed_claims_are_refused(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_claims(payload)


def test_an_unknown_kind_in_claims_is_named_in_the_error() -> None:
    with pytest.raises(DecodeError, match="unknown kind 9"):
        decode_claims(bytes(20) + Hlc(1).to_bytes() + b"\x09")


@given(
    st.binary(min_size=20, max_size=20),
    st.integers(0, (1 << 64) - 1).map(Hlc.unpack),
    st.sampled_from(MessageKind),
)
def test_claims_decode_to_what_was_encoded(sender: bytes, hlc: Hlc, kind: MessageKind) -> None:
    claims = Claims(sender, hlc, kind)
    assert decode_claims(claims.encode()) == claims


@given(st.binary(min_size=1, max_size=64), st.booleans())
@example(bytes(64), False)  # the longest key: at the bound
@example(b"+", True)  # the shortest
def test_reactions_decode_to_what_was_encoded(key: bytes, retract: bool) -> None:
    assert decode_reaction(reaction_payload(key, retract=retract)) == (not retract, key)


@pytest.mark.parametrize("size", [0, 65])
def test_a_reaction_key_is_1_to_64_bytes(size: int) -> None:
    with pytest.raises(ValueError):
        reaction_payload(bytes(size))


@pytest.mark.parametrize("payload", [b"", b"\x01", b"\x02+", b"\x01" + bytes(65)])
def test_malformed_reactions_are_refused(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_reaction(payload)


def test_a_receipt_must_be_eight_bytes_and_not_read_past_its_stamp() -> None:
    m = post(ALICE, 10)
    ahead = receipt_of(m, Hlc(5), author=BOB)  # reads m, stamped at 10
    with pytest.raises(DecodeError):
        decode_receipt(ahead)
    short = MsgV1.create(
        KEYS[BOB], GROUP_CHAT, Hlc(50), b"\x00", kind=MessageKind.READ_RECEIPT, ref=m.msg_id
    )
    with pytest.raises(DecodeError):
        decode_receipt(short)
    assert views([m, ahead, short]).read_positions == {}  # ignored by the fold


def test_a_receipt_may_read_up_to_its_own_stamp() -> None:
    m = post(ALICE, 10)
    at = receipt_of(m, Hlc(10), author=BOB)
    assert decode_receipt(at) == Hlc(10)


@pytest.mark.parametrize(
    ("kind", "payload"),
    [
        (MessageKind.DELETE, bytes(28)),
        (MessageKind.REACTION, b"\x02+"),
        (MessageKind.READ_RECEIPT, b"\x00"),
    ],
)
def test_every_ingress_refuses_a_malformed_public_payload(
    kind: MessageKind, payload: bytes
) -> None:
    m = post(ALICE, 10)
    bad = MsgV1.create(KEYS[BOB], GROUP_CHAT, Hlc(50), payload, kind=kind, ref=m.msg_id)
    with pytest.raises(DecodeError):
        check_public_payload(bad)
    for good in (delete(ALICE, 30, m), react(BOB, 31, m, b"+1"), receipt(BOB, 32, m), m):
        check_public_payload(good)  # well formed, and content is never read


# --- properties ---

TARGETS = [post(ALICE, 10), post(BOB, 12), reply(CAROL, 14, post(ALICE, 10))]


def universe() -> list[MsgV1]:
    """Every kind by every author on every target, and deletes true and lying."""
    out: list[MsgV1] = list(TARGETS)
    for n, t in enumerate(TARGETS):
        for who in (ALICE, BOB, CAROL):
            out.append(edit(who, 20 + n, t, b"e%d" % who))
            out.append(edit(who, 70 + n, t, b"again %d" % who))  # after the deletes, too
            out.append(react(who, 30 + n, t, b"+1", retract=who == CAROL))
            out.append(receipt(who, 40 + n, t))
            out.append(delete(who, 50 + n, t))
        out.append(delete(BOB, 60 + n, t, Claims(AUTHOR_IDS[BOB], t.hlc, t.kind)))
    return out


UNIVERSE = universe()
# each message of the universe in or out: targets with several edits, deletes and reactions
# are common (a list sampled from the universe rarely holds a target with two of its edits)
SUBSETS = st.lists(st.booleans(), min_size=len(UNIVERSE), max_size=len(UNIVERSE)).map(
    lambda mask: [m for m, keep in zip(UNIVERSE, mask, strict=True) if keep]
)


def split(msgs: list[MsgV1]) -> tuple[list[MsgV1], list[MsgV1]]:
    return (
        [m for m in msgs if m.kind is not MessageKind.DELETE],
        [m for m in msgs if m.kind is MessageKind.DELETE],
    )


@settings(max_examples=100)
@given(SUBSETS, st.randoms(use_true_random=False), st.integers(0, 60))
def test_the_view_is_a_function_of_the_sets(
    msgs: list[MsgV1], rnd: Random, admin_from: int
) -> None:
    shuffled = msgs + msgs[: len(msgs) // 2]
    rnd.shuffle(shuffled)
    admin = carol_admin_from(admin_from)
    assert fold_chat(*split(shuffled), admin) == fold_chat(*split(msgs), admin)


@settings(max_examples=100)
@given(SUBSETS, SUBSETS, st.integers(0, 60), st.integers(0, 60))
def test_erasure_is_monotone(
    msgs: list[MsgV1], more: list[MsgV1], admin_from: int, earlier: int
) -> None:
    """What a set of deletes erases stays erased with more deletes and an earlier admin grant."""
    _, deletes = split(msgs)
    _, more_deletes = split(more)
    then = carol_admin_from(admin_from)
    later = carol_admin_from(min(admin_from, earlier))
    for m in UNIVERSE:
        if m.kind is MessageKind.DELETE:
            continue
        if erased_by(m, deletes, then) is not None:
            assert erased_by(m, deletes + more_deletes, later) is not None
