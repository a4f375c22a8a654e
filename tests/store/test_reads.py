"""Read positions and unread counts from signed receipts (``store/reads.py``; MESSAGES.md,
"READ_RECEIPT"): the store's indexes against ``fold_chat``, the rule itself."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from rocksdict import Options, Rdict

from store import ChatDb, ChatKind, Hlc, InboxEntry, MessageKind, MsgV1
from store.hlc import MAX_LOGICAL, MAX_PHYSICAL
from store.kinds import fold_chat, reaction_payload
from store.reads import UNREAD_CAP
from store.records import STANDALONE, sender_and_kind
from store.retention import trim_chats
from sync.replica import DbReplica

from store_support import (
    AUTHOR_IDS,
    CHATS,
    GROUP_CHAT,
    fresh_db,
    group_op,
    make_msg,
    receipt_of,
    small_config,
)

CHAT = CHATS[0]
ALICE, BOB, CAROL = AUTHOR_IDS  # authors 0, 1, 2


def posts(n: int, *, author: int = 1, start: int = 1) -> list[MsgV1]:
    return [make_msg(CHAT, Hlc(start + i), author=author) for i in range(n)]


def test_the_position_is_the_greatest_receipt_whatever_the_order() -> None:
    msgs = posts(5)
    receipts = [receipt_of(msgs[i], Hlc(10 + i)) for i in (3, 1, 4, 0)]
    with fresh_db() as db:
        db.put_messages(msgs)
        assert db.read_position(CHAT, ALICE) is None
        best: Hlc | None = None
        for receipt in receipts:  # 3, then one behind it, then 4, then one behind again
            db.put_messages([receipt])
            read = Hlc.from_bytes(receipt.payload)
            best = read if best is None else max(best, read)
            assert db.read_position(CHAT, ALICE) == best
        assert db.read_position(CHAT, BOB) is None  # another reader
        assert db.read_position(CHATS[1], ALICE) is None  # another chat


def test_a_hidden_receipt_does_not_move_the_position() -> None:
    msgs = posts(4)
    shown, hidden = receipt_of(msgs[1], Hlc(10)), receipt_of(msgs[3], Hlc(11))
    with fresh_db() as db:
        db.put_messages([*msgs, shown])
        db.put_messages([hidden], hidden={hidden.msg_id})  # not a member at its stamp
        assert db.read_position(CHAT, ALICE) == msgs[1].hlc
        assert db.unread_count(CHAT, ALICE, msgs[1].hlc) == 2


def test_a_receipt_reading_past_its_own_stamp_moves_nothing() -> None:
    msgs = posts(3)
    ahead = receipt_of(msgs[2], Hlc(2))  # stamped before the message it claims to have read
    with fresh_db() as db:
        db.put_messages([*msgs, ahead])
        assert db.read_position(CHAT, ALICE) is None
        assert fold_chat([*msgs, ahead], [], lambda u, t: False).read_positions == {}


def test_only_content_by_others_after_the_position_is_unread() -> None:
    first, read, later = posts(3)
    own = make_msg(CHAT, Hlc(5), author=0)
    reply = make_msg(CHAT, Hlc(6), author=2, kind=MessageKind.REPLY, ref=first.msg_id)
    edit = make_msg(CHAT, Hlc(7), author=1, kind=MessageKind.EDIT, ref=later.msg_id)
    reaction = make_msg(
        CHAT, Hlc(8), reaction_payload(b"+1"), author=2, kind=MessageKind.REACTION, ref=own.msg_id
    )
    bobs_receipt = receipt_of(later, Hlc(9), author=1)
    hidden_post = make_msg(CHAT, Hlc(10), author=2)
    with fresh_db() as db:
        db.put_messages([first, read, later, own, reply, edit, reaction, bobs_receipt])
        db.put_messages([hidden_post], hidden={hidden_post.msg_id})
        assert db.unread_count(CHAT, ALICE, None) == 4  # first, read, later, reply
        assert db.unread_count(CHAT, ALICE, read.hlc) == 2  # later, reply
        assert db.unread_count(CHAT, BOB, None) == 2  # own (Alice's) and reply
        assert db.unread_count(CHAT, ALICE, Hlc(MAX_PHYSICAL, MAX_LOGICAL)) == 0  # the last stamp


def test_the_count_stops_at_the_cap() -> None:
    with fresh_db() as db:
        db.put_messages(posts(UNREAD_CAP + 5))
        assert db.unread_count(CHAT, ALICE, None) == UNREAD_CAP
        assert db.unread_count(CHAT, ALICE, Hlc(5)) == UNREAD_CAP  # 1,000 after it
        assert db.unread_count(CHAT, ALICE, Hlc(6)) == UNREAD_CAP - 1


def test_the_chat_list_counts_from_receipts() -> None:
    msgs = posts(4)
    with fresh_db() as db:
        db.put_messages(msgs)
        meta = db.load_meta(CHAT)
        entry = InboxEntry(CHAT, ChatKind.GROUP, meta.last_ts, meta.last_msg_id, BOB, meta.last_seq)
        db.upsert_inbox_for_members(CHAT, [ALICE, BOB], entry)
        assert [item.unread for item in db.list_user_chats(ALICE).items] == [4]
        assert [item.unread for item in db.list_user_chats(BOB).items] == [0]  # all his own
        db.put_messages([receipt_of(msgs[2], Hlc(20))])
        assert [item.unread for item in db.list_user_chats(ALICE).items] == [1]


# A few posts by three authors and, referring to them, edits, reactions and receipts (some
# reading past their own stamp), stored in any order: the store counts what the fold counts.
STAMPS = st.builds(Hlc, st.integers(1, 12), st.integers(0, 1))
OTHER_KINDS = st.sampled_from(
    [MessageKind.REPLY, MessageKind.EDIT, MessageKind.REACTION, MessageKind.READ_RECEIPT]
)


@st.composite
def chats(draw: st.DrawFn) -> list[MsgV1]:
    msgs = [
        make_msg(CHAT, draw(STAMPS), bytes([i]), author=draw(st.integers(0, 2)))
        for i in range(draw(st.integers(1, 6)))
    ]
    for i in range(draw(st.integers(0, 10))):
        target = draw(st.sampled_from(msgs))
        kind, author, stamp = draw(OTHER_KINDS), draw(st.integers(0, 2)), draw(STAMPS)
        if kind is MessageKind.READ_RECEIPT:
            msgs.append(receipt_of(target, stamp, author=author))
            continue
        payload = reaction_payload(b"k") if kind is MessageKind.REACTION else bytes([100 + i])
        msgs.append(make_msg(CHAT, stamp, payload, author=author, kind=kind, ref=target.msg_id))
    return msgs


@settings(max_examples=60)
@given(chats(), st.randoms(use_true_random=False), st.integers(1, 4))
def test_positions_and_counts_are_the_folds(msgs: list[MsgV1], rnd: object, group: int) -> None:
    view = fold_chat(msgs, [], lambda user, stamp: False)
    arrivals = list(msgs)
    rnd.shuffle(arrivals)  # type: ignore[attr-defined]
    with fresh_db() as db:
        for i in range(0, len(arrivals), group):
            db.put_messages(arrivals[i : i + group])
        for user in AUTHOR_IDS:
            position = db.read_position(CHAT, user)
            assert position == view.read_positions.get(user)
            assert db.unread_count(CHAT, user, position) == view.unread(user)


@given(
    st.builds(Hlc, st.integers(0, MAX_PHYSICAL), st.integers(0, MAX_LOGICAL))
    | st.builds(Hlc, st.just(0), st.integers(0, 300)),  # small stamps: short uint heads
    st.sampled_from(MessageKind),
    st.integers(0, 2),
)
def test_sender_and_kind_are_read_in_place(stamp: Hlc, kind: MessageKind, author: int) -> None:
    ref = None if kind in STANDALONE else bytes(32)
    msg = make_msg(CHAT, stamp, b"x" * 30, author=author, kind=kind, ref=ref)
    assert sender_and_kind(msg.encoded) == (msg.sender, int(msg.kind))


def test_a_database_with_the_retired_read_progress_family_opens(tmp_path: Path) -> None:
    """Before receipts, read progress was a local CF: opening such a database drops it."""
    path = str(tmp_path / "old")
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    old = Rdict(path, options, column_families={"user_read_progress": Options(raw_mode=True)})
    old.get_column_family("user_read_progress")[b"k"] = b"v"
    old.close()
    for _ in range(2):  # opened once with the retired CF, once after it was dropped
        with ChatDb(small_config(path)) as db:
            db.put_messages(posts(1))
    assert "user_read_progress" not in Rdict.list_cf(path)


def test_the_chat_list_shows_the_newest_content_not_what_refers_to_it(tmp_path: Path) -> None:
    """A reaction, an edit or a receipt stamped after the newest post moves neither the
    preview nor the chat's place in the list (MESSAGES.md, "The chat list")."""
    first, newest = (make_msg(GROUP_CHAT, Hlc(100 + i), b"post", author=1) for i in range(2))
    later = [
        make_msg(GROUP_CHAT, Hlc(200), reaction_payload(b"+1"), author=2,
                 kind=MessageKind.REACTION, ref=first.msg_id),
        make_msg(GROUP_CHAT, Hlc(201), b"better", author=1, kind=MessageKind.EDIT, ref=first.msg_id),
        receipt_of(newest, Hlc(202), author=2),
    ]  # fmt: skip
    with ChatDb(small_config(str(tmp_path))) as db:
        replica = DbReplica(db)
        replica.apply_ops([group_op(1, 1), group_op(2, 1), first, newest])
        for msg in later:  # one by one, and then the whole run again as one batch
            replica.apply_ops([msg])
        [entry] = [item.entry for item in db.list_user_chats(CAROL).items]
        assert (entry.last_msg_id, entry.last_ts) == (newest.msg_id, 101)
        assert entry.last_sender == BOB
        assert db.list_user_chats(CAROL).items[0].unread == 0  # her receipt: read up to newest
    with ChatDb(small_config(str(tmp_path / "batch"))) as db:
        DbReplica(db).apply_ops([group_op(1, 1), group_op(2, 1), first, newest, *later])
        [entry] = [item.entry for item in db.list_user_chats(CAROL).items]
        assert (entry.last_msg_id, entry.last_ts) == (newest.msg_id, 101)


def test_the_gc_trims_an_expired_receipt_with_the_messages() -> None:
    msgs = posts(6)  # stamped 1..6
    early, late = receipt_of(msgs[1], Hlc(3)), receipt_of(msgs[3], Hlc(20))
    with fresh_db() as db:
        db.put_messages([*msgs, early, late])
        assert db.read_position(CHAT, ALICE) == msgs[3].hlc
        trim_chats(db, 10)  # every post and the early receipt expire; the late one stays
        assert db.read_position(CHAT, ALICE) == msgs[3].hlc
        assert len(list(db.iter_prefix("receipts", CHAT))) == 1
        trim_chats(db, 20)
        assert db.read_position(CHAT, ALICE) is None
        assert list(db.iter_prefix("receipts", CHAT)) == []


def test_a_post_stamped_zero_is_unread_too() -> None:
    """The chat's newest content may be stamped Hlc(0, 0): 'no content' is the zero id."""
    first = make_msg(CHAT, Hlc(0), author=1)
    with fresh_db() as db:
        db.put_messages([first])
        assert db.unread_count(CHAT, ALICE, None) == 1
        assert fold_chat([first], [], lambda u, t: False).unread(ALICE) == 1


def test_a_database_of_an_earlier_version_gets_its_indexes_and_previews(tmp_path: Path) -> None:
    """Before ``referred`` and ``receipts`` existed: opening the database builds them from the
    held messages, and each chat's preview becomes its newest shown content message."""
    path = str(tmp_path / "old")
    first, second = (make_msg(GROUP_CHAT, Hlc(100 + i), b"post", author=1) for i in range(2))
    edit = make_msg(GROUP_CHAT, Hlc(110), b"better", author=1, kind=MessageKind.EDIT,
                    ref=first.msg_id)  # fmt: skip
    reaction = make_msg(GROUP_CHAT, Hlc(111), reaction_payload(b"+1"), author=2,
                        kind=MessageKind.REACTION, ref=first.msg_id)  # fmt: skip
    receipt = receipt_of(second, Hlc(112), author=2)
    held = [group_op(1, 1), group_op(2, 1), first, second, edit, reaction, receipt]
    with ChatDb(small_config(path)) as db:
        DbReplica(db).apply_ops(held)
        expected = DbReplica(db).view(GROUP_CHAT)
        meta = db.load_meta(GROUP_CHAT)
    # as an earlier version left it: no such CFs, the preview at the newest message of any kind
    everything = {name: Options(raw_mode=True) for name in Rdict.list_cf(path)}
    old = Rdict(path, Options(raw_mode=True), column_families=everything)
    for name in ("referred", "receipts"):
        old.drop_column_family(name)
    old.get_column_family("chats_meta")[GROUP_CHAT] = replace(
        meta, last_msg_id=receipt.msg_id, last_msg_ts=receipt.hlc.pack()
    ).encode()
    old.close()
    with ChatDb(small_config(path)) as db:
        [view] = [v for v in db.folded_range(GROUP_CHAT).views() if v.msg == first]
        assert (view.payload, view.reactions) == (b"better", {b"+1": (CAROL,)})
        assert db.read_position(GROUP_CHAT, CAROL) == expected.read_positions[CAROL] == second.hlc
        assert db.load_meta(GROUP_CHAT).last_msg_id == second.msg_id
    with ChatDb(small_config(path)) as db:  # and once built, opened as any other
        assert db.created_families == frozenset()
