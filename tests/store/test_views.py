"""The folded history page by page (store/views.py): tombstones on exactly one page, in
both directions, at the place of the deleted message; edits and reactions folded in."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from store import ChatDb, ChatDbConfig, Hlc, MessageKind, MsgV1
from store.kinds import Claims, MessageView, Tombstone, message_view, reaction_payload
from store.messages import Direction
from store.views import FoldedPage
from sync.replica import DbReplica

from store_support import AUTHOR_IDS, GROUP_CHAT, KEYS, group_op


def post(n: int) -> MsgV1:
    return MsgV1.create(KEYS[1], GROUP_CHAT, Hlc(100 + 10 * n), b"post %d" % n)


def about(kind: MessageKind, target: MsgV1, payload: bytes, later: int, key: int = 1) -> MsgV1:
    hlc = Hlc(target.hlc.physical_ms + later)
    return MsgV1.create(KEYS[key], GROUP_CHAT, hlc, payload, kind=kind, ref=target.msg_id)


@pytest.mark.parametrize("direction", list(Direction))
@pytest.mark.parametrize("limit", [1, 2, 3, 10])
def test_every_page_in_order_and_each_tombstone_once(
    tmp_path: Path, direction: Direction, limit: int
) -> None:
    posts = [post(n) for n in range(6)]
    deletes = [
        about(MessageKind.DELETE, posts[n], Claims.of(posts[n]).encode(), 5) for n in (0, 2, 5)
    ]
    edit = about(MessageKind.EDIT, posts[3], b"post 3, edited", 2)
    reaction = about(MessageKind.REACTION, posts[3], reaction_payload(b"+1"), 3, key=2)
    with ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=tmp_path) as db:
        DbReplica(db).apply_ops([group_op(1, 1), group_op(2, 1), *posts, edit, reaction, *deletes])
        pages: list[list[MessageView | Tombstone]] = []
        cursor = None
        while True:
            page = db.folded_range(GROUP_CHAT, cursor, limit, direction)
            pages.append(page.views() + page.tombstones)
            if (cursor := page.next_cursor) is None:
                break
    flat = sorted((item for page in pages for item in page), key=lambda item: item.order)
    kept = [1, 3, 4]
    assert [item.msg.msg_id for item in flat if isinstance(item, MessageView)] == [
        posts[n].msg_id for n in kept
    ]
    assert [t.msg_id for t in flat if isinstance(t, Tombstone)] == [
        posts[n].msg_id for n in (0, 2, 5)
    ]
    edited = next(i for i in flat if isinstance(i, MessageView) and i.msg == posts[3])
    assert (edited.payload, edited.edited_at) == (b"post 3, edited", edit.hlc)
    assert edited.reactions == {b"+1": (AUTHOR_IDS[2],)}
    # the pages follow each other: each one wholly after (or before) the one it continues
    for earlier, later in pairwise(pages):
        if earlier and later:
            a, b = [item.order for item in earlier], [item.order for item in later]
            if direction is Direction.FORWARD:
                assert max(a) < min(b)
            else:
                assert min(a) > max(b)


@pytest.mark.parametrize("target_first", [True, False])
def test_only_edits_and_reactions_of_the_same_chat_fold_in(
    tmp_path: Path, target_first: bool
) -> None:
    """A reaction or edit stored in another chat, naming this chat's message, changes nothing
    here — whichever of them arrives first (the page finds referrers through ``referred``)."""
    target = post(0)
    other = bytes([0x77]) * 32
    stamp = Hlc(target.hlc.physical_ms + 5)
    react, wrong = reaction_payload(b"+1"), reaction_payload(b"-1")
    elsewhere = [
        MsgV1.create(KEYS[1], other, stamp, b"not here", kind=MessageKind.EDIT, ref=target.msg_id),
        MsgV1.create(KEYS[2], other, stamp, wrong, kind=MessageKind.REACTION, ref=target.msg_id),
    ]
    here = about(MessageKind.REACTION, target, react, 6, key=2)
    with ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=tmp_path) as db:
        members = [group_op(1, 1), group_op(2, 1)]
        first, then = ([target], elsewhere) if target_first else (elsewhere, [target])
        for batch in (members + first, then, [here]):
            db.put_messages([m for m in batch if isinstance(m, MsgV1)])
        [view] = db.folded_range(GROUP_CHAT).views()
    assert view.edit is None and view.payload == b"post 0"
    assert view.reactions == {b"+1": (AUTHOR_IDS[2],)}  # this chat's reaction only


def test_a_lying_delete_takes_the_reactions_but_the_authors_edit_stays(tmp_path: Path) -> None:
    """A delete that names its target with someone else's claims erases nothing of it but
    the reactions to that id (MESSAGES.md): the page still folds in the author's edit."""
    target = post(0)
    edit = about(MessageKind.EDIT, target, b"post 0, edited", 2)
    reaction = about(MessageKind.REACTION, target, reaction_payload(b"+1"), 3, key=2)
    lie = Claims(AUTHOR_IDS[2], target.hlc, target.kind).encode()  # Carol says it is hers
    delete = about(MessageKind.DELETE, target, lie, 5, key=2)
    with ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=tmp_path) as db:
        replica = DbReplica(db)
        replica.apply_ops([group_op(1, 1), group_op(2, 1), target, edit, reaction])
        replica.apply_ops([delete])
        [view] = db.folded_range(GROUP_CHAT).views()
    assert (view.payload, view.edited_at) == (b"post 0, edited", edit.hlc)
    assert view.reactions == {}


@pytest.mark.parametrize("target_first", [True, False])
def test_a_reaction_stamped_before_its_target_folds_in_and_expires_first(
    tmp_path: Path, target_first: bool
) -> None:
    """A referrer that sorts before its target (a clock behind) may expire while the target
    stays: its ``referred`` row holds no copy of it, so the page reads it from ``messages``
    and, once the retention trim took it, no longer shows it — whichever arrived first."""
    target = post(0)
    early = about(MessageKind.REACTION, target, reaction_payload(b"+1"), -5, key=2)
    later = about(MessageKind.REACTION, target, reaction_payload(b"ok"), 5, key=2)
    with ChatDb(ChatDbConfig(block_cache_mb=8, memtable_mb=8), path=tmp_path) as db:
        replica = DbReplica(db)
        replica.apply_ops([group_op(1, 1), group_op(2, 1)])
        for batch in ([target], [early, later]) if target_first else ([early, later], [target]):
            replica.apply_ops(batch)
        [view] = db.folded_range(GROUP_CHAT).views()
        assert view.reactions == {b"+1": (AUTHOR_IDS[2],), b"ok": (AUTHOR_IDS[2],)}
        db.range_delete_old_messages(GROUP_CHAT, early.hlc.physical_ms)  # not the target
        [view] = db.folded_range(GROUP_CHAT).views()
    assert view.msg == target and view.reactions == {b"ok": (AUTHOR_IDS[2],)}


def test_a_view_built_through_its_slots_equals_the_constructed_one() -> None:
    target = post(1)
    edit = about(MessageKind.EDIT, target, b"edited", 1)
    for args in [(target, None, None, {}), (target, edit, "present", {b"+1": (AUTHOR_IDS[1],)})]:
        built, made = message_view(*args), MessageView(*args)
        assert built == made and type(built) is MessageView and built.order == made.order


def test_pages_read_alike_after_a_reopen_and_a_stray_row_is_a_clear_error(tmp_path: Path) -> None:
    """Raw and folded pages, both directions, every page size: the same from the memtable and
    from the files a reopen leaves; a row under the chat that is no messages key (a corrupt
    store) is refused by name, by a whole page and by a folded one."""
    posts = [post(n) for n in range(7)]
    changes = [about(MessageKind.EDIT, posts[n], b"edited %d" % n, 1) for n in (1, 4)]
    changes += [about(MessageKind.REACTION, posts[n], reaction_payload(b"+1"), 2) for n in (1, 5)]
    config = ChatDbConfig(block_cache_mb=8, memtable_mb=8)

    def pages(db: ChatDb, readers: tuple[str, ...] = ("range", "folded_range")) -> list[object]:
        out: list[object] = []
        for direction in Direction:
            for limit in (1, 2, 3, 50):
                for read in [getattr(db, name) for name in readers]:
                    cursor = None
                    while True:
                        page = read(GROUP_CHAT, cursor, limit, direction)
                        out.append([(item.key, item.seq, item.msg.encoded) for item in page.items])
                        if isinstance(page, FoldedPage):
                            out.append([(v.payload, v.reactions) for v in page.views()])
                        if (cursor := page.next_cursor) is None:
                            break
        return out

    with ChatDb(config, path=tmp_path) as db:
        DbReplica(db).apply_ops([group_op(1, 1), group_op(2, 1), *posts, *changes])
        before = pages(db)
    with ChatDb(config, path=tmp_path) as db:
        assert pages(db) == before
        db.rocks.cf["messages"][GROUP_CHAT + b"\x00" * 11] = posts[0].encoded  # 43 bytes
        for reader in ("range", "folded_range"):
            with pytest.raises(ValueError, match="messages key must be 44 bytes"):
                pages(db, (reader,))
