"""What a chaos run recorded: every op submitted and its outcome, every event read per client
session, every history read, the faults as the nemesis carried them out, divergence samples.

Plain data (JSON in and out) and a lock: the workers, readers, nemesis and monitor threads
append here; ``checker`` reads it after the run. Ids, users and chats are hex.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from typing import Any

ACKED, REFUSED, UNKNOWN = "acked", "refused", "unknown"  # an op's outcome, as its client saw it
MESSAGES, DELETES, MEMBERS, IDENTITY = "messages", "deletes", "members", "identity"
DOMAINS = (MESSAGES, DELETES, MEMBERS, IDENTITY)


@dataclass
class OpRecord:
    """One signed op and what became of its request.

    ``acked``: 201, or 202 (a message held until a member op admits its sender), after the
    WriteBatch — on a durable node after the WAL sync. ``refused``: a JSON refusal, or a
    connection that could not be opened (the request never left). ``unknown``: a timeout or
    a connection lost mid-request (a killed or paused node): it may or may not be written.
    """

    id: str  # a message's id; BLAKE3 of any other op's encoding (its record id)
    domain: str  # MESSAGES, DELETES, MEMBERS, IDENTITY
    kind: str  # new, edit, delete, reaction, receipt, member, identity
    op_kind: int  # store.ops.OpKind, for decoding ``data``
    data: str  # base64 of the signed op as encoded
    user: str  # its author (a member op: the user it is about in ``subject``)
    chat: str
    ref: str
    hlc: int  # packed
    made_ms: int  # the client's wall clock when it signed it
    node: int  # where it was posted
    sent_s: float  # seconds since the run started
    done_s: float
    status: str = UNKNOWN
    code: str = ""  # HTTP status and refusal code, or the transport error
    subject: str = ""  # member ops: the user added or removed


@dataclass
class EventPage:
    t_s: float
    positions: list[int]  # this node's log positions of the page's events
    keys: list[str]  # per event: type and record id


@dataclass
class Epoch:
    """A session's reading from one start (no ``since``) on, resuming with tokens."""

    start_s: float
    pages: list[EventPage] = field(default_factory=list)
    reason: str = "start"  # why it began: start, foreign_token, unknown_position


@dataclass
class SessionLog:
    """One client session: a user's event stream and history reads on one node."""

    name: str
    user: str
    node: int
    epochs: list[Epoch] = field(default_factory=list)
    reconnects: int = 0  # times it found the node unreachable and came back
    # the node's whole log for the user after the run (positions and keys)
    final_positions: list[int] = field(default_factory=list)
    final_keys: list[str] = field(default_factory=list)


@dataclass
class ReadRecord:
    """A history page (newest first) a session read from its node."""

    session: str
    node: int
    t_s: float
    chat: str
    ids: list[str]
    hlcs: list[int]
    full: bool  # the page was full: older messages may lie beyond it


@dataclass
class FaultRecord:
    t_s: float
    node: int
    action: str  # e.g. "kill", "restart", "pause", "resume", "block 0->3", "skew +30000"
    kind: str
    ok: bool = True
    detail: str = ""


@dataclass
class Sample:
    """One monitor pass: per node, its record count per domain (None: no answer)."""

    t_s: float
    counts: list[dict[str, int] | None]
    roots: list[str | None]


@dataclass
class History:
    nodes: int
    seed: int
    ops: list[OpRecord] = field(default_factory=list)
    sessions: dict[str, SessionLog] = field(default_factory=dict)
    reads: list[ReadRecord] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    users: dict[str, str] = field(default_factory=dict)  # user hex -> role (creator, member, guest)
    chats: list[str] = field(default_factory=list)
    heal_s: float = 0.0  # faults over, workers stopped
    quiet_s: float = 0.0  # every node had the same roots

    def __post_init__(self) -> None:
        self._lock = threading.Lock()  # not a field: asdict leaves it out

    def add_op(self, op: OpRecord) -> None:
        with self._lock:
            self.ops.append(op)

    def add_read(self, read: ReadRecord) -> None:
        with self._lock:
            self.reads.append(read)

    def add_fault(self, fault: FaultRecord) -> None:
        with self._lock:
            self.faults.append(fault)

    def add_sample(self, sample: Sample) -> None:
        with self._lock:
            self.samples.append(sample)

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> History:
        sessions = {
            name: SessionLog(
                **{
                    **s,
                    "epochs": [
                        Epoch(**{**e, "pages": [EventPage(**p) for p in e["pages"]]})
                        for e in s["epochs"]
                    ],
                }
            )
            for name, s in data["sessions"].items()
        }
        return cls(
            nodes=data["nodes"],
            seed=data["seed"],
            ops=[OpRecord(**o) for o in data["ops"]],
            sessions=sessions,
            reads=[ReadRecord(**r) for r in data["reads"]],
            faults=[FaultRecord(**f) for f in data["faults"]],
            samples=[Sample(**s) for s in data["samples"]],
            users=data["users"],
            chats=data["chats"],
            heal_s=data["heal_s"],
            quiet_s=data["quiet_s"],
        )
