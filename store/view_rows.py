"""View rows kept: per content message that its edits or reactions change, what a page shows
of it (``store.view_row``), read by a folded page in one scan beside its content
(``store.views``) instead of folding each changed message per page.

Derived state, like the unread counters: every write that changes what a row folds puts the
row again — computed by the one rule (``view_row.changes_of``) from the target's shown
referrers as they will be once the write's WriteBatch is written — in that same batch. So
a row equals a recompute from the stored messages at every point, and after a restart:

- messages stored (``store.messages``): an edit or reaction whose target is held (its
  ``referred`` row), a target arriving after its referrers;
- erasures (``store.deletes``): an erased message's row goes, an erased referrer's target
  is folded again without it;
- the retention trim (``store.messages``): the trimmed targets' rows go, and a target whose
  referrer stamped before it expired is folded again without it;
- the re-decided hidden index (``store.admission``): the targets of referrers hidden or
  shown again.

A row is kept for every held content target, hidden or not (a page leaves hidden targets
out, as it does their rows); none where the fold changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from rocksdict import WriteBatch

from store.hidden import Hidden
from store.keys import CHAT_ID_LEN, MESSAGES_KEY_LEN, referred_end, seq_of
from store.kinds import CONTENT
from store.records import KIND_AT, STAMP_AT, MsgV1, stored_msg
from store.rocks import Rocks
from store.view_row import changes_of, encode_view

_CONTENT_BYTES = frozenset(int(kind) for kind in CONTENT)
Added = dict[bytes, list[tuple[bytes, MsgV1]]]  # target key -> (referrer key, referrer)


class ViewRows:
    """Writes the view rows into the writers' own WriteBatches (reads the referrers, the
    targets and the hidden index)."""

    def __init__(self, rocks: Rocks, hidden: Hidden) -> None:
        self._rocks, self._hidden = rocks, hidden
        self._handle = rocks.handle  # (the dict: a handle kept would keep the store open)

    def refresh(
        self,
        batch: WriteBatch,
        targets: dict[bytes, MsgV1 | None],
        *,
        added: Added | None = None,
        gone: set[bytes] | frozenset[bytes] = frozenset(),
        fresh: set[bytes] | frozenset[bytes] = frozenset(),
        hidden: dict[bytes, set[int]] | None = None,
    ) -> None:
        """Put in ``batch`` the row of each target (messages key -> its message, or None:
        read here; not content: no row) as it will be once the batch is written: the rule
        over its shown referrers — the held ones (``referred``; none for a key in ``fresh``:
        stored by this batch, or referred to by none before), plus ``added`` (the rows the
        batch adds), less ``gone`` (messages keys the batch removes: a target among them has
        no row). ``hidden``: chat -> its hidden seqs once the batch is written, where the
        batch changes them (else the index's)."""
        views = self._handle["views"]
        unread = [key for key, msg in targets.items() if msg is None]
        held = dict(zip(unread, self._rocks.multi_get("messages", unread), strict=True))
        seqs_of: dict[bytes, set[int]] = dict(hidden or {})
        for key, target in targets.items():
            if key in gone:  # erased by the batch (its row goes with it: store.deletes)
                batch.delete(key, views)
                continue
            if target is None:
                raw = held[key]
                if raw is None or raw[KIND_AT[raw[STAMP_AT]]] not in _CONTENT_BYTES:
                    if key not in fresh:  # (one stored by this batch has no row)
                        batch.delete(key, views)
                    continue
                target = stored_msg(raw)
            elif target.kind not in CONTENT:
                continue
            chat = key[:CHAT_ID_LEN]
            seqs = seqs_of.get(chat)
            if seqs is None:
                seqs = seqs_of[chat] = self._hidden.seqs(chat)
            refs = {} if key in fresh else self.held_referrers(key, gone, seqs)
            for referrer_key, referrer in (added or {}).get(key, ()):
                if referrer_key in gone:  # held before the batch, erased by it
                    continue
                if not seqs or seq_of(referrer_key) not in seqs:
                    refs[referrer_key] = referrer
            row = encode_view(*changes_of(target, refs.values()))
            if row is not None:
                batch.put(key, row, views)
            elif key not in fresh:
                batch.delete(key, views)

    def held_referrers(
        self,
        target: bytes,
        gone: set[bytes] | frozenset[bytes] = frozenset(),
        hidden: set[int] | None = None,
    ) -> dict[bytes, MsgV1]:
        """Referrer key -> the held, shown edits and reactions of ``target`` (a messages
        key): its ``referred`` rows, holding the referrer's bytes or else read from
        ``messages`` (None there: expired), but those in ``gone`` or ``hidden``."""
        if hidden is None:
            hidden = self._hidden.seqs(target[:CHAT_ID_LEN])
        out: dict[bytes, MsgV1] = {}
        unread: list[bytes] = []  # referrers whose rows do not hold their bytes
        end = referred_end(target)  # (held while the rows are read: see Rocks.items)
        for row, value in self._rocks.items_in("referred", target, end):
            referrer = row[MESSAGES_KEY_LEN:]
            if referrer in gone or (hidden and seq_of(referrer) in hidden):
                continue
            if value:
                out[referrer] = stored_msg(value)
            else:
                unread.append(referrer)
        del end
        for referrer, raw in zip(unread, self._rocks.multi_get("messages", unread), strict=True):
            if raw is not None:
                out[referrer] = stored_msg(raw)
        return out

    def rebuild(self, targets_per_batch: int = 1_000) -> None:
        """Every row, from ``referred``: for a database written before the rows existed."""
        batch = self._rocks.new_batch()
        targets: dict[bytes, MsgV1 | None] = {}
        for target in _targets(row for row, _ in self._rocks.iter_all("referred")):
            targets[target] = None
            if len(targets) == targets_per_batch:
                self.refresh(batch, targets)
                self._rocks.write(batch)
                batch, targets = self._rocks.new_batch(), {}
        self.refresh(batch, targets)
        self._rocks.write(batch)


def _targets(rows: Iterable[bytes]) -> Iterable[bytes]:
    """The target keys of ``referred`` rows in key order, each once."""
    last = b""
    for row in rows:
        if (target := row[:MESSAGES_KEY_LEN]) != last:
            yield target
            last = target
