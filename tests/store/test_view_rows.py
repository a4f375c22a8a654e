"""The view rows (store.view_rows) equal a recompute from the stored messages at every point,
and after a restart.

A row is derived state kept in the WriteBatch of each write that changes what it folds:
edits and reactions stored (before or after their target), deletes that erase a target or
a referrer, removals that hide (and adds that show again) what a sender stamped, the
retention trim. Whatever the order those ops arrive in, every row equals the rule
(``store.kinds``: ``latest_edit``, ``reactions_of``) over each held content message's held,
shown edits and reactions, and the folded pages equal ``fold_chat``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rocksdict import Options, Rdict

from store import ChatDb, Hlc, MessageKind, MsgV1
from store.authz import new_group
from store.errors import DecodeError
from store.keys import seq_of
from store.kinds import (
    CHANGES_TARGET,
    CONTENT,
    Claims,
    MessageView,
    fold_chat,
    latest_edit,
    reaction_payload,
    reactions_of,
)
from store.ops import MembershipAction, MembershipOp
from store.records import Role, decode_msg
from store.retention import trim_chats
from store.view_row import Reactions, decode_view, encode_view
from sync.replica import DbReplica

from store_support import AUTHOR_IDS, KEYS, TMP_ROOT, small_config

GROUPS = [new_group(KEYS[c], b"view-row-test%03d" % c) for c in range(2)]  # chat c: KEYS[c]'s
REACTION_KEYS = (b"+1", b"ok")

Step = tuple[str, int, int, int, int]  # (what, user, chat, stamp, which earlier message)


def member_op(user: int, chat: int, stamp: int, *, remove: bool) -> MembershipOp:
    action = MembershipAction.REMOVE if remove else MembershipAction.ADD
    group = GROUPS[chat]
    return MembershipOp.create(
        KEYS[chat], group.chat_id(), AUTHOR_IDS[user], action, Hlc(stamp), Role.PARTICIPANT,
        proof=group,
    )  # fmt: skip


def op_of(step: Step, posted: list[MsgV1]) -> MembershipOp | MsgV1 | None:
    """The op a step makes; it may refer to any message made before it (held or not yet)."""
    what, user, chat, stamp, which = step
    chat_id = GROUPS[chat].chat_id()
    if what in ("add", "remove"):
        return member_op(user, chat, stamp, remove=what == "remove")
    mine = [m for m in posted if m.chat_id == chat_id]
    if what in ("edit", "own_edit", "react", "retract", "delete", "lie"):
        if not mine:
            return None
        target = mine[which % len(mine)]
        own = AUTHOR_IDS.index(target.sender)
        author = own if what in ("own_edit", "delete") else user
        if what == "delete":  # by its author: erases it, its author's edits, its reactions
            payload, kind = Claims.of(target).encode(), MessageKind.DELETE
        elif what == "lie":  # another author claims it: it and its author's edits stay, its
            author = (own + 1 + user % 2) % len(KEYS)  # reactions go
            claims = Claims(AUTHOR_IDS[author], target.hlc, target.kind)
            payload, kind = claims.encode(), MessageKind.DELETE
        elif what in ("edit", "own_edit"):
            payload, kind = b"edited %d" % stamp, MessageKind.EDIT
        else:
            key = REACTION_KEYS[which % 2]
            payload, kind = reaction_payload(key, retract=what == "retract"), MessageKind.REACTION
        hlc = Hlc(stamp, 2 if kind is MessageKind.DELETE else 1)
        return MsgV1.create(KEYS[author], chat_id, hlc, payload, kind=kind, ref=target.msg_id)
    kind = MessageKind.REPLY if what == "reply" and mine else MessageKind.NEW
    ref = mine[which % len(mine)].msg_id if kind is MessageKind.REPLY else None
    msg = MsgV1.create(KEYS[user], chat_id, Hlc(stamp), b"m%d" % stamp, kind=kind, ref=ref)
    posted.append(msg)
    return msg


def recomputed(db: ChatDb) -> dict[bytes, tuple[bytes | None, Reactions]]:
    """Messages key -> (edit bytes, reactions) of every held content message its held, shown
    edits and reactions change: the rule, from scratch."""
    out: dict[bytes, tuple[bytes | None, Reactions]] = {}
    for group in GROUPS:
        chat = group.chat_id()
        hidden = db.hidden.seqs(chat)
        held = [(key, decode_msg(v, trusted=True)) for key, v in db.iter_prefix("messages", chat)]
        refs: dict[bytes, list[MsgV1]] = {}
        for key, m in held:
            if seq_of(key) not in hidden and m.kind in CHANGES_TARGET and m.ref is not None:
                refs.setdefault(m.ref, []).append(m)
        for key, m in held:
            if m.kind in CONTENT and (mine := refs.get(m.msg_id)):
                edit = latest_edit(m, mine)
                reactions = reactions_of(r for r in mine if r.kind is MessageKind.REACTION)
                if edit is not None or reactions:
                    out[key] = (None if edit is None else edit.encoded, reactions)
    return out


def check_rows(db: ChatDb) -> int:
    """Every view row equals the recompute, and every folded page ``fold_chat``'s view; how
    many rows there are."""
    rows = {key: decode_view(value) for key, value in db.iter_all("views")}
    assert rows == recomputed(db)
    for group in GROUPS:
        chat = group.chat_id()
        held = db.chat_messages(chat)
        deletes = db.deletes_of(chat)
        is_shown = {m for m, visible in held if visible}.__contains__
        folded = fold_chat([m for m, _ in held], deletes, db.admins(chat), is_shown)
        want = [_seen(v) for v in folded.items if isinstance(v, MessageView)]
        got, cursor = [], None
        while True:
            page = db.folded_range(chat, cursor, limit=3)
            got += [_seen(v) for v in page.views()]
            if (cursor := page.next_cursor) is None:
                break
        assert sorted(got) == sorted(want)
    return len(rows)


def _seen(view: MessageView) -> tuple[bytes, bytes, object, object, object]:
    edited = None if view.edit is None else view.edit.encoded
    return view.msg.msg_id, view.payload, edited, sorted(view.reactions.items()), view.reply_state


WHAT = ["post", "post", "post", "reply", "edit", "own_edit", "own_edit", "react", "react"]
WHAT += ["retract", "delete", "lie", "add", "remove", "remove", "trim", "trim"]
steps = st.lists(
    st.tuples(
        st.sampled_from(WHAT),
        st.integers(0, 2),
        st.integers(0, 1),
        st.integers(2, 40),
        st.integers(0, 30),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(steps, st.data(), st.integers(1, 3))
def test_every_view_row_equals_a_recompute_after_every_op_in_any_order(
    plan: list[Step], data: st.DataObject, per_batch: int
) -> None:
    """The steps' ops (posts, replies, edits by the author or not, reactions and retractions,
    deletes, adds, removals) delivered in any order, ``per_batch`` at a time, a trim where a
    step says so; every row checked after every write and after a reopen."""
    posted: list[MsgV1] = []
    ops: list[object] = []
    for step in plan:
        op = ("trim", step[3]) if step[0] == "trim" else op_of(step, posted)
        if op is not None:
            ops.append(op)
    order = data.draw(st.permutations(ops))
    with tempfile.TemporaryDirectory(prefix="chatdb-test-", dir=TMP_ROOT) as tmp:
        with ChatDb(small_config(tmp)) as db:
            replica = DbReplica(db)
            replica.apply_ops([member_op(c, c, 0, remove=False) for c in range(2)])
            replica.apply_ops(
                [member_op(u, c, 1, remove=False) for c in range(2) for u in range(3)]
            )
            for i in range(0, len(order), per_batch):
                batch = order[i : i + per_batch]
                for trim in [op for op in batch if isinstance(op, tuple)]:
                    trim_chats(db, trim[1] // 3)
                replica.apply_ops([op for op in batch if not isinstance(op, tuple)])  # type: ignore[misc]
                check_rows(db)
            before = dict(db.iter_all("views"))
        with ChatDb(small_config(tmp)) as db:
            assert dict(db.iter_all("views")) == before
            check_rows(db)


def test_a_store_without_view_rows_gets_them_on_open(tmp_path: Path) -> None:
    """A store written before the rows existed (no ``views`` column family) has them made
    from ``referred`` when opened: equal to what the writes would have kept."""
    posted: list[MsgV1] = []
    plan = [("post", 0, 0, 5, 0), ("post", 1, 0, 6, 0), ("own_edit", 0, 0, 9, 0)]
    plan += [("react", 1, 0, 9, 1), ("react", 2, 0, 3, 1), ("retract", 2, 0, 10, 1)]
    ops = [op_of(step, posted) for step in plan]  # type: ignore[arg-type]
    with ChatDb(small_config(str(tmp_path))) as db:
        replica = DbReplica(db)
        replica.apply_ops([member_op(0, 0, 0, remove=False)])
        replica.apply_ops([member_op(u, 0, 1, remove=False) for u in range(3)])
        replica.apply_ops(ops)  # type: ignore[arg-type]
        kept = dict(db.iter_all("views"))
        assert len(kept) == 2
    everything = {name: Options(raw_mode=True) for name in Rdict.list_cf(str(tmp_path))}
    old = Rdict(str(tmp_path), Options(raw_mode=True), column_families=everything)
    old.drop_column_family("views")
    old.close()
    with ChatDb(small_config(str(tmp_path))) as db:
        assert "views" in db.rocks.created_families
        assert dict(db.iter_all("views")) == kept
        check_rows(db)


@given(
    st.one_of(st.none(), st.binary(min_size=1, max_size=60)),
    st.dictionaries(
        st.binary(min_size=1, max_size=64),
        st.lists(st.binary(min_size=20, max_size=20), min_size=1, max_size=4, unique=True),
        max_size=3,
    ),
)
def test_a_view_row_round_trips(edit: bytes | None, reactions: dict[bytes, list[bytes]]) -> None:
    tally = {key: tuple(sorted(users)) for key, users in sorted(reactions.items())}

    class Edit:
        encoded = edit

    row = encode_view(None if edit is None else Edit(), tally)  # type: ignore[arg-type]
    if edit is None and not tally:
        assert row is None
        return
    assert row is not None
    assert decode_view(row) == (edit, tally)


@given(st.binary(max_size=80))
def test_any_bytes_decode_to_a_valid_row_or_a_decode_error(raw: bytes) -> None:
    try:
        edit, reactions = decode_view(raw)
    except DecodeError:
        return
    assert edit is not None or reactions
    assert list(reactions) == sorted(set(reactions))
    assert all(1 <= len(key) <= 64 for key in reactions)
    assert all(users and list(users) == sorted(set(users)) for users in reactions.values())

    class Edit:  # (an edit's bytes: what encode_view reads of it)
        encoded = edit

    assert encode_view(None if edit is None else Edit(), reactions) == raw  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "raw",
    [
        b"",  # no edit length
        b"\x00\x00\x00\x05abc",  # the edit runs past the end
        b"\x00\x00\x00\x00",  # nothing changed: no row is written so
        b"\x00\x00\x00\x00\x02+1\x00\x00",  # a reaction without users
        b"\x00\x00\x00\x00\x00\x00\x01" + b"u" * 20,  # an empty key
        b"\x00\x00\x00\x00\x41" + b"k" * 65 + b"\x00\x01" + b"u" * 20,  # a key over 64 bytes
        b"\x00\x00\x00\x00\x02+1\x00\x02" + b"v" * 20 + b"u" * 20,  # users not ascending
        b"\x00\x00\x00\x00\x02ok\x00\x01" + b"u" * 20 + b"\x02+1\x00\x01" + b"u" * 20,  # keys
    ],
)
def test_a_malformed_view_row_is_a_decode_error(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_view(raw)


def _apply(tmp: str, ops: list[object]) -> ChatDb:
    db = ChatDb(small_config(tmp))
    replica = DbReplica(db)
    replica.apply_ops([member_op(0, 0, 0, remove=False)])
    replica.apply_ops([member_op(u, 0, 1, remove=False) for u in range(3)])
    replica.apply_ops(ops)  # type: ignore[arg-type]
    return db


def test_a_lying_delete_folds_the_target_again_without_its_reactions(tmp_path: Path) -> None:
    posted: list[MsgV1] = []
    plan = [("post", 0, 0, 5, 0), ("own_edit", 0, 0, 9, 0), ("react", 1, 0, 9, 0)]
    ops = [op_of(step, posted) for step in plan]  # type: ignore[arg-type]
    db = _apply(str(tmp_path), ops)
    try:
        [(_, row)] = db.iter_all("views")
        assert decode_view(row)[1] == {b"+1": (AUTHOR_IDS[1],)}
        DbReplica(db).apply_ops([op_of(("lie", 0, 0, 12, 0), posted)])  # type: ignore[list-item]
        [(_, row)] = db.iter_all("views")
        assert decode_view(row)[1] == {}  # the author's edit stays
        check_rows(db)
    finally:
        db.close()


def test_a_reaction_stamped_before_its_target_leaves_the_row_when_trimmed(tmp_path: Path) -> None:
    posted: list[MsgV1] = []
    plan = [("post", 0, 0, 20, 0), ("react", 1, 0, 5, 0), ("react", 2, 0, 25, 0)]
    ops = [op_of(step, posted) for step in plan]  # type: ignore[arg-type]
    db = _apply(str(tmp_path), ops)
    try:
        [(_, row)] = db.iter_all("views")
        assert decode_view(row)[1] == {b"+1": (AUTHOR_IDS[1], AUTHOR_IDS[2])}
        trim_chats(db, 10)
        [(_, row)] = db.iter_all("views")
        assert decode_view(row)[1] == {b"+1": (AUTHOR_IDS[2],)}
        check_rows(db)
    finally:
        db.close()


@pytest.mark.parametrize("with_target", [False, True], ids=["edit", "target"])
def test_a_delete_erasing_a_reaction_in_the_same_write_as_a_change_leaves_it_out(
    tmp_path: Path, with_target: bool
) -> None:
    """A delete erases a held reaction in the write that also stores an edit of its target
    (or the target itself, the reaction having come first): the rows the messages' half of
    that write folds read the store before it, where the reaction is still held, so they
    must leave it out by name (found by the property above)."""
    posted: list[MsgV1] = []
    plan = [("post", 0, 0, 5, 0), ("react", 1, 0, 9, 0), ("own_edit", 0, 0, 9, 0)]
    target, reaction, edit = [op_of(step, posted) for step in plan]  # type: ignore[arg-type]
    lie = op_of(("lie", 0, 0, 12, 0), posted)
    first, together = (
        ([target, reaction], [edit, lie]) if not with_target else ([reaction], [target, edit, lie])
    )
    db = _apply(str(tmp_path), first)
    try:
        DbReplica(db).apply_ops(together)  # type: ignore[arg-type]
        [(_, row)] = db.iter_all("views")
        assert decode_view(row) == (edit.encoded, {})  # type: ignore[union-attr]
        check_rows(db)
    finally:
        db.close()
