"""Identity: one opaque blob per user, last writer wins by HLC, indexed by seen_identity for sync."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from store.errors import DecodeError
from store.hlc import Hlc
from store.keys import USER_ID_LEN, bucket_prefix, bucket_range_keys, key_identity
from store.merge import identity_wins
from store.messages import take_until
from store.ops import decode_identity_doc
from store.records import (
    IdentityRecord,
    check_identity_blob,
    compute_identity_record_id,
    decode_identity_value,
    encode_identity_value,
)
from store.rocks import Rocks


@dataclass(frozen=True, slots=True)
class IdentityChange:
    user_id: bytes
    old_id: bytes | None
    new_id: bytes  # == old_id when the incoming blob lost

    @property
    def changed(self) -> bool:
        return self.old_id != self.new_id


class Identities:
    """The identity rows and their sync index (no state of their own)."""

    def __init__(self, rocks: Rocks) -> None:
        self._rocks = rocks

    def put_identity(self, user_id: bytes, hlc: Hlc, blob: bytes) -> IdentityChange:
        """Store ``blob`` if (hlc, blob) is newer than what is stored (LWW, ties by blob bytes)."""
        return self.put_identities([IdentityRecord(user_id, hlc, blob)])[0]

    def put_identities(self, records: Iterable[IdentityRecord]) -> list[IdentityChange]:
        records = list(records)
        for record in records:
            check_identity_blob(record.blob)
        keys = [key_identity(r.user_id) for r in records]
        current: dict[bytes, tuple[Hlc, bytes] | None] = {}
        for key, raw in zip(keys, self._rocks.multi_get("identity", keys), strict=True):
            current.setdefault(key, None if raw is None else decode_identity_value(raw))
        stored = dict(current)
        changes = []
        for key, record in zip(keys, records, strict=True):
            before = current[key]
            old_id = None if before is None else compute_identity_record_id(key, *before)
            if identity_wins((record.hlc, record.blob), before):
                current[key] = (record.hlc, record.blob)
                changes.append(IdentityChange(key, old_id, record.record_id))
            else:
                assert old_id is not None
                changes.append(IdentityChange(key, old_id, old_id))
        self._write_identity_rows(stored, current)
        return changes

    def set_identities(
        self, changes: dict[bytes, tuple[tuple[Hlc, bytes] | None, tuple[Hlc, bytes]]]
    ) -> None:
        """Write what ``store.plan`` decided: user -> (the identity stored, the one replacing
        it)."""
        keys = {key_identity(user): change for user, change in changes.items()}
        self._write_identity_rows(
            {key: before for key, (before, _) in keys.items()},
            {key: after for key, (_, after) in keys.items()},
        )

    def _write_identity_rows(
        self,
        stored: dict[bytes, tuple[Hlc, bytes] | None],
        current: dict[bytes, tuple[Hlc, bytes] | None],
    ) -> None:
        rocks = self._rocks
        batch = rocks.new_batch()
        identity_cf, seen_cf = rocks.handle["identity"], rocks.handle["seen_identity"]
        for user, after in current.items():
            before = stored[user]
            if after is None or after == before:
                continue
            if before is not None:
                batch.delete(compute_identity_record_id(user, *before), seen_cf)
            batch.put(user, encode_identity_value(*after), identity_cf)
            batch.put(compute_identity_record_id(user, *after), user, seen_cf)
        if batch.len():
            rocks.write(batch)

    def get_identity(self, user_id: bytes) -> tuple[Hlc, bytes] | None:
        """(hlc, blob) of the user's current identity; the blob without its HLC prefix."""
        raw = self._rocks.get("identity", key_identity(user_id))
        return None if raw is None else decode_identity_value(raw)

    def iter_home_nodes(self) -> Iterator[tuple[bytes, tuple[bytes, ...]]]:
        """(user, home nodes) of every stored identity (verified when written) that names
        any: what a ``--scope auto`` node reads to know whom it serves (``sync.serving``)."""
        for user, raw in self._rocks.iter_all("identity"):
            doc = decode_identity_doc(decode_identity_value(raw)[1])
            if doc.home_nodes:
                yield user, doc.home_nodes

    # --- sync helpers ---

    def iter_identity_record_ids(self) -> Iterator[bytes]:
        for record_id, _ in self._rocks.iter_all("seen_identity"):
            yield record_id

    def iter_identity_users(self) -> Iterator[tuple[bytes, bytes]]:
        """(record id, user) of every stored identity: a scoped replica places it by user."""
        for record_id, user in self._rocks.iter_all("seen_identity"):
            yield record_id, _user(user)

    def users_of(self, record_ids: list[bytes]) -> list[bytes | None]:
        """The user of each identity record id (None: not a current record id)."""
        users = self._rocks.multi_get("seen_identity", record_ids)
        return [None if user is None else _user(user) for user in users]

    def for_each_identity_record_id(self, callback: Callable[[bytes], None]) -> None:
        for record_id in self.iter_identity_record_ids():
            callback(record_id)

    def get_range_identity_ids(self, start: int, end: int) -> list[bytes]:
        return self._rocks.range_keys("seen_identity", *bucket_range_keys(start, end))

    def get_bucket_identity_ids(self, bucket: int) -> list[bytes]:
        return [rid for rid, _ in self._rocks.iter_prefix("seen_identity", bucket_prefix(bucket))]

    def get_identity_records_batch(
        self, ids: list[bytes], max_bytes: int
    ) -> tuple[list[bytes], bool]:
        return take_until(self.get_identity_records_by_ids(ids), max_bytes)

    def get_identity_records_by_ids(self, ids: list[bytes]) -> list[bytes | None]:
        """Encoded IdentityRecord per record id (None: not a current record id)."""
        users = self._rocks.multi_get("seen_identity", ids)
        present = [user for user in users if user]
        rows = iter(self._rocks.multi_get("identity", present))
        out: list[bytes | None] = []
        for user in users:
            raw = next(rows) if user else None
            if user and raw is not None:
                out.append(IdentityRecord(user, *decode_identity_value(raw)).encode())
            else:
                out.append(None)
        return out


def _user(stored: bytes) -> bytes:
    """A ``seen_identity`` row's user: a stored row of another length is corrupt."""
    if len(stored) != USER_ID_LEN:
        raise DecodeError(f"a seen_identity row of {len(stored)} bytes, not a user id")
    return stored
