"""The anti-entropy session, sans-IO: bytes in, bytes out, time passed in.

Theory of operation
-------------------
Two replicas hold the same three Merkle trees (``sync.merkle``: fan-out 16,
depth 4, 65,536 leaf buckets). The *initiator* (I) opens a **pass** with HELLO:
a fresh salt, the hash width, a 4-byte salted digest of each domain's root and
one full-width cell of the roots summed over the domains (``hello_for``). The
*responder* (R) answers DONE if every digest and the summed cell match — one
round trip of ~88 bytes for d = 0 — and otherwise starts a descent for the
domains whose digests differ. The descent alternates sides so
every frame both answers and asks:

    R: NODES  hashes of all 256 depth-2 nodes
    I: NODES  flags: which of those differ;  hashes of their depth-3 children
    R: NODES  flags: which of those differ;  hashes of their leaf children
    I: CELLS  flags: which leaves differ;    my cells (count, xor, check) for them

A cell pair whose sets differ by one id names that id (``xor_I ^ xor_R``,
confirmed by the check hash), so R learns, per differing bucket, which id is
missing and on which side — without listing the bucket. Buckets that do not
decode get an id list instead: R sends salted 8-byte prefixes of its ids there.

That is the *cells path* (``SyncConfig(sketch=False)``). By default the descent
stops as soon as the share of equal nodes estimates the difference d (at depth
2 unless every node there differs, or the depth-3 nodes hold more than
``descend_above`` ids each: hashing their children is then cheaper than reading
every id under them, and the initiator's depth-3 hashes are cut to as few bits as
keep a collision rare, ``descent_bits``): the side that read the hashes sends a
SKETCH — an IBLT (``sync.sketch``) of salted short ids of its ids under the
differing nodes, ~1.4 d cells, the short ids as wide as the estimate needs — and the other
subtracts its own, peels, pushes what only it holds and asks for the rest by
short id (``short_wants``). A
sketch that does not decode is answered once with a larger one from the other
side. Summed roots that differ by exactly one id, in the one domain whose digest
differs, name it without any descent. The side that opens a sketched region
checks its listing against its tree, bucket by bucket (``_checked_listing``), and
leaves out (announcing them in ``skip``) buckets that list more than the tree files. A
region whose short ids take fewer bytes than its sketch is sent as a *listing* of them
(always decoded), and small sets skip the descent: a responder holding at most
``WHOLE_LISTING_MAX`` ids in each differing domain, facing an initiator with as few in all,
answers HELLO with whole-domain listings (``_whole_listings``; SYNC.md, "Listings"). The
initiator closes a pass with a HELLO that carries its last pushes, so the
records and the root comparison share a round trip. A responder TRANSFER that
pushes its last records and asks nothing carries its roots; an initiator that
then has nothing to push or ask compares them with its own and, equal, ends the
session with a one-way DONE (no closing pass: 3 round trips after a descent).

Then both sides exchange TRANSFER frames — records pushed to the side that
lacks them, ``wants`` (exact ids), ``id_lists`` and ``prefix_wants`` — strictly
alternating, each bounded by ``max_record_bytes`` and ``max_ids_per_frame``.
When a side receives an *idle* TRANSFER and has nothing to send, the transfer
is over; I then opens the next pass with HELLO (new roots, new salt). R
answers DONE once the roots are equal, or when ``max_passes`` is used up. So
the end of every session is a root comparison: a truncated-hash collision, a
bucket that did not decode, or a write that raced the session costs one more
pass, never a silent divergence.

Every frame from the peer is validated (``sync.frames`` for shape, this module
for state: expected frame type, bitmap and hash lengths, buckets under
reconciliation, record ids; ``store.ingress`` for what no record may ever be: the list
every ingress shares, a frame's message signatures checked together as its last check).
Anything wrong raises
``RemoteProtocolError`` with a reason and the session is over; valid records
that arrived in the same frame are still written. Records are only accepted
from buckets this pass found different, and go through the store's rules
(``store.plan``), never trusted.

The session reads its replica and never writes it: ``receive_checked`` returns
the records a frame brought (``Received``), the driver writes them — a node hands
them to its one writer — and ``answer`` then builds the reply (a closing HELLO's
roots include them). ``receive`` takes the three steps for a driver that owns its
replica (tests, ``sync.loopback``, the simulator).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

import blake3
import numpy as np
import numpy.typing as npt

from store.errors import DecodeError, InvalidInput
from store.ingress import Limits, refuse_never_valid, verify_each
from store.keys import NUM_BUCKETS, RECORD_ID_LEN, bucket_of
from store.ops import decode_membership_op, member_op_id
from store.records import (
    DEFAULT_MAX_PAYLOAD,
    MessageKind,
    MsgV1,
    decode_identity_record,
    decode_msg,
)
from sync.buckets import RunSet, in_runs, runs_of
from sync.claims import BucketClaims
from sync.errors import LocalProtocolError, RemoteProtocolError
from sync.frames import (
    CELL_LEN,
    ID_PREFIX_LEN,
    ROOT_DIGEST_LEN,
    SALT_LEN,
    Abort,
    Cells,
    Domain,
    Done,
    Frame,
    Hello,
    IdList,
    Nodes,
    PrefixWant,
    Sketches,
    SketchSection,
    Transfer,
    TransferSection,
    decode_frame,
    encode_frame,
)
from sync.merkle import (
    DEPTH,
    FANOUT,
    FANOUT_BITS,
    TreeReader,
    check_hash,
    children,
    descendants,
)
from sync.replica import Record, Replica
from sync.scope import EVERYTHING, Scope, ScopeError
from sync.shards import in_domain_scope
from sync.sketch import (
    BUCKET_BITS,
    HASHES,
    U64,
    Peeled,
    Sketch,
    SketchKey,
    bucket_of_short,
    cell_len,
    cells_for,
    decode_listing,
    encode_listing,
    listed_difference,
    lookup,
    members,
    short_id_width,
    short_ids,
)

TOP_DEPTH = 2  # R's first NODES frame: every depth-2 node (256 hashes)
# The initiator's depth-3 hashes on the sketch path are cut to as many bits as keep the chance
# that a differing node's hashes collide under 2^-DESCENT_SAFETY_BITS a pass (one in ~1,000
# sessions costs a second pass: the closing root comparison finds the hidden node): at
# d = 10^3, ~3,970 hashes of 21 bits are 10.4 kB, not 16 (issue 35's byte goal).
DESCENT_SAFETY_BITS = 10
ESTIMATE_DEVIATIONS = 2  # standard deviations of the equal-node count taken off an estimate
MIN_DESCENT_BITS = 16
FETCH_CHUNK = 256  # ids looked up per replica call while filling a frame
ROOT_FLAGS = b"\x80"  # flags over the root alone, set: a whole listing's region
# A responder lists a differing domain whole when it holds at most this many ids there and
# the initiator at most this many in all: <= 1 kB of 4-byte short ids, one top frame's worth.
WHOLE_LISTING_MAX = 256
# What a record is refused for (store.ingress) — not its stamp: one too far ahead is skipped
# (``SyncConfig.max_offset_ms``), not refused, since our clock may be the one behind.
RECORD_LIMITS = Limits()


@dataclass(frozen=True)
class SyncConfig:
    hash_width: int = 4  # bytes per salted node hash
    max_frame: int = 4 * 1024 * 1024
    max_record_bytes: int = 1024 * 1024  # record bodies per TRANSFER frame
    max_ids_per_frame: int = 65_536  # ids, prefixes or records in one frame
    max_cells: int = 16_384  # differing leaves decoded per pass
    max_bucket_ids: int = 4_096  # ids listed for one undecodable bucket
    max_outbox: int = 200_000  # ids a peer may ask us to send in one pass (~16 MB)
    max_passes: int = 3
    # Reconcile the differing ranges with a sketch of salted short ids (sync.sketch) instead
    # of per-leaf cells and id lists; a peer follows whichever the other side sends.
    sketch: bool = True
    # bytes of a short id, 3..8; None: sized by the estimate (``short_id_width``). Tests
    # shrink it to force collisions.
    short_id_bytes: int | None = None
    max_sketch_cells: int = 262_140  # a multiple of 4; <= 10 B a cell: one frame under 3 MB
    # Descend one level rather than sketch when the nodes one level down hold more ids than
    # this on average: hashing a node costs both sides ~2 us, a sketched id ~70 ns, so
    # below ~30 ids a node the sketch is cheaper (SYNC.md, "CPU"). 0: always descend (tests).
    descend_above: float = 32
    # Send a region's short ids themselves where that is fewer bytes than its sketch
    # (``_section``), and answer a HELLO over small sets with whole-domain listings, no
    # descent (``_whole_listings``). A peer accepts both either way. False: tests of the
    # descent and of sketches as such.
    listings: bool = True
    # A silent peer ends the session after this long while little is in flight (the node's
    # setting: sync_idle_timeout_s), plus the time the data in flight needs at
    # min_bytes_per_s: our last frame (the peer reads, checks and stores it before it can
    # answer) and the frame whose length the peer has announced (``receiving``).
    idle_timeout_ms: int = 5_000
    min_bytes_per_s: int = 256 * 1024
    cutoff_ms: int | None = None  # retention soft-filter for messages (see RETENTION.md)
    authenticate: bool = False  # check member ops' signature and authority, identity docs
    max_offset_ms: int | None = None  # skip records this far ahead of now_ms (a node: 120 s)
    # Messages stamped less than this before now_ms are not sent: gossip is still carrying
    # them, and a session racing it would move (and verify, and write) them twice — that
    # race, not loss, was most of what sync delivered under load. None: send everything.
    settle_ms: int | None = None
    max_payload: int = DEFAULT_MAX_PAYLOAD
    # Checks the signatures of one frame's messages: an error (BadSignature) or None per
    # message. Sequential by default; a node passes one that spreads the work over threads
    # (verification is most of what a catch-up costs, and libsodium releases the GIL).
    verify_messages: Callable[[Sequence[MsgV1]], list[InvalidInput | None]] | None = None


def _apply_order(item: tuple[Domain, Any]) -> int:
    return APPLY_ORDER.index(item[0])


APPLY_ORDER = (Domain.MEMBERS, Domain.INDEX, Domain.IDENTITY, Domain.DELETES, Domain.MESSAGES)
MEMBER_DOMAINS = frozenset({Domain.MEMBERS, Domain.INDEX})  # records are signed member ops
MESSAGE_DOMAINS = frozenset({Domain.MESSAGES, Domain.DELETES})  # records are signed MsgV1


# One domain's records of a frame, decoded and authenticated (record, id, physical ms),
# and the first problem among them (raised once the valid ones are applied).
CheckedRecords = tuple[list[tuple[Record, bytes, int]], RemoteProtocolError | None]


@dataclass(frozen=True)
class CheckedFrame:
    """A frame from the peer that ``SyncSession.check`` decoded: what ``receive_checked`` takes."""

    size: int
    frame: Frame
    records: dict[Domain, CheckedRecords]


@dataclass(frozen=True)
class Received:
    """The valid records of a frame, per domain in the order to write them (member ops,
    identities, deletes, messages): what the driver writes before ``SyncSession.answer``."""

    records: tuple[tuple[Domain, list[Record]], ...] = ()

    def write_to(self, replica: Replica) -> int:
        """Apply the records to ``replica`` in their order; how many changed it."""
        return sum(replica.apply(domain, records) for domain, records in self.records)


class SessionRole(Enum):
    INITIATOR = "initiator"
    RESPONDER = "responder"


class State(Enum):
    START = "start"  # initiator, before start()
    AWAIT_HELLO = "await_hello"  # responder, before a pass
    AWAIT_TOP = "await_top"  # initiator sent HELLO
    AWAIT_MIDDLE = "await_middle"  # responder sent depth-2 hashes
    AWAIT_LEAVES = "await_leaves"  # initiator sent depth-3 hashes
    AWAIT_CELLS = "await_cells"  # responder sent leaf hashes
    AWAIT_DECODE = "await_decode"  # both: sent a sketch (or asked for one), awaits the answer
    TRANSFER = "transfer"  # both: records and requests
    DONE = "done"
    ABORTED = "aborted"


INIT, RESP = SessionRole.INITIATOR, SessionRole.RESPONDER

# (role, state, frame received) -> handler name. The one place transitions live;
# SYNC.md's state diagram is drawn from it. ABORT is accepted in every live state.
TRANSITIONS: dict[tuple[SessionRole, State, type], str] = {
    (RESP, State.AWAIT_HELLO, Hello): "_on_hello",
    (INIT, State.AWAIT_TOP, Done): "_on_done",
    (INIT, State.AWAIT_TOP, Nodes): "_on_top",
    (RESP, State.AWAIT_MIDDLE, Nodes): "_on_middle",
    (RESP, State.AWAIT_MIDDLE, Done): "_on_equal_top",  # (after a narrowed HELLO only)
    (INIT, State.AWAIT_LEAVES, Nodes): "_on_leaves",
    (RESP, State.AWAIT_CELLS, Cells): "_on_cells",
    (INIT, State.AWAIT_TOP, Transfer): "_on_shortcut",  # the roots differed by one id
    (INIT, State.AWAIT_TOP, Sketches): "_on_whole_listings",  # small sets, listed whole
    (RESP, State.AWAIT_MIDDLE, Sketches): "_on_sketch",
    (INIT, State.AWAIT_LEAVES, Sketches): "_on_sketch",
    (RESP, State.AWAIT_CELLS, Sketches): "_on_sketch",
    (INIT, State.AWAIT_DECODE, Sketches): "_on_sketch",  # an answer: to decode here
    (RESP, State.AWAIT_DECODE, Sketches): "_on_sketch",
    (RESP, State.AWAIT_DECODE, Done): "_on_equal_top",  # (after listings naming the intersection)
    (INIT, State.AWAIT_DECODE, Transfer): "_on_transfer",
    (RESP, State.AWAIT_DECODE, Transfer): "_on_transfer",
    (INIT, State.TRANSFER, Transfer): "_on_transfer",
    (RESP, State.TRANSFER, Transfer): "_on_transfer",
    (RESP, State.TRANSFER, Hello): "_on_hello",  # only after R went idle (checked there)
    (RESP, State.TRANSFER, Done): "_on_closed",  # one-way: only after R sent its roots
}

KINDS = ("tree", "ids", "records", "control")


@dataclass
class SessionStats:
    frames_sent: int = 0
    frames_received: int = 0
    bytes_sent: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    bytes_received: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    round_trips: int = 0  # frames the initiator sent
    round_trips_before_fetch: int | None = None
    passes: int = 0
    records_sent: int = 0
    records_received: int = 0
    records_applied: int = 0
    rejected_old: int = 0  # records older than the cutoff, refused
    rejected_future: int = 0  # records too far ahead of our clock: skipped, offered again later
    # buckets a sketch left out because our listing held more ids there than our tree's leaf
    # (an index and a tree out of step: a bug, or a write racing the session)
    inconsistent_buckets: int = 0

    def reconciliation_bytes(self) -> int:
        """Both directions, record bodies excluded."""
        return sum(self.bytes_sent[k] + self.bytes_received[k] for k in KINDS if k != "records")


@dataclass
class _DomainPass:
    """One domain's progress within one pass."""

    sent: list[int] = field(default_factory=list)  # node indexes whose hashes we sent last
    diff_buckets: set[int] | RunSet = field(default_factory=set)
    outbox: deque[bytes] = field(default_factory=deque)  # ids of records to push
    shipped: set[bytes] = field(default_factory=set)  # pushed this pass: never twice
    # MEMBERS and INDEX (the same ops, placed twice): the ids either moves this pass, pushed
    # or asked for, shared by both (``_new_passes``); None in the other domains
    twins: set[bytes] | None = None
    moved: set[int] = field(default_factory=set)  # buckets a record travelled in, either way
    truncated: bool = False  # more leaves differed than we took this pass, or looked under
    asked: int = 0  # ids we asked for (wants, prefix wants) and have not received since
    ask_window: int = 100_000  # at most this many asked and unanswered: max_outbox // 2
    id_list_asks: dict[int, int] = field(default_factory=dict)  # bucket -> records it asks
    wants: list[bytes] = field(default_factory=list)
    prefix_wants: list[PrefixWant] = field(default_factory=list)
    id_lists: list[IdList] = field(default_factory=list)
    sent_depth: int = TOP_DEPTH  # the depth of the nodes in ``sent``
    shortcut: bool = False  # the roots were a pure cell: one id, named without a descent
    region: _Region | None = None  # the sketch pass's ids (None: a cells pass)
    short_wants: list[int] = field(default_factory=list)

    def pending(self) -> bool:
        return bool(
            self.outbox or self.wants or self.prefix_wants or self.id_lists or self.short_wants
        )


@dataclass
class _Region:
    """One domain's sketched region in a pass: the buckets under the differing nodes, our
    ids there and their short ids (to build our sketch, and to map a short id back)."""

    buckets: RunSet  # less those left out (and, on the side that announced them, the bad)
    key: SketchKey
    ids: bytes  # concatenated 32-byte ids
    shorts: U64
    sent: bool  # we sent the sketch (and claimed the region); else we decode it
    cells: int = 0  # the size of the last sketch sent or read
    complete: bool | None = None  # whether the decode named the whole difference
    bad: set[int] = field(default_factory=set)  # listed ids the tree does not file: left out


def write_flags(items: list[int], chosen: set[int]) -> bytes:
    """A bitmap over ``items`` (bit i = items[i] is in ``chosen``), MSB first."""
    bits = bytearray((len(items) + 7) // 8)
    for i, item in enumerate(items):
        if item in chosen:
            bits[i >> 3] |= 0x80 >> (i & 7)
    return bytes(bits)


def read_flags(items: list[int], flags: bytes) -> list[int]:
    if len(flags) != (len(items) + 7) // 8:
        raise RemoteProtocolError(
            f"flags of {len(flags)} bytes for a list of {len(items)}", reason="bad_flags"
        )
    bits = np.unpackbits(np.frombuffer(flags, dtype=np.uint8))  # a list of 4,096: 25x a loop
    if bits[len(items) :].any():
        raise RemoteProtocolError("flags set beyond the end of the list", reason="bad_flags")
    return [items[i] for i in np.flatnonzero(bits[: len(items)]).tolist()]


def salted_prefix(salt: bytes, record_id: bytes) -> bytes:
    return blake3.blake3(salt + record_id).digest(ID_PREFIX_LEN)


def _split(blob: bytes, size: int) -> list[bytes]:
    return [blob[i : i + size] for i in range(0, len(blob), size)]


class SyncSession:
    """One anti-entropy session with one peer. Drive it with ``start`` / ``receive``."""

    def __init__(
        self,
        role: SessionRole,
        replica: Replica,
        *,
        now_ms: int,
        salt_seed: bytes = b"",
        config: SyncConfig | None = None,
        claims: BucketClaims | None = None,
    ) -> None:
        """``claims``: shared by the sessions a node runs at once, so that they split the
        differing buckets instead of each moving the same records (``sync.claims``)."""
        self.role = role
        self.replica = replica
        self.config = config or SyncConfig()
        self.salt_seed = salt_seed
        self.state = State.START if role is INIT else State.AWAIT_HELLO
        self.stats = SessionStats()
        self.converged: bool | None = None
        self.error: str | None = None
        self._pass_no = 0
        self._salt = b""
        self._width = self.config.hash_width
        self._domains: dict[Domain, _DomainPass] = {}
        self._last_sent_idle = False
        self._last_activity_ms = now_ms
        self._in_flight = 0  # bytes owed in either direction: see ``next_deadline``
        self._session_cutoff = self.config.cutoff_ms  # the later of both sides' (RETENTION.md)
        self._now_ms = now_ms  # the clock of the frame at hand: receive() sets it
        self._moved = 0  # records sent or received in this pass
        # a sketch of this session did not decode: later passes descend to the leaves' cells
        # (``_sketching``)
        self._sketch_failed = False
        self._claims = claims
        # narrow our region's claims once the peer has pushed all it decoded
        self._narrow_when_drained = False
        self._checked: dict[Domain, CheckedRecords] = {}  # the frame at hand's, from check()
        # the frame at hand's valid records for the driver to write, the first bad one's error,
        # and what ``answer`` sends once they are written (a TRANSFER: the peer's, to answer)
        self._received: list[tuple[Domain, list[Record]]] = []
        self._problem: RemoteProtocolError | None = None
        self._reply: Frame | None = None
        self._taken: Transfer | None = None
        self._closing: Hello | None = None  # a HELLO with records: opened once they are written
        self._last_sent_drained = False
        self._sent_roots = False  # our last TRANSFER carried our roots: the peer may close
        self._narrowed = False  # our NODES named the intersection: the peer may close at once
        self._offered = 0  # the ids our last HELLO said we hold (its summed count)
        self._answer_due = False
        # what this session reconciles: our replica's scope, until the peer's narrows it
        self._scope: Scope = replica.scope

    # --- driver API ---

    def start(self, now_ms: int) -> bytes:
        """Initiator only: the first frame (HELLO of pass 1)."""
        if self.role is not INIT or self.state is not State.START:
            raise LocalProtocolError("start() is for an initiator that has not started")
        self._last_activity_ms = now_ms
        return self._send(self._begin_pass())

    def receive(self, data: bytes, now_ms: int) -> bytes | None:
        """Handle one frame from the peer, its records written to the session's own replica;
        the frame to send back (None: session over). For a driver that owns its replica
        outright (tests, ``sync.loopback``, the simulator): ``check``, ``receive_checked``,
        the replica's ``apply``, ``answer``. A node's syncer takes the steps itself and
        hands the records to its one writer."""
        received = self.receive_checked(self.check(data), now_ms)
        return self.answer(received.write_to(self.replica))

    def check(self, data: bytes) -> CheckedFrame:
        """Decode one frame from the peer and, for an expected TRANSFER, decode and
        authenticate its records. Reads no replica and changes nothing but the session's
        end: a malformed frame aborts it (``RemoteProtocolError``). A bad record does not
        raise here: ``receive_checked`` returns the frame's valid records first, and
        ``answer`` raises once the driver wrote them."""
        self._live("check")
        try:
            frame = decode_frame(
                data, max_frame=self.config.max_frame, max_ids=self.config.max_ids_per_frame
            )
            records = {}
            pushed = _pushed_records(frame)
            if pushed and self.state in (State.TRANSFER, State.AWAIT_DECODE):
                records = {
                    domain: self._check_records(domain, dp, pushed[domain])
                    for domain, dp in self._domains.items()
                    if domain in pushed
                }
        except RemoteProtocolError as exc:
            self._abort(exc.reason)
            raise
        return CheckedFrame(len(data), frame, records)

    def receive_checked(self, checked: CheckedFrame, now_ms: int) -> Received:
        """Take a frame ``check`` passed: the valid records it brought, for the driver to
        write (in order: member ops first) before it calls ``answer``. The session reads its
        replica here and never writes it, the way negentropy's ``reconcile`` returns the ids
        to have and need and leaves storing them to the application."""
        self._live("receive")
        if self._answer_due:
            raise LocalProtocolError("receive_checked() before answer() for the last frame")
        self._last_activity_ms = now_ms
        self._now_ms = now_ms
        self._in_flight = 0
        self._checked = checked.records
        self._received, self._problem = [], None
        try:
            self._count(checked.size, checked.frame, self.stats.bytes_received)
            self.stats.frames_received += 1
            self._reply = self._dispatch(checked.frame)
        except RemoteProtocolError as exc:
            self._abort(exc.reason)
            raise
        finally:
            self._checked = {}
        self._answer_due = True
        return Received(tuple(self._received))

    def answer(self, applied: int) -> bytes | None:
        """The frame to send back (None: session over), once the records ``receive_checked``
        returned are written (``applied``: how many changed the replica): a pass's closing
        HELLO carries roots that must include them. A bad record of the frame ends the
        session here, after its valid records were written."""
        if not self._answer_due:
            raise LocalProtocolError("answer() without a frame taken by receive_checked()")
        self._answer_due = False
        self.stats.records_applied += applied
        reply, taken, self._reply, self._taken = self._reply, self._taken, None, None
        closing, self._closing = self._closing, None
        try:
            if self._problem is not None:
                raise self._problem
            if taken is not None:  # the peer's TRANSFER: answered now that its records are in
                reply = self._answer_transfer(taken)
            elif closing is not None:  # a HELLO that brought records: roots compared now
                reply = self._open_pass(closing)
            if self.role is RESP and isinstance(reply, Transfer) and self._closes(reply):
                # nothing left to push or ask: our roots let the peer end the session here
                reply = replace(reply, roots=self._own_roots()) if self.config.sketch else reply
        except RemoteProtocolError as exc:
            self._abort(exc.reason)
            raise
        if self.finished:
            self.release_claims()
        return None if reply is None else self._send(reply)

    def release_claims(self) -> None:
        """Give back the buckets this session was reconciling (``sync.claims``); done at every
        pass and at the end — a driver calls it too once a session is over, however it ended."""
        self._narrow_when_drained = False
        if self._claims is not None:
            self._claims.release(self)

    def _live(self, what: str) -> None:
        if self.state in (State.DONE, State.ABORTED, State.START):
            raise LocalProtocolError(f"{what}() in state {self.state.value}")

    def _abort(self, reason: str) -> None:
        self.state, self.error = State.ABORTED, reason
        self.release_claims()

    def sent(self, now_ms: int) -> None:
        """The driver finished sending our last frame at ``now_ms``: the peer's silence counts
        from here. The time we spent checking and storing its frame, and writing ours, is not
        the peer's silence (a catch-up frame can take seconds to apply)."""
        self._last_activity_ms = max(self._last_activity_ms, now_ms)

    def receiving(self, size: int, now_ms: int) -> None:
        """The peer announced a frame of ``size`` bytes at ``now_ms`` (its length prefix came):
        it is alive, and a big frame gets the time it needs to arrive."""
        self._last_activity_ms = max(self._last_activity_ms, now_ms)
        self._in_flight += size

    def next_deadline(self) -> int | None:
        """When the peer's silence ends the session: ``idle_timeout_ms`` after its last sign of
        life, longer by what the bytes in flight take at ``min_bytes_per_s``. A peer that owes
        a small answer gets a short wait, one sending or digesting a 4 MiB frame a long one."""
        if self.state in (State.DONE, State.ABORTED):
            return None
        transfer_ms = self._in_flight * 1000 // max(1, self.config.min_bytes_per_s)
        return self._last_activity_ms + self.config.idle_timeout_ms + transfer_ms

    def handle_timeout(self, now_ms: int) -> bytes | None:
        """If the peer has been silent too long: abort, and return the ABORT frame to send."""
        deadline = self.next_deadline()
        if deadline is None or now_ms < deadline:
            return None
        self._abort("timeout")
        return self.abort_frame()

    def abort_frame(self) -> bytes:
        return encode_frame(Abort(self.error or "aborted"))

    @property
    def finished(self) -> bool:
        return self.state in (State.DONE, State.ABORTED)

    # --- plumbing ---

    def _dispatch(self, frame: Frame) -> Frame | None:
        if isinstance(frame, Abort):
            raise RemoteProtocolError(f"peer aborted: {frame.reason}", reason="peer_abort")
        handler = TRANSITIONS.get((self.role, self.state, type(frame)))
        if handler is None:
            raise RemoteProtocolError(
                f"{type(frame).__name__} not expected by the {self.role.value} in state "
                f"{self.state.value}",
                reason="unexpected_frame",
            )
        reply: Frame | None = getattr(self, handler)(frame)
        return reply

    def _send(self, frame: Frame) -> bytes:
        data = encode_frame(frame)
        self._count(len(data), frame, self.stats.bytes_sent)
        self.stats.frames_sent += 1
        self._in_flight = len(data)  # the peer digests this before it answers
        if self.role is INIT and not isinstance(frame, Done):  # a DONE is one way: no trip
            self.stats.round_trips += 1
        if isinstance(frame, Transfer):
            self._last_sent_idle = frame.idle
            self._last_sent_drained = frame.idle or frame.drained
            self._sent_roots = frame.roots is not None
        return data

    def _count(self, size: int, frame: Frame, into: dict[str, int]) -> None:
        if isinstance(frame, Transfer):
            records = ids = 0
            for s in frame.sections.values():
                records += sum(len(r) for r in s.records)
                ids += len(s.wants)
                ids += sum(len(x.prefixes) for x in s.id_lists)
                ids += sum(len(x.prefixes) for x in s.prefix_wants)
                ids += len(s.short_wants)
            into["records"] += records
            into["ids"] += ids
            into["control"] += size - records - ids
            if records and self.stats.round_trips_before_fetch is None:
                self.stats.round_trips_before_fetch = self.stats.round_trips
        elif isinstance(frame, Hello) and frame.records:
            records = sum(len(r) for blobs in frame.records.values() for r in blobs)
            into["records"] += records
            into["tree"] += size - records
            if self.stats.round_trips_before_fetch is None:
                self.stats.round_trips_before_fetch = self.stats.round_trips
        elif isinstance(frame, Hello | Nodes | Cells):
            into["tree"] += size
        elif isinstance(frame, Sketches):
            into["ids"] += size
        else:
            into["control"] += size

    def _tree(self, domain: Domain) -> TreeReader:
        return self.replica.scope_tree(domain, self._scope)

    @property
    def scope(self) -> Scope:
        """What the session reconciles: the intersection of both sides' scopes, once known."""
        return self._scope

    def _section_domains(self, sections: dict[Domain, Any], what: str) -> None:
        if set(sections) != set(self._domains):
            raise RemoteProtocolError(
                f"{what} covers domains {sorted(sections)}, expected {sorted(self._domains)}",
                reason="unexpected_domain",
            )

    # --- passes ---

    def _begin_pass(
        self, *, final: bool = False, records: dict[Domain, list[bytes]] | None = None
    ) -> Hello:
        """HELLO of the next pass; ``records``: our last pushes of the pass it closes."""
        self.release_claims()
        self._pass_no += 1
        self.stats.passes = self._pass_no
        seed = self.salt_seed + self._pass_no.to_bytes(2, "big")
        self._salt = blake3.blake3(seed).digest(SALT_LEN)
        self._moved = 0
        self.state = State.AWAIT_TOP
        own_cutoff = max(0, self.config.cutoff_ms or 0)  # before the epoch: nothing expired
        trees = {d: self._tree(d) for d in Domain}
        hello = hello_for(
            self._pass_no,
            self._salt,
            self.config.hash_width,
            {d: t.root() for d, t in trees.items()},
            {d: t.root_check() for d, t in trees.items()},
            own_cutoff,
            final,
            records or {},
            self._scope,
        )
        self._offered = hello.cell[1]
        return hello

    def _on_hello(self, hello: Hello) -> Frame | None:
        # We may be asked to close while our asks are open: the HELLO's records answer them.
        if self.state is State.TRANSFER and not self._last_sent_drained:
            raise RemoteProtocolError(
                "HELLO while a transfer is under way", reason="unexpected_frame"
            )
        if hello.pass_no != self._pass_no + 1:
            raise RemoteProtocolError(
                f"pass {hello.pass_no} after {self._pass_no}", reason="bad_pass"
            )
        if hello.records:  # the pass it closes: written first, the roots compared in ``answer``
            if self.state is not State.TRANSFER:
                raise RemoteProtocolError("records outside a pass", reason="unsolicited")
            for domain, blobs in sorted(hello.records.items(), key=_apply_order):
                dp = self._domains.get(domain)
                if dp is None:
                    raise RemoteProtocolError(
                        f"HELLO records for {domain.name} outside this pass",
                        reason="unexpected_domain",
                    )
                if not self._take_records(domain, dp, blobs):
                    break
            self._closing = hello
            return None
        return self._open_pass(hello)

    def _open_pass(self, hello: Hello) -> Frame:
        """Compare the roots: DONE, the one id the roots differ by, or a descent."""
        try:
            inner = self.replica.scope & hello.scope
        except ScopeError as exc:
            raise RemoteProtocolError(f"HELLO scope: {exc}", reason="scope_mismatch") from None
        # narrower than offered: the peer's scoped roots cover shards we do not hold. Equal
        # roots still mean the same records (the peer holds nothing beyond the intersection
        # there); different ones lead to a descent, over the intersection.
        narrowed = inner != hello.scope  # chat or user shards (a full scope: any number of them)
        self.release_claims()
        self._pass_no = self.stats.passes = hello.pass_no
        self._salt, self._width = hello.salt, hello.width
        self._session_cutoff = _later(self.config.cutoff_ms, hello.cutoff_ms)
        self._scope = inner
        differing = self._differing(hello)
        if (
            not differing
            or hello.final
            or hello.pass_no > self.config.max_passes
            or self._left_to_others()  # (the last pass's: the initiator cannot know it)
        ):
            self.state, self.converged = State.DONE, not differing
            return Done(not differing)
        # Narrowed, the one id the cells differ by may lie in a shard we do not hold: only a
        # descent names the intersection (in NODES), so the shortcut is for unnarrowed passes.
        shortcut = None if narrowed else self._shortcut(hello, differing)
        if shortcut is not None:
            return shortcut
        listings = self._whole_listings(hello, differing, inner if narrowed else None)
        if listings is not None:
            self._narrowed = narrowed
            return listings
        self._domains = self._new_passes(differing)
        top = list(range(FANOUT**TOP_DEPTH))
        sections = {}
        for domain, dp in self._domains.items():
            dp.sent = top
            sections[domain] = (
                b"",
                self._tree(domain).hashes(TOP_DEPTH, top, self._salt, self._width),
            )
        self.state, self._narrowed = State.AWAIT_MIDDLE, narrowed
        return Nodes(sections, max(0, self._session_cutoff or 0), inner if narrowed else None)

    def _no_scope(self, nodes: Nodes) -> None:
        if nodes.scope is not None:
            raise RemoteProtocolError(
                "a scope in a NODES frame other than the first of a pass", reason="bad_scope"
            )

    def _new_pass(self) -> _DomainPass:
        return _DomainPass(ask_window=self.config.max_outbox // 2)

    def _new_passes(self, domains: Iterable[Domain]) -> dict[Domain, _DomainPass]:
        """A pass's domains. MEMBERS and INDEX share the ids they move: a member op the
        peer lacks in both (a full node's two trees hold the same ids) is pushed or asked
        for once, and the peer's one write files it in both — the intersection's chat and
        user shards are in its scope (``sync.replica``: an op is indexed and applied in one
        step). A peer lacking it in one tree only gets it there, as before."""
        passes = {d: self._new_pass() for d in domains}
        if Domain.MEMBERS in passes and Domain.INDEX in passes:
            passes[Domain.MEMBERS].twins = passes[Domain.INDEX].twins = set()
        return passes

    # --- the shortcut: roots that differ by one id name it (d = 1 in one round trip) ---

    def _differing(self, hello: Hello) -> list[Domain]:
        """The domains whose roots differ from the initiator's: by their salted digests, or
        all of them if only the full-width cell tells (a digest collision, 2^-32 a domain)."""
        roots = {d: self._tree(d).root() for d in Domain}
        differing = [d for d in Domain if root_digest(hello.salt, d, *roots[d]) != hello.digest(d)]
        xor, count, _ = _sum_cell(roots, {})
        if not differing and (xor, count) != hello.cell[:2]:
            return list(Domain)
        return differing

    def _shortcut(self, hello: Hello, differing: list[Domain]) -> Transfer | None:
        """In a session's first pass, if one domain differs and the roots summed over the
        domains differ by exactly one id (a pure cell, confirmed by its check and by whether
        we hold it), push it or ask for it at once. Later passes descend: a crafted root
        (XOR cancellation, SYNC.md) costs at most one pass."""
        if hello.pass_no != 1 or not self.config.sketch or len(differing) != 1:
            return None
        if self._session_cutoff != _later(None, hello.cutoff_ms):
            return None  # our cutoff is later: the initiator learns it from NODES, so descend
        (domain,) = differing
        one = self._root_difference(domain, hello)
        if one is None:
            return None
        delta, record_id = one
        dp = self._new_pass()
        self._domains = {domain: dp}
        dp.shortcut, dp.diff_buckets = True, {bucket_of(record_id)}
        (dp.wants if delta > 0 else dp.outbox).append(record_id)
        self.state = State.TRANSFER
        return self._next_transfer()

    def _root_difference(self, domain: Domain, hello: Hello) -> tuple[int, bytes] | None:
        trees = {d: self._tree(d) for d in Domain}
        xor, count, check = _sum_cell(
            {d: t.root() for d, t in trees.items()}, {d: t.root_check() for d, t in trees.items()}
        )
        their_xor, their_count, their_check = hello.cell
        mine = (count, int.from_bytes(xor, "big"), check)
        theirs = (their_count, int.from_bytes(their_xor, "big"), their_check)
        record_id = (mine[1] ^ theirs[1]).to_bytes(RECORD_ID_LEN, "big")
        decoded = decode_pure_cell(bucket_of(record_id), mine, theirs)
        if decoded is None:
            return None
        held = record_id in self.replica.bucket_ids(
            domain, bucket_of(record_id), self._cutoff(domain), self._scope
        )
        return decoded if held == (decoded[0] < 0) else None

    def _on_shortcut(self, transfer: Transfer) -> None:
        """The responder named the one id the roots differ by: at most one record or want
        per domain, in any bucket."""
        if not transfer.sections:
            raise RemoteProtocolError("an empty shortcut", reason="unexpected_frame")
        self._domains = {}
        for domain, section in transfer.sections.items():
            named = len(section.records) + len(section.wants) // RECORD_ID_LEN
            if named != 1 or section.id_lists or section.prefix_wants or section.short_wants:
                raise RemoteProtocolError(
                    "a shortcut names exactly one id per domain", reason="unsolicited"
                )
            dp = self._domains[domain] = self._new_pass()
            one = section.wants or self._decode_record(domain, section.records[0])[1]
            dp.shortcut, dp.diff_buckets = True, {bucket_of(one)}
        self.state = State.TRANSFER
        return self._on_transfer(transfer)

    # --- small sets: the responder lists its differing domains whole, no descent ---

    def _whole_listings(
        self, hello: Hello, differing: list[Domain], narrowed: Scope | None
    ) -> Sketches | None:
        """Our short ids of each differing domain, when every one holds at most
        ``WHOLE_LISTING_MAX`` of ours and the initiator holds at most that many in all (its
        HELLO's count): no more bytes than the 256 top hashes of a domain, a round trip
        saved, and neither side hashes a node. The region is the whole domain (the root's
        buckets). Not after a sketch failed, nor beside another session of ours that holds
        buckets: we claim none, and the initiator claims the buckets it names (as a
        requested sketch's decoder). ``narrowed``: the intersection, when narrower than the
        HELLO offered — named in the frame, as in the first NODES."""
        most = WHOLE_LISTING_MAX
        if not (self._sketching() and self.config.listings) or hello.cell[1] > most:
            return None
        if self._claims is not None and self._claims.others_hold(self):
            return None
        counts = [self._tree(d).count for d in differing]
        if max(counts) > min(most, self.config.max_ids_per_frame):
            return None
        width = self.config.short_id_bytes or short_id_width(max(counts) + hello.cell[1], 1.0)
        self._domains = self._new_passes(differing)
        sections = {}
        for domain, dp in self._domains.items():
            dp.sent, dp.sent_depth = [0], 0  # the listing's flags are over the root
            region, skip = self._open_region(domain, dp, 0, [0], width, announce=True)
            listing = encode_listing(region.shorts, width)
            sections[domain] = SketchSection(ROOT_FLAGS, 0, width, listing, skip)
        self.state = State.AWAIT_DECODE
        return Sketches(sections, cutoff_ms=max(0, self._session_cutoff or 0), scope=narrowed)

    def _on_whole_listings(self, frame: Sketches) -> Sketches | Transfer | Done:
        """The responder listed its differing domains whole (``_whole_listings``): decode
        them over the root, under the session cutoff (and scope) the frame names. Over a
        named intersection where nothing differs, end at once with a one-way DONE — as equal
        top nodes there do (``_on_top``)."""
        sections = frame.sections.values()
        if frame.answer or frame.cutoff_ms is None or not frame.sections:
            raise RemoteProtocolError("only whole listings answer HELLO", reason="unexpected_frame")
        if self._offered > WHOLE_LISTING_MAX:  # we would list more than a small set
            raise RemoteProtocolError(
                f"whole listings after a HELLO of {self._offered} ids", reason="unexpected_frame"
            )
        if any(not s.is_listing for s in sections):
            raise RemoteProtocolError("HELLO is answered by listings", reason="bad_cells")
        if any(s.flags != ROOT_FLAGS for s in sections):
            raise RemoteProtocolError("a whole listing covers the root", reason="bad_flags")
        if frame.scope is not None:
            self._narrow(frame.scope)
        self._session_cutoff = _later(self.config.cutoff_ms, frame.cutoff_ms)
        self._domains = self._new_passes(frame.sections)
        for dp in self._domains.values():
            dp.sent, dp.sent_depth = [0], 0
        reply = self._on_sketch(frame)
        moves = not isinstance(reply, Transfer) or not reply.idle or reply.sections
        if frame.scope is None or moves:
            return reply
        self.state, self.converged = State.DONE, True
        return Done(True)

    def _on_done(self, done: Done) -> None:
        self.state, self.converged = State.DONE, done.converged
        return None

    def _on_equal_top(self, done: Done) -> None:
        """The initiator found every top node of the intersection equal, or our whole
        listings of it. Only after NODES (or listings) that narrowed the scope: unnarrowed,
        the roots it compared in HELLO differed, so an honest initiator finds a difference."""
        if not self._narrowed:
            raise RemoteProtocolError("DONE before we sent our roots", reason="unexpected_frame")
        return self._on_done(done)

    def _on_closed(self, done: Done) -> None:
        """The initiator compared our roots with its own and ended the session (one way)."""
        if not self._sent_roots:
            raise RemoteProtocolError("DONE before we sent our roots", reason="unexpected_frame")
        return self._on_done(done)

    def _own_roots(self) -> tuple[bytes, tuple[bytes, int, int]]:
        """What a HELLO of this pass would say of our roots: salted digests, summed cell."""
        trees = {d: self._tree(d) for d in Domain}
        roots = {d: t.root() for d, t in trees.items()}
        digests = b"".join(root_digest(self._salt, d, *roots[d]) for d in Domain)
        return digests, _sum_cell(roots, {d: t.root_check() for d, t in trees.items()})

    # --- descent: each step reads the peer's flags and hashes, answers with ours ---

    def _descend(self, domain: Domain, flags: bytes, hashes: bytes, depth: int) -> list[int]:
        """Indexes at ``depth`` whose hashes differ from the peer's. Remembers nothing."""
        dp = self._domains[domain]
        if depth == TOP_DEPTH:
            if flags:
                raise RemoteProtocolError(
                    "the top NODES frame carries no flags", reason="bad_flags"
                )
            theirs = list(range(FANOUT**TOP_DEPTH))
        else:
            theirs = children(depth - 1, read_flags(dp.sent, flags))
        w = self._width
        bits = 8 * w
        if depth == TOP_DEPTH + 1 and theirs:  # the initiator's may be narrower (sketch path)
            bits = min(bits, 8 * len(hashes) // len(theirs))
        if bits < min(8 * w, MIN_DESCENT_BITS) or len(hashes) != -(-len(theirs) * bits // 8):
            raise RemoteProtocolError(
                f"{len(hashes)} hash bytes for {len(theirs)} nodes of width {self._width}",
                reason="bad_hashes",
            )
        mine = self._tree(domain).hashes(depth, theirs, self._salt, w)
        unequal = _hash_bits(mine, w, bits) != _unpacked(hashes, len(theirs), bits)
        differ = [theirs[i] for i in np.flatnonzero(unequal.any(axis=1)).tolist()]
        dp.sent = theirs  # what our flags in the reply refer to
        return differ

    def _children_hashes(
        self, differs: dict[Domain, list[int]], depth: int, *, narrow: bool = False
    ) -> Nodes:
        """Flags over the peer's nodes at ``depth`` (``differs``), our hashes of their children
        (``narrow``: the initiator's depth-3 hashes, cut to ``descent_bits``)."""
        out = {}
        w = self._width
        for domain, differ in differs.items():
            dp = self._domains[domain]
            differ = self._not_held_elsewhere(domain, dp, differ, depth)
            reply_flags = write_flags(dp.sent, set(differ))
            bits = 8 * w
            if narrow and depth == TOP_DEPTH:
                bits = min(bits, descent_bits(len(dp.sent), len(differ)))
            dp.sent, dp.sent_depth = children(depth, differ), depth + 1
            hashes = self._tree(domain).hashes(depth + 1, dp.sent, self._salt, w)
            out[domain] = (reply_flags, np.packbits(_hash_bits(hashes, w, bits)).tobytes())
        return Nodes(out)

    def _not_held_elsewhere(
        self, domain: Domain, dp: _DomainPass, differ: list[int], depth: int
    ) -> list[int]:
        """The differing nodes at ``depth`` with a bucket under them that no other session of
        ours holds: under the others, every bucket would be left to those sessions at the
        leaves (``_take``), so the descent stops above them — a session beside a catch-up
        hashed all 65,536 leaves (263–675 kB) to find nothing it could take. What it leaves
        is deferred, as ``_take``'s rest is (``truncated``)."""
        claims = self._claims
        if claims is None or not differ or not claims.others_hold(self):
            return differ
        shift = FANOUT_BITS * (DEPTH - depth)
        kept = [
            node
            for node in differ
            if not claims.held_by_others(
                self, domain, range(node << shift, (node + 1) << shift), self._now_ms
            )
        ]
        if len(kept) < len(differ):
            dp.truncated = True
        return kept

    def _on_top(self, nodes: Nodes) -> Nodes | Sketches | Done:
        if nodes.scope is not None:
            self._narrow(nodes.scope)
        self._session_cutoff = _later(self.config.cutoff_ms, nodes.cutoff_ms)
        self._domains = self._new_passes(nodes.sections)
        if not self._domains:
            raise RemoteProtocolError("NODES without any domain", reason="unexpected_domain")
        differs = self._compared(nodes, TOP_DEPTH)
        if not any(differs.values()) and nodes.scope is not None:
            # Every top node equal over the intersection: the roots we offered differed only
            # by shards the responder does not hold (a narrowed HELLO: most scoped sessions).
            # Unnarrowed, equal top nodes mean a write since our HELLO (another session's
            # records) or a collision: the pass goes on, and its closing roots decide.
            self.state, self.converged = State.DONE, True
            return Done(True)
        if self._sketching():
            return self._sketch_or_descend(differs, TOP_DEPTH, State.AWAIT_LEAVES)
        self.state = State.AWAIT_LEAVES
        return self._children_hashes(differs, TOP_DEPTH)

    def _narrow(self, scope: Scope) -> None:
        """The responder named the intersection: it must lie within what we offered."""
        try:
            within = self._scope.covers(scope)
        except ScopeError as exc:
            raise RemoteProtocolError(f"NODES scope: {exc}", reason="scope_mismatch") from None
        if not within:
            raise RemoteProtocolError(
                f"the peer named {scope}, beyond the {self._scope} offered",
                reason="scope_widened",
            )
        self._scope = scope

    def _on_middle(self, nodes: Nodes) -> Nodes | Sketches:
        self._no_scope(nodes)
        differs = self._compared(nodes, TOP_DEPTH + 1)
        if self._sketching():
            return self._sketch_or_descend(differs, TOP_DEPTH + 1, State.AWAIT_CELLS)
        self.state = State.AWAIT_CELLS
        return self._children_hashes(differs, TOP_DEPTH + 1)

    def _on_leaves(self, nodes: Nodes) -> Cells | Nodes | Sketches:
        self._no_scope(nodes)
        differs = self._compared(nodes, DEPTH)
        if self._sketching() and not self._catching_up(differs, DEPTH):
            return self._sketch_or_descend(differs, DEPTH, State.TRANSFER)
        out = {}
        for domain, differ in differs.items():
            dp = self._domains[domain]
            taken = self._take(domain, differ)
            # the rest (over max_cells, or another session's): a later pass
            dp.truncated = len(taken) < len(differ)
            differ = taken
            dp.diff_buckets = set(differ)
            tree = self._tree(domain)
            cells = b"".join(_encode_cell(*tree.cell(b)) for b in differ)
            out[domain] = (write_flags(dp.sent, dp.diff_buckets), cells)
        self.state = State.TRANSFER
        return Cells(out)

    def _on_cells(self, cells: Cells) -> Transfer:
        self._section_domains(cells.sections, "CELLS")
        for domain, (flags, blob) in cells.sections.items():
            dp = self._domains[domain]
            buckets = read_flags(dp.sent, flags)
            if len(blob) != len(buckets) * CELL_LEN or len(buckets) > self.config.max_cells:
                raise RemoteProtocolError(
                    f"{len(blob)} cell bytes for {len(buckets)} leaves", reason="bad_cells"
                )
            dp.diff_buckets = set(self._take(domain, buckets))  # another session's: left alone
            tree = self._tree(domain)
            for i, bucket in enumerate(buckets):
                if bucket not in dp.diff_buckets:
                    continue
                theirs = _decode_cell(blob[i * CELL_LEN : (i + 1) * CELL_LEN])
                self._reconcile_cell(domain, dp, bucket, tree.cell(bucket), theirs)
        self.state = State.TRANSFER
        return self._next_transfer()

    # --- sketches: the differing ranges' ids, decoded as a set difference ---

    def _sketching(self) -> bool:
        """Whether this pass may sketch: not after a sketch of this session failed to decode.
        A sketch is sized by the share of equal nodes, which assumes the difference scattered
        over the ids; a difference in one id range (a catch-up cut short, a waiting room that
        evicted what came first: the lowest ids) leaves most nodes equal and the estimate far
        too low, the same every pass, and the session never converged (SYNC.md, "Sizing by
        the tree"). The cells of the differing leaves name ids wherever they lie."""
        return self.config.sketch and not self._sketch_failed

    def _compared(self, nodes: Nodes, depth: int) -> dict[Domain, list[int]]:
        """Per domain, the peer's nodes at ``depth`` whose hashes differ from ours."""
        self._section_domains(nodes.sections, "NODES")
        return {
            d: self._descend(d, flags, hashes, depth)
            for d, (flags, hashes) in nodes.sections.items()
        }

    def _sketch_or_descend(
        self, differs: dict[Domain, list[int]], depth: int, deeper: State
    ) -> Nodes | Sketches:
        """Sketch the ranges that differ at ``depth`` (``differs``), sized by the difference
        the share of equal nodes implies, or — when no compared node was equal, so that
        share says nothing — descend one level to estimate again (``deeper``)."""
        saturated = any(
            differ and len(differ) == len(self._domains[d].sent) for d, differ in differs.items()
        )
        if depth < DEPTH and (
            saturated or self._descend_cheaper(differs, depth) or self._catching_up(differs, depth)
        ):
            self.state = deeper
            return self._children_hashes(differs, depth, narrow=True)
        # Another session of ours holds buckets: the peer would push into them as well, so
        # ask for its sketch and decode it here, claiming exactly the buckets it names.
        request = self._claims is not None and self._claims.others_hold(self)
        sketches = {}
        for domain, differ in differs.items():
            dp = self._domains[domain]
            flags = write_flags(dp.sent, set(differ))
            estimate = estimate_difference(depth, len(dp.sent), len(differ))
            cells = min(cells_for(estimate), self._max_sketch_cells)
            per_bucket = self._tree(domain).count / NUM_BUCKETS
            width = self.config.short_id_bytes or short_id_width(estimate, per_bucket)
            region, skip = self._open_region(
                domain, dp, depth, differ, width, claim=not request, announce=True
            )
            if request:
                region.cells = cells  # the size of the sketch we ask for
                sketches[domain] = SketchSection(flags, cells, width, b"", skip)
            else:
                sketches[domain] = self._section(region, flags, cells, skip)
        self.state = State.AWAIT_DECODE
        return Sketches(sketches)

    def _catching_up(self, differs: dict[Domain, list[int]], depth: int) -> bool:
        """A catch-up: more leaves differ (by the estimate) than a pass reconciles
        (``max_cells``), and other sessions of ours may share them (``claims``). It goes by
        the leaves' cells, whose passes take ``max_cells`` leaves each, so that sessions with
        several peers split it; a sketch covers its whole region, and its sender's session
        moved all of it alone (SYNC.md, "Sessions at once"). A session without claims (one
        peer at a time) still sketches: one session then converges at any difference."""
        if self._claims is None:
            return False
        for domain, differ in differs.items():
            if not differ:
                continue
            if depth == DEPTH:
                leaves = float(len(differ))
            else:
                compared = len(self._domains[domain].sent)
                estimate = estimate_difference(depth, compared, len(differ))
                leaves = -NUM_BUCKETS * math.expm1(-estimate / NUM_BUCKETS)
            if leaves > self.config.max_cells:
                return True
        return False

    def _descend_cheaper(self, differs: dict[Domain, list[int]], depth: int) -> bool:
        """Whether hashing the differing nodes' children costs less than sketching every id
        under them: the children hold more than ``descend_above`` ids on average. At
        n = 10^6, d = 10^3 ~98 % of depth-2 nodes differ, so a depth-2 sketch reads and hashes
        ~980,000 ids a side; the differing depth-3 nodes hold ~22 % of that (issue 35)."""
        below = FANOUT ** (depth + 1)
        return any(
            differ and self._tree(d).count / below > self.config.descend_above
            for d, differ in differs.items()
        )

    def _open_region(
        self,
        domain: Domain,
        dp: _DomainPass,
        depth: int,
        nodes: list[int],
        width: int,
        *,
        claim: bool = False,
        skip: bytes = b"",
        announce: bool = False,
    ) -> tuple[_Region, bytes]:
        """Our ids under ``nodes`` (at ``depth``) and their short ids for this pass, and the
        bitmap of the buckets left out. The sketch's sender (``claim``) leaves out the buckets
        another session of ours holds (``sync.claims``), so the peer pushes none of them;
        its receiver leaves out what the sender's ``skip`` says. The side that opens the
        region (``announce``) also leaves out, and says so in ``skip``, the buckets whose
        listing disagrees with its tree (``_checked_listing``); the other side just does not
        act in its own."""
        shift = FANOUT_BITS * (DEPTH - depth)
        runs = [(lo << shift, hi << shift) for lo, hi in runs_of(nodes)]  # the nodes' buckets
        under: list[int] = []  # each bucket: only for a bitmap over them, or to claim them
        left_out: set[int] = set()
        if skip or (claim and self._claims is not None):
            under = descendants(depth, nodes, DEPTH)
            if skip:
                left_out = set(read_flags(under, skip))
            if claim and self._claims is not None:
                taken = set(self._claims.take(self, domain, under, len(under), self._now_ms))
                left_out |= set(under) - taken
            if left_out:
                runs = runs_of([b for b in under if b not in left_out])
        key = SketchKey.derive(self._salt, int(domain), width)
        ids, bad = self._listing(domain, runs)
        buckets = RunSet(runs)
        if announce and (left_out or bad):
            skip = write_flags(under or descendants(depth, nodes, DEPTH), left_out | bad)
            buckets = buckets.without(bad)
        dp.region = _Region(buckets, key, ids, short_ids(key, ids), claim, bad=bad)
        dp.diff_buckets = buckets.without(bad)
        return dp.region, skip

    def _listing(self, domain: Domain, runs: list[tuple[int, int]]) -> tuple[bytes, set[int]]:
        """Our ids in the buckets of ``runs`` (ascending), checked (``_checked_listing``)."""
        ids = self.replica.ids_in_runs(domain, runs, self._cutoff(domain), self._scope)
        return self._checked_listing(domain, runs, ids)

    def _checked_listing(
        self, domain: Domain, runs: list[tuple[int, int]], ids: bytes
    ) -> tuple[bytes, set[int]]:
        """The listing of the buckets of ``runs`` checked against the tree that located them:
        the buckets where it holds more ids than the tree's leaf counts (a cutoff only ever
        lists fewer), and the listing without their ids or any outside ``runs``. An index
        and a tree out of step — a bucket mapping off by one, say — so never reconcile by
        what the tree does not file (SYNC.md, "Sketches"), and the session's closing root
        comparison says it did not converge."""
        if not ids:
            return ids, set()
        listed = np.frombuffer(ids, dtype=">u2")[:: RECORD_ID_LEN // 2].astype(np.intp)
        # Only a bucket the listing names can list too many: the work goes by the listing's
        # size, not by the 65,536 buckets (a session opens a region or two of a few ids).
        named, per_bucket = np.unique(listed, return_counts=True)
        inside = in_runs(named, runs)
        named, per_bucket = named[inside], per_bucket[inside]
        filed = np.asarray(self._tree(domain).leaf_counts(named.tolist()), dtype=np.int64)
        over = per_bucket > filed
        if not over.any() and int(per_bucket.sum()) == len(listed):
            return ids, set()
        rows = np.frombuffer(ids, dtype=np.uint8).reshape(-1, RECORD_ID_LEN)
        kept = rows[members(listed, named[~over])]
        self.stats.inconsistent_buckets += int(over.sum())
        return kept.tobytes(), set(named[over].tolist())

    @property
    def _max_sketch_cells(self) -> int:
        """``max_sketch_cells`` rounded down to a whole number of cells per hash."""
        return self.config.max_sketch_cells - self.config.max_sketch_cells % HASHES

    def _sketch_of(self, region: _Region, cells: int) -> Sketch:
        region.cells = cells
        return Sketch.of(region.key, cells, region.shorts)

    def _section(
        self, region: _Region, flags: bytes, cells: int, skip: bytes = b""
    ) -> SketchSection:
        """Our ids of ``region`` for the peer to decode: their listing where that is fewer
        bytes than a sketch of ``cells`` cells (a region of a few ids: most sessions at
        10,000 nodes), else the sketch."""
        width, listed = region.key.width, len(region.shorts)
        smaller = listed * width < cells * cell_len(width)
        if self.config.listings and smaller and listed <= self.config.max_ids_per_frame:
            region.cells = cells
            return SketchSection(flags, 0, width, encode_listing(region.shorts, width), skip)
        return SketchSection(flags, cells, width, self._sketch_of(region, cells).encode(), skip)

    def _listed(self, region: _Region, blob: bytes) -> Peeled:
        """What the peer's listing of ``region`` and our ids there differ by. A listed short id
        names its bucket: one outside the region is refused, as a push there would be."""
        width = region.key.width
        theirs = decode_listing(blob, width)  # the frame's length was checked
        buckets = (theirs >> np.uint64(8 * width - BUCKET_BITS)).astype(np.intp)
        if not in_runs(buckets, region.buckets.runs).all():
            raise RemoteProtocolError(
                "a listing names a bucket outside the region", reason="unsolicited"
            )
        return listed_difference(region.shorts, theirs)

    def _on_sketch(self, frame: Sketches) -> Sketches | Transfer:
        """Subtract the peer's sketch from ours and peel: push what only we hold, ask (by
        short id) for what only the peer holds. A sketch that does not decode is answered
        once with ours, twice as large, and a request with ours of the size asked; an
        answer is decoded for what it names — if it does not decode either, the closing
        root comparison says the rest is for the next pass."""
        if not frame.sections or any(d not in self._domains for d in frame.sections):
            raise RemoteProtocolError(
                "SKETCH for a domain outside this pass", reason="unexpected_domain"
            )
        if frame.answer != (self.state is State.AWAIT_DECODE):
            raise RemoteProtocolError(
                "an answer comes only after our own sketch, and only then",
                reason="unexpected_frame",
            )
        requests = [section.is_request for section in frame.sections.values()]
        if any(requests) and (frame.answer or not all(requests)):
            raise RemoteProtocolError("a request is a whole first sketch", reason="bad_cells")
        if not frame.answer:
            self._section_domains(frame.sections, "SKETCH")
        answers = {}
        for domain, section in frame.sections.items():
            dp = self._domains[domain]
            # an answer is at most twice the sketch we sent (or the size we asked for)
            limit = 2 * dp.region.cells if frame.answer and dp.region else None
            region = self._region_for(domain, dp, section, frame.answer)
            if section.is_listing:
                peeled = self._listed(region, section.blob)
            else:
                cells = section.cells
                if cells < HASHES or cells % HASHES or cells > (limit or self._max_sketch_cells):
                    raise RemoteProtocolError(f"a sketch of {cells} cells", reason="bad_cells")
                if section.is_request:  # our sketch (or listing), for the peer to decode
                    answers[domain] = self._section(region, b"", cells)
                    continue
                theirs = Sketch.decode(region.key, cells, section.blob)  # length checked
                peeled = self._sketch_of(region, cells).subtract(theirs).peel()
                larger = min(2 * cells, self._max_sketch_cells)
                self._sketch_failed |= not peeled.complete
                if not peeled.complete and not frame.answer and larger > cells:
                    answers[domain] = self._section(region, b"", larger)
                    continue
            region.complete = peeled.complete
            mine = lookup(region.shorts, region.ids, peeled.mine)
            width = region.key.width  # a short id names its bucket: ask only in ours
            named = {bucket_of(i) for i in mine} | {
                bucket_of_short(s, width) for s in peeled.theirs
            }
            ours = self._claim_decoded(domain, region, named - region.bad)
            dp.outbox.extend(i for i in mine if bucket_of(i) in ours)
            wants = [s for s in peeled.theirs if bucket_of_short(s, width) in ours]
            dp.short_wants.extend(self._still_missing(domain, region, wants, ours))
        if answers:
            self.state = State.AWAIT_DECODE
            return Sketches(answers, answer=True)
        self.state = State.TRANSFER
        return self._next_transfer()

    def _still_missing(
        self, domain: Domain, region: _Region, wants: list[int], buckets: set[int]
    ) -> list[int]:
        """Of the short ids a decode asks for, those we still lack now that their buckets are
        ours. A decoder claims after it read its region: a session that held those buckets
        meanwhile wrote what it brought and freed them (it frees only after writing), so the
        buckets are read again rather than asking for the same records twice."""
        if not wants or region.sent or self._claims is None:
            return wants
        ids, _ = self._listing(domain, runs_of(sorted(buckets)))
        have = set(short_ids(region.key, ids).tolist())
        return [s for s in wants if s not in have]

    def _claim_decoded(self, domain: Domain, region: _Region, named: set[int]) -> set[int]:
        """Of the buckets a decode named, those this session moves: what the sender of the
        sketch claimed when it built it (all of them), or for the decoder, the ones no other
        session of ours holds — claimed now, per bucket, not for the whole region."""
        if region.sent or self._claims is None:
            return named
        return set(self._claims.take(self, domain, sorted(named), len(named), self._now_ms))

    def _narrow_claims(self, transfer: Transfer) -> None:
        """The peer decoded our sketch and pushed all it found: keep the buckets records moved
        in, either way, or that it asks in, free the rest of the region (for the other
        sessions' next passes)."""
        if self._claims is None:
            return
        keep: dict[Domain, set[int]] = {}
        for domain, dp in self._domains.items():
            if dp.region is None or not dp.region.sent:
                continue
            named = keep.setdefault(domain, set())
            section = transfer.sections.get(domain)
            if section is not None:
                named.update(bucket_of(w) for w in _split(section.wants, RECORD_ID_LEN))
                width = dp.region.key.width
                shorts = _split(section.short_wants, width)
                named.update(bucket_of_short(int.from_bytes(s, "big"), width) for s in shorts)
            named.update(dp.moved)
            named.update(bucket_of(i) for i in dp.outbox)
        if keep:
            self._claims.keep_only(self, keep, self._now_ms)

    def _region_for(
        self, domain: Domain, dp: _DomainPass, section: SketchSection, answer: bool
    ) -> _Region:
        """The region a sketch covers: named by its flags, or for an answer, our own."""
        if not answer:
            nodes = read_flags(dp.sent, section.flags)
            return self._open_region(
                domain, dp, dp.sent_depth, nodes, section.width, skip=section.skip
            )[0]
        region = dp.region
        if region is None or section.flags or section.skip or section.width != region.key.width:
            raise RemoteProtocolError("an answer must keep the region", reason="bad_flags")
        # read again: other sessions may have brought records since we sent ours
        region.ids, bad = self._listing(domain, region.buckets.runs)
        region.bad |= bad
        dp.diff_buckets = region.buckets.without(region.bad)
        region.shorts = short_ids(region.key, region.ids)
        return region

    def _take(self, domain: Domain, buckets: list[int]) -> list[int]:
        """The differing buckets this pass reconciles: at most ``max_cells``, none that
        another session of this replica is reconciling now (``sync.claims``)."""
        if self._claims is None:
            return buckets[: self.config.max_cells]
        # From where this pass's salt points, not from the lowest: the sessions several peers
        # open with a node that catches up then name different leaves, and its responder
        # sides find some that none of its sessions holds.
        start = int.from_bytes(self._salt[:4], "big") % len(buckets) if buckets else 0
        rotated = buckets[start:] + buckets[:start]
        taken = set(self._claims.take(self, domain, rotated, self.config.max_cells, self._now_ms))
        return [b for b in buckets if b in taken]

    def _reconcile_cell(
        self,
        domain: Domain,
        dp: _DomainPass,
        bucket: int,
        mine: tuple[int, int, int],
        theirs: tuple[int, int, int],
    ) -> None:
        """Decode one differing leaf into a want or a push, or fall back to an id list."""
        decoded = decode_pure_cell(bucket, mine, theirs)
        if decoded is None:
            dp.id_lists.append(self._id_list(domain, bucket))
            dp.id_list_asks[bucket] = max(1, theirs[0] - mine[0])  # what the peer will push
        elif decoded[0] > 0:
            dp.wants.append(decoded[1])  # the peer has it, we do not
        else:
            dp.outbox.append(decoded[1])  # we have it, the peer does not

    def _id_list(self, domain: Domain, bucket: int) -> IdList:
        ids = self.replica.bucket_ids(domain, bucket, self._cutoff(domain), self._scope)
        prefixes = sorted(salted_prefix(self._salt, i) for i in ids)
        complete = len(prefixes) <= self.config.max_bucket_ids
        # An oversized (perhaps ground) bucket sends a salted sample; next pass samples anew.
        return IdList(bucket, complete, b"".join(prefixes[: self.config.max_bucket_ids]))

    def _cutoff(self, domain: Domain) -> int | None:
        return self._session_cutoff if domain is Domain.MESSAGES else None

    # --- transfer ---

    def _on_transfer(self, transfer: Transfer) -> None:
        decoded_ours = self.state is State.AWAIT_DECODE  # the peer decoded our sketch
        self.state = State.TRANSFER
        # member ops before messages: a frame that brings a message and the op that admits
        # it stores both, instead of parking the message until the next frame
        for domain, section in sorted(transfer.sections.items(), key=_apply_order):
            dp = self._domains.get(domain)
            if dp is None:
                raise RemoteProtocolError(
                    f"TRANSFER for {domain.name} outside this pass", reason="unexpected_domain"
                )
            self._take_requests(domain, dp, section)
            if not self._take_records(domain, dp, section.records):
                break  # a bad record: what came before it is written, then the session ends
        # The peer decoded our sketch and pushes what it found over as many frames as that
        # takes: only once it has nothing left to push do the buckets it moved tell us which
        # of our region's we still need (narrowed earlier, the rest of the region went to our
        # other sessions, which moved the same records again).
        self._narrow_when_drained |= decoded_ours
        if self._narrow_when_drained and (transfer.idle or transfer.drained):
            self._narrow_when_drained = False
            self._narrow_claims(transfer)
        self._taken = transfer  # answered by ``answer`` once the records are written
        return None

    def _answer_transfer(self, transfer: Transfer) -> Frame:
        if transfer.idle:  # the peer has nothing queued: it answered all we asked
            for dp in self._domains.values():
                dp.asked = 0
        reply = self._next_transfer()
        if self.role is INIT and (transfer.idle or transfer.drained) and self._closes(reply):
            pushes = any(s.records for s in reply.sections.values())
            if transfer.roots == self._own_roots() and not pushes:
                # the peer's roots, after all it pushed, are ours: converged, no closing pass
                self.state, self.converged = State.DONE, True
                return Done(True)
            # The peer has nothing more to push and this reply answers all it asked: close
            # the pass with HELLO, carrying the reply's records (no round trip of its own).
            records = {d: s.records for d, s in reply.sections.items() if s.records}
            return self._begin_pass(final=self._final_pass(), records=records)
        return reply

    def _closes(self, reply: Transfer) -> bool:
        """The reply asks nothing and leaves nothing queued."""
        asks = any(
            s.wants or s.id_lists or s.prefix_wants or s.short_wants
            for s in reply.sections.values()
        )
        return not asks and not any(dp.pending() for dp in self._domains.values())

    def _final_pass(self) -> bool:
        """Whether the next pass only compares roots (a pass that is not final costs the same
        when the roots are equal: the responder answers DONE either way).

        After a shortcut, no: if one id did not close the gap, descend. After a sketch pass
        that moved records, no: whatever still differs — a sketch that did not decode, buckets
        another session held, a write that raced — is found by the next. One that moved
        nothing is final when a cutoff or settling explains it (it would find the same
        again) and no sketch failed to decode (the next pass descends to cells instead:
        ``_sketching``); otherwise a short-id collision may have hidden the difference, and
        the next pass's fresh salt will not. Cells passes, as before: a pass that found differences
        but could move nothing (e.g. records the other side's retention refuses) would find
        the same again."""
        passes = list(self._domains.values())
        if any(dp.shortcut for dp in passes):
            return False
        if self._left_to_others():
            return True
        if any(dp.region is not None for dp in passes):
            explained = self._session_cutoff is not None or self.config.settle_ms is not None
            return self._moved == 0 and explained and not self._sketch_failed
        found = any(dp.diff_buckets for dp in passes)
        return found and (self._moved == 0 or self._stuck())

    def _left_to_others(self) -> bool:
        """This pass left every leaf it found different to other sessions of ours (``_take``,
        ``_not_held_elsewhere``): they bring those records; the next pass would find the same."""
        passes = self._domains.values()
        return any(dp.truncated for dp in passes) and not any(dp.diff_buckets for dp in passes)

    def _stuck(self) -> bool:
        """Only messages differed, all leaves were compared, and in one no record moved.

        Messages are immutable, so such a leaf holds records the session cutoff filters
        (one side aged them out): the next pass would find it again, and the records that
        did move are confirmed by the final HELLO's root comparison or the next session.
        Members and identity are excluded: a merge there supersedes ids, which a pass 2 needs.
        """
        dp = self._domains.get(Domain.MESSAGES)
        if dp is None or len(self._domains) != 1 or dp.truncated:
            return False
        return len(dp.diff_buckets) > sum(1 for b in dp.moved if b in dp.diff_buckets)

    def _take_requests(self, domain: Domain, dp: _DomainPass, section: TransferSection) -> None:
        for record_id in _split(section.wants, RECORD_ID_LEN):
            self._check_bucket(dp, bucket_of(record_id), "want")
            dp.outbox.append(record_id)
        for want in section.prefix_wants:
            self._check_bucket(dp, want.bucket, "prefix want")
            asked = set(_split(want.prefixes, ID_PREFIX_LEN))
            for record_id in self.replica.bucket_ids(
                domain, want.bucket, self._cutoff(domain), self._scope
            ):
                if salted_prefix(self._salt, record_id) in asked:
                    dp.outbox.append(record_id)
        if section.short_wants:
            region = dp.region
            if region is None or len(section.short_wants) % region.key.width:
                raise RemoteProtocolError(
                    "short wants outside a sketch pass, or of the wrong width",
                    reason="unsolicited",
                )
            w = region.key.width
            wanted = [int.from_bytes(c, "big") for c in _split(section.short_wants, w)]
            dp.outbox.extend(lookup(region.shorts, region.ids, wanted))
        for id_list in section.id_lists:
            if self.role is not INIT:
                raise RemoteProtocolError(
                    "only the responder sends id lists", reason="unexpected_frame"
                )
            self._check_bucket(dp, id_list.bucket, "id list")
            self._compare_id_list(domain, dp, id_list)
        if len(dp.outbox) > self.config.max_outbox:
            raise RemoteProtocolError("peer asked for too many records", reason="too_many_items")

    def _compare_id_list(self, domain: Domain, dp: _DomainPass, id_list: IdList) -> None:
        mine = {
            salted_prefix(self._salt, i): i
            for i in self.replica.bucket_ids(
                domain, id_list.bucket, self._cutoff(domain), self._scope
            )
        }
        theirs = set(_split(id_list.prefixes, ID_PREFIX_LEN))
        if id_list.complete:
            dp.outbox.extend(record_id for p, record_id in mine.items() if p not in theirs)
        missing = b"".join(sorted(p for p in theirs if p not in mine))
        if missing:
            dp.prefix_wants.append(PrefixWant(id_list.bucket, missing))

    def _check_bucket(self, dp: _DomainPass, bucket: int, what: str) -> None:
        if bucket not in dp.diff_buckets:
            raise RemoteProtocolError(
                f"{what} for bucket {bucket}, which this pass did not find different",
                reason="unsolicited",
            )

    def _check_records(self, domain: Domain, dp: _DomainPass, blobs: list[bytes]) -> CheckedRecords:
        """Decode and authenticate every record: the valid ones, and the first problem."""
        decoded: list[tuple[Record, bytes, int]] = []
        problem: RemoteProtocolError | None = None
        for blob in blobs:
            try:
                record, record_id, physical_ms = self._decode_record(domain, blob)
                self._check_bucket(dp, bucket_of(record_id), "record")
                self._check_scope(domain, record)
            except RemoteProtocolError as exc:
                problem = problem or exc
                continue
            decoded.append((record, record_id, physical_ms))
        if domain in MESSAGE_DOMAINS:
            decoded, problem = self._verified(decoded, problem)
        return decoded, problem

    def _check_scope(self, domain: Domain, record: Record) -> None:
        if not in_domain_scope(domain, record, self._scope):
            raise RemoteProtocolError(
                "a record of a chat or user outside the session's scope", reason="out_of_scope"
            )

    def _take_records(self, domain: Domain, dp: _DomainPass, blobs: list[bytes]) -> bool:
        """Keep the valid records for the driver (``check`` validated every one); False if
        one was invalid (``answer`` raises its error once the valid ones are written)."""
        checked = self._checked.get(domain)
        if checked is None:
            checked = self._check_records(domain, dp, blobs)
        decoded, problem = checked
        dp.asked = max(0, dp.asked - len(blobs))
        if decoded and self._claims is not None:
            self._claims.progress(self, self._now_ms)
        valid: list[Record] = []
        for record, record_id, physical_ms in decoded:
            dp.moved.add(bucket_of(record_id))
            cutoff = self._cutoff(domain)  # messages only: rows and identities never expire
            if cutoff is not None and domain is Domain.MESSAGES and physical_ms <= cutoff:
                self.stats.rejected_old += 1
                continue
            limit = self.config.max_offset_ms
            if limit is not None and physical_ms - self._now_ms > limit:
                # The gossip validator refuses these too; not the peer's fault if our clock lags.
                self.stats.rejected_future += 1
                continue
            valid.append(record)
        self.stats.records_received += len(blobs)
        self._moved += len(blobs)
        if valid:
            self._received.append((domain, valid))
        self._problem = problem
        return problem is None

    def _verified(
        self, decoded: list[tuple[Record, bytes, int]], problem: RemoteProtocolError | None
    ) -> tuple[list[tuple[Record, bytes, int]], RemoteProtocolError | None]:
        """The decoded messages whose signatures verify, and the first problem: the last
        check of ``refuse_never_valid``, left out in ``_decode_record`` to be made here for
        the whole frame at once (``verify_messages``: worker processes on a node)."""
        verify = self.config.verify_messages or verify_each
        errors = verify([record for record, _, _ in decoded if isinstance(record, MsgV1)])
        kept = []
        for item, error in zip(decoded, errors, strict=True):
            if error is None:
                kept.append(item)
            elif problem is None:
                problem = RemoteProtocolError(f"record: {error}", reason=error.reason)
        return kept, problem

    def _decode_record(self, domain: Domain, blob: bytes) -> tuple[Record, bytes, int]:
        """Decode one record and refuse what it can never be (``store.ingress``; a message's
        signature is checked afterwards, a frame at a time): the record, its id — computed
        here, never taken from the peer — and the physical time of its stamp (for the
        drift check)."""
        try:
            record: Record
            if domain in MESSAGE_DOMAINS:
                record = decode_msg(blob, max_payload=self.config.max_payload)
                if (record.kind is MessageKind.DELETE) != (domain is Domain.DELETES):
                    raise DecodeError(f"a {record.kind.name} message in the {domain.name} domain")
                record_id = record.msg_id
            elif domain in MEMBER_DOMAINS:
                record = decode_membership_op(blob)
                record_id = member_op_id(blob)
            else:
                record = decode_identity_record(blob)
                record_id = record.record_id
            refuse_never_valid(
                [record],
                now_ms=self._now_ms,
                limits=RECORD_LIMITS,
                message_signatures=False,
                authenticate=self.config.authenticate,
            )
            return record, record_id, record.hlc.physical_ms
        except DecodeError as exc:
            raise RemoteProtocolError(f"record: {exc}", reason="invalid_record") from None
        except InvalidInput as exc:  # BadSignature, Unauthorized
            raise RemoteProtocolError(f"record: {exc}", reason=exc.reason) from None

    def _next_transfer(self) -> Transfer:
        budget = self.config.max_record_bytes
        id_budget = self.config.max_ids_per_frame
        sections: dict[Domain, TransferSection] = {}
        for domain, dp in self._domains.items():
            records, budget = self._fill_records(domain, dp, budget, id_budget)
            id_budget -= len(records)
            # asks wait while too many are unanswered: the peer's outbox stays within its
            # max_outbox however many records this pass moves (a catch-up of 1,000,000)
            room = dp.ask_window - dp.asked
            wants = dp.wants[: max(0, min(id_budget, room))]
            del dp.wants[: len(wants)]
            if dp.twins is not None:  # asked for in the other member domain: not again
                wants = [w for w in wants if w not in dp.twins]
                dp.twins.update(wants)
            id_budget -= len(wants)
            dp.asked += len(wants)
            id_lists = _take_within(dp.id_lists, id_budget, dp, dp.id_list_asks)
            id_budget -= sum(len(x.prefixes) // ID_PREFIX_LEN for x in id_lists)
            prefix_wants = _take_within(dp.prefix_wants, id_budget, dp)
            id_budget -= sum(len(x.prefixes) // ID_PREFIX_LEN for x in prefix_wants)
            shorts = dp.short_wants[: max(0, min(id_budget, dp.ask_window - dp.asked))]
            del dp.short_wants[: len(shorts)]
            id_budget -= len(shorts)
            dp.asked += len(shorts)
            width = 0 if dp.region is None else dp.region.key.width
            section = TransferSection(
                records,
                b"".join(wants),
                id_lists,
                prefix_wants,
                b"".join(s.to_bytes(width, "big") for s in shorts),
            )
            if not section.empty:
                sections[domain] = section
            self.stats.records_sent += len(records)
            self._moved += len(records)
        asks = any(
            s.wants or s.id_lists or s.prefix_wants or s.short_wants for s in sections.values()
        )
        queued = any(dp.pending() for dp in self._domains.values())
        idle = not asks and not queued
        return Transfer(idle, sections, drained=not idle and not queued)

    def _fill_records(
        self, domain: Domain, dp: _DomainPass, budget: int, max_records: int
    ) -> tuple[list[bytes], int]:
        """Take records for ids at the head of the outbox while they fit in ``budget`` bytes."""
        out: list[bytes] = []
        settle = self.config.settle_ms
        settled = None if settle is None or domain is not Domain.MESSAGES else self._now_ms - settle
        while dp.outbox and len(out) < max_records:
            chunk = [dp.outbox.popleft() for _ in range(min(FETCH_CHUNK, len(dp.outbox)))]
            blobs = self.replica.get_records(
                domain, chunk, self._cutoff(domain), settled, self._scope
            )
            for i, blob in enumerate(blobs):
                if blob is None or chunk[i] in dp.shipped:
                    continue  # gone since (superseded, aged out), or already sent
                if dp.twins is not None and chunk[i] in dp.twins:
                    continue  # pushed in the other member domain: the peer files it in both
                if (out and len(blob) > budget) or len(out) >= max_records:
                    dp.outbox.extendleft(reversed(chunk[i:]))
                    return out, budget
                out.append(blob)
                dp.shipped.add(chunk[i])
                if dp.twins is not None:
                    dp.twins.add(chunk[i])
                dp.moved.add(bucket_of(chunk[i]))
                budget -= len(blob)
        return out, budget


def _pushed_records(frame: Frame) -> dict[Domain, list[bytes]]:
    """The records a frame carries, per domain: a TRANSFER's, or a closing HELLO's."""
    if isinstance(frame, Transfer):
        return {d: s.records for d, s in frame.sections.items()}
    if isinstance(frame, Hello):
        return frame.records
    return {}


def root_digest(salt: bytes, domain: Domain, xor: bytes, count: int) -> bytes:
    """What HELLO says of one domain's root: ``ROOT_DIGEST_LEN`` bytes of a salted hash."""
    data = b"chatsync-root" + salt + bytes([domain]) + xor + count.to_bytes(8, "big")
    return blake3.blake3(data).digest(ROOT_DIGEST_LEN)


def _sum_cell(
    roots: dict[Domain, tuple[bytes, int]], checks: dict[Domain, int]
) -> tuple[bytes, int, int]:
    """The roots summed over the domains: one cell (xor, count, check) of every id."""
    xor = count = check = 0
    for d, (x, c) in roots.items():
        xor ^= int.from_bytes(x, "big")
        count += c
        check ^= checks.get(d, 0)
    return xor.to_bytes(RECORD_ID_LEN, "big"), count, check


def hello_for(
    pass_no: int,
    salt: bytes,
    width: int,
    roots: dict[Domain, tuple[bytes, int]],
    checks: dict[Domain, int] | None = None,
    cutoff_ms: int = 0,
    final: bool = False,
    records: dict[Domain, list[bytes]] | None = None,
    scope: Scope = EVERYTHING,
) -> Hello:
    """The HELLO that announces ``roots`` (every domain's (xor, count), the scoped domains'
    over ``scope``) and their checks."""
    digests = b"".join(root_digest(salt, d, *roots[d]) for d in Domain)
    cell = _sum_cell(roots, checks or {})
    return Hello(pass_no, salt, width, digests, cell, cutoff_ms, final, records or {}, scope)


def estimate_difference(depth: int, compared: int, differing: int) -> float:
    """The difference d implied by how many of the compared nodes at ``depth`` differ.

    d ids scattered over ``16^depth`` nodes leave ``16^depth e^(-d/16^depth)`` of them equal
    in expectation; nodes not compared (children of equal parents) are equal. Two standard
    deviations of the equal count are taken off first: an overestimate costs a few cells, an
    underestimate an answer sketch twice the size. Four cells an id peel above 1.30 d, so
    1.4 d̂ leaves less room than three did (1.22 d): with one deviation a depth-2 estimate
    (~5 equal nodes of 256 at d = 10^3) left 2.8 % of simulated decodes short, with two 0.2 %;
    at depth 3 (~3,100 equal) two cost ~4 % more cells (SYNC.md, "Sizing by the tree")."""
    nodes = FANOUT**depth
    equal = compared - differing
    low = max(0.0, equal - ESTIMATE_DEVIATIONS * min(math.sqrt(equal), math.sqrt(differing)))
    return nodes * math.log(nodes / (low + nodes - compared + 0.5))


def descent_bits(compared: int, differing: int) -> int:
    """Bits of the initiator's depth-3 hashes under ``differing`` of ``compared`` depth-2
    nodes: enough that the ~d differing children (at most 16 a node) collide with chance
    under ``2^-DESCENT_SAFETY_BITS`` (16 bits at d ≲ 64, 21 at d = 10^3, 22 at most)."""
    expected = float(FANOUT * differing)
    if differing < compared:  # some equal: their share estimates d
        expected = min(expected, estimate_difference(TOP_DEPTH, compared, differing))
    return max(MIN_DESCENT_BITS, math.ceil(math.log2(max(1.0, expected))) + DESCENT_SAFETY_BITS)


def _hash_bits(hashes: bytes, width: int, bits: int) -> npt.NDArray[np.uint8]:
    """Concatenated ``width``-byte hashes as rows of their first ``bits`` bits."""
    rows = np.frombuffer(hashes, dtype=np.uint8).reshape(-1, width)
    return np.unpackbits(rows, axis=1)[:, :bits]


def _unpacked(packed: bytes, count: int, bits: int) -> npt.NDArray[np.uint8]:
    """``count`` hashes of ``bits`` bits, packed MSB first (``np.packbits``), as rows."""
    flat = np.unpackbits(np.frombuffer(packed, dtype=np.uint8), count=count * bits)
    return flat.reshape(count, bits)


def _later(own: int | None, peer: int) -> int | None:
    """The later of two message cutoffs; 0 from the wire and None here both mean none."""
    present = [c for c in (own, peer) if c and c > 0]
    return max(present) if present else None


def _take_within(
    items: list[Any],
    budget: int,
    dp: _DomainPass | None = None,
    asks: dict[int, int] | None = None,
) -> list[Any]:
    """Pop items (IdList / PrefixWant) from the front while their prefixes fit in ``budget``
    and fewer than ``max_outbox // 2`` asked ids are unanswered (``dp.asked``, which grows by
    what each item asks for: a prefix want's prefixes, an id list's ``asks[bucket]``)."""
    taken = []
    room = float("inf") if dp is None else dp.ask_window - dp.asked
    while items and room > 0 and len(items[0].prefixes) // ID_PREFIX_LEN <= budget:
        item = items.pop(0)
        budget -= len(item.prefixes) // ID_PREFIX_LEN
        cost = len(item.prefixes) // ID_PREFIX_LEN if asks is None else asks.pop(item.bucket, 1)
        if dp is not None:
            dp.asked += cost
        room -= cost
        taken.append(item)
    return taken


def _encode_cell(count: int, xor: int, check: int) -> bytes:
    return (
        min(count, 0xFFFFFFFF).to_bytes(4, "big")
        + xor.to_bytes(32, "big")
        + check.to_bytes(4, "big")
    )


def _decode_cell(blob: bytes) -> tuple[int, int, int]:
    return (
        int.from_bytes(blob[:4], "big"),
        int.from_bytes(blob[4:36], "big"),
        int.from_bytes(blob[36:40], "big"),
    )


def decode_pure_cell(
    bucket: int, mine: tuple[int, int, int], theirs: tuple[int, int, int]
) -> tuple[int, bytes] | None:
    """If the two leaves differ by exactly one id: (+1 if the peer has it, -1 if we do, id)."""
    delta = theirs[0] - mine[0]
    if delta not in (1, -1):
        return None
    record_id = (theirs[1] ^ mine[1]).to_bytes(32, "big")
    if bucket_of(record_id) != bucket or check_hash(record_id) != theirs[2] ^ mine[2]:
        return None
    return delta, record_id
