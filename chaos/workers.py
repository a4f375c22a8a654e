"""The client workload: users and group chats set up, then worker threads posting signed ops —
messages, edits, deletes, reactions, receipts, identities, member ops — to random nodes, each
request's outcome recorded (``chaos.history``).

One thread per member user; the creator's thread also removes and re-adds the guest in each
chat; the guest's thread posts messages whatever its membership (refused where a node knows
it was removed). Requests carry 1..``batch`` ops, all or nothing. Keys and choices come from
the run's seed.
"""

from __future__ import annotations

import base64
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from chaos.history import (
    ACKED,
    DELETES,
    IDENTITY,
    MEMBERS,
    MESSAGES,
    REFUSED,
    UNKNOWN,
    History,
    OpRecord,
)
from client.e2e import UserKey
from store.authz import GroupProof, new_group
from store.hlc import HlcClock
from store.kinds import Claims, reaction_payload
from store.ops import MembershipAction, MembershipOp, Op, encode_op, op_kind
from store.records import IdentityRecord, MessageKind, MsgV1, Role

POST_TIMEOUT_S = 5.0
# op kinds a member's request draws from, with weights
MEMBER_KINDS = {"new": 50, "edit": 10, "delete": 6, "reaction": 12, "receipt": 12, "identity": 3}


def seeded_key(seed: int, name: str) -> UserKey:
    return UserKey.from_seed(random.Random(f"{seed}:{name}").randbytes(32))


@dataclass
class Users:
    creator: UserKey
    members: list[UserKey]
    guest: UserKey

    @classmethod
    def make(cls, seed: int, members: int) -> Users:
        return cls(
            seeded_key(seed, "creator"),
            [seeded_key(seed, f"member{i}") for i in range(members)],
            seeded_key(seed, "guest"),
        )

    def roles(self) -> dict[str, str]:
        out = {self.creator.user_id.hex(): "creator", self.guest.user_id.hex(): "guest"}
        out.update({m.user_id.hex(): "member" for m in self.members})
        return out


def op_record(op: Op, kind: str, node: int, made_ms: int, sent_s: float) -> OpRecord:
    data = base64.urlsafe_b64encode(encode_op(op)).decode()
    code = int(op_kind(op))
    if isinstance(op, MsgV1):
        domain = DELETES if op.kind is MessageKind.DELETE else MESSAGES
        return OpRecord(
            op.msg_id.hex(), domain, kind, code, data, op.sender.hex(), op.chat_id.hex(),
            (op.ref or b"").hex(), op.hlc.pack(), made_ms, node, sent_s, sent_s,
        )  # fmt: skip
    if isinstance(op, MembershipOp):
        return OpRecord(
            op.op_id.hex(), MEMBERS, kind, code, data, op.actor.hex(), op.chat_id.hex(), "", op.hlc.pack(),
            made_ms, node, sent_s, sent_s, subject=op.user_id.hex(),
        )  # fmt: skip
    if isinstance(op, IdentityRecord):
        return OpRecord(
            op.record_id.hex(), IDENTITY, kind, code, data, op.user_id.hex(), "", "",
            op.hlc.pack(), made_ms, node, sent_s, sent_s,
        )  # fmt: skip
    raise TypeError(f"not an op: {type(op).__name__}")


class Poster:
    """Posts a request of ops to a node and records each op with the request's outcome."""

    def __init__(self, urls: list[str], history: History, t0: float) -> None:
        self.urls, self.history, self.t0 = urls, history, t0
        self._http = httpx.Client(timeout=POST_TIMEOUT_S)

    def close(self) -> None:
        self._http.close()

    def post(self, node: int, ops: list[tuple[Op, str]], made_ms: int) -> str:
        sent = time.monotonic() - self.t0
        records = [op_record(op, kind, node, made_ms, sent) for op, kind in ops]
        body = {"ops": [{"kind": r.op_kind, "data": r.data} for r in records]}
        status, code = _outcome(lambda: self._http.post(f"{self.urls[node]}/ops", json=body))
        done = time.monotonic() - self.t0
        for record in records:
            record.status, record.code, record.done_s = status, code, done
            self.history.add_op(record)
        return status


def _outcome(send: Callable[[], httpx.Response]) -> tuple[str, str]:
    try:
        response = send()
    except httpx.ConnectError as exc:  # never connected: the request never left
        return REFUSED, f"connect: {type(exc).__name__}"
    except httpx.HTTPError as exc:  # sent, perhaps taken: a killed or paused node
        return UNKNOWN, type(exc).__name__
    if response.status_code in (201, 202):
        return ACKED, str(response.status_code)
    try:
        code = str(response.json().get("code", ""))
    except ValueError:
        code = ""
    if response.status_code >= 500 and response.status_code not in (503, 507):
        return UNKNOWN, f"{response.status_code} {code}"  # a bug: nothing promised
    return REFUSED, f"{response.status_code} {code}"


@dataclass
class Chat:
    proof: GroupProof
    chat_id: bytes
    guest_in: bool = True  # as the creator last asked


@dataclass
class Workload:
    urls: list[str]
    history: History
    seed: int
    users: Users
    chats: list[Chat] = field(default_factory=list)
    rate: float = 40.0  # requests per second, all workers together
    batch: int = 12  # ops per request, at most
    t0: float = field(default_factory=time.monotonic)

    def setup(self, chats: int) -> None:
        """Identities, groups with every user in them, a first message each: posted to node 0
        until acknowledged (before any fault)."""
        rng = random.Random(f"{self.seed}:chats")
        clock = HlcClock()
        creator = self.users.creator
        everyone = [creator, *self.users.members, self.users.guest]
        ops: list[tuple[Op, str]] = [
            (user.identity(clock.now(_ms())), "identity") for user in everyone
        ]
        for _ in range(chats):
            proof = new_group(creator.signing_key, rng.randbytes(16))
            chat = Chat(proof, proof.chat_id())
            self.chats.append(chat)
            for user in everyone:
                role = Role.ADMIN if user is creator else Role.PARTICIPANT
                op = MembershipOp.create(
                    creator.signing_key, chat.chat_id, user.user_id, MembershipAction.ADD,
                    clock.now(_ms()), role, proof=proof,
                )  # fmt: skip
                ops.append((op, "member"))
            first = MsgV1.create(creator.signing_key, chat.chat_id, clock.now(_ms()), b"hello")
            ops.append((first, "new"))
        self.history.chats = [c.chat_id.hex() for c in self.chats]
        self.history.users = self.users.roles()
        poster = Poster(self.urls, self.history, self.t0)
        try:
            for attempt in range(30):
                if poster.post(0, ops, _ms()) == ACKED:
                    return
                time.sleep(1 + attempt)
            raise RuntimeError("node 0 did not take the setup ops")
        finally:
            poster.close()

    def threads(self, stop: threading.Event) -> list[threading.Thread]:
        runs: list[Callable[[], None]] = [
            lambda i=i, u=u: self._member(i, u, stop)  # type: ignore[misc]
            for i, u in enumerate(self.users.members)
        ]
        runs += [lambda: self._creator(stop), lambda: self._guest(stop)]
        return [
            threading.Thread(target=r, name=f"chaos-worker{i}", daemon=True)
            for i, r in enumerate(runs)
        ]

    # --- the workers ---

    def _loop(
        self,
        name: str,
        stop: threading.Event,
        share: float,
        step: Callable[[random.Random, Poster], None],
    ) -> None:
        rng = random.Random(f"{self.seed}:{name}")
        poster = Poster(self.urls, self.history, self.t0)
        interval = 1 / max(0.01, self.rate * share)
        try:
            while not stop.is_set():
                started = time.monotonic()
                step(rng, poster)
                stop.wait(max(0.0, interval * rng.uniform(0.5, 1.5) - (time.monotonic() - started)))
        finally:
            poster.close()

    def _member(self, index: int, user: UserKey, stop: threading.Event) -> None:
        clock = HlcClock()
        mine: dict[bytes, list[MsgV1]] = {c.chat_id: [] for c in self.chats}  # acked NEWs
        read_up_to: dict[bytes, bytes] = {}  # chat -> the message of our last receipt
        share = 0.8 / max(1, len(self.users.members))

        def step(rng: random.Random, poster: Poster) -> None:
            ops = [
                self._member_op(rng, user, clock, mine, read_up_to)
                for _ in range(rng.randint(1, self.batch))
            ]
            if poster.post(rng.randrange(len(self.urls)), ops, _ms()) == ACKED:
                for op, kind in ops:
                    if kind == "new" and isinstance(op, MsgV1):
                        mine[op.chat_id].append(op)

        self._loop(f"member{index}", stop, share, step)

    def _member_op(
        self,
        rng: random.Random,
        user: UserKey,
        clock: HlcClock,
        mine: dict[bytes, list[MsgV1]],
        read_up_to: dict[bytes, bytes],
    ) -> tuple[Op, str]:
        chat = rng.choice(self.chats).chat_id
        kind = rng.choices(list(MEMBER_KINDS), weights=list(MEMBER_KINDS.values()))[0]
        targets = mine[chat]
        key = user.signing_key
        if kind == "receipt" and targets and read_up_to.get(chat) == targets[-1].msg_id:
            kind = "new"  # read up to it already: a receipt would not move forward (409)
        if kind == "identity":
            return user.identity(clock.now(_ms())), kind
        if kind == "new" or not targets:
            return MsgV1.create(
                key, chat, clock.now(_ms()), rng.randbytes(rng.randint(8, 200))
            ), "new"
        # a receipt reads up to the newest: an older one would move the position back (409)
        target = targets[-1] if kind == "receipt" else rng.choice(targets)
        if kind == "edit":
            payload, mkind = rng.randbytes(rng.randint(8, 100)), MessageKind.EDIT
        elif kind == "delete":
            targets.remove(target)
            payload, mkind = Claims.of(target).encode(), MessageKind.DELETE
        elif kind == "reaction":
            payload = reaction_payload(
                rng.choice((b"+1", b"ok", b"ha")), retract=rng.random() < 0.2
            )
            mkind = MessageKind.REACTION
        else:
            payload, mkind = target.hlc.to_bytes(), MessageKind.READ_RECEIPT
            read_up_to[chat] = target.msg_id
        stamp = clock.update(target.hlc, _ms())
        return MsgV1.create(key, chat, stamp, payload, kind=mkind, ref=target.msg_id), kind

    def _creator(self, stop: threading.Event) -> None:
        clock = HlcClock()
        creator, guest = self.users.creator, self.users.guest

        def step(rng: random.Random, poster: Poster) -> None:
            chat = rng.choice(self.chats)
            if rng.random() < 0.3:
                action = MembershipAction.REMOVE if chat.guest_in else MembershipAction.ADD
                op: Op = MembershipOp.create(
                    creator.signing_key, chat.chat_id, guest.user_id, action, clock.now(_ms()),
                    Role.PARTICIPANT, proof=chat.proof,
                )  # fmt: skip
                if poster.post(rng.randrange(len(self.urls)), [(op, "member")], _ms()) == ACKED:
                    chat.guest_in = action is MembershipAction.ADD
                return
            msg = MsgV1.create(creator.signing_key, chat.chat_id, clock.now(_ms()), b"creator")
            poster.post(rng.randrange(len(self.urls)), [(msg, "new")], _ms())

        self._loop("creator", stop, 0.1, step)

    def _guest(self, stop: threading.Event) -> None:
        clock = HlcClock()
        key = self.users.guest.signing_key

        def step(rng: random.Random, poster: Poster) -> None:
            chat = rng.choice(self.chats).chat_id
            msg = MsgV1.create(key, chat, clock.now(_ms()), rng.randbytes(32))
            poster.post(rng.randrange(len(self.urls)), [(msg, "new")], _ms())

        self._loop("guest", stop, 0.1, step)


def _ms() -> int:
    return int(time.time() * 1000)
