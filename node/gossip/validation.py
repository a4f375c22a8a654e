"""Gossip validation, pure: may a message's bytes be applied and forwarded?

``GossipValidator.check(data, now_ms)`` runs the checks in this order, cheapest and
most telling first, and returns the message's ops or raises ``InvalidInput`` whose
``reason`` names the first that failed:

1. size (``too_large``), then the envelope and op schema (the decoder's reasons);
2. far future (``far_future``): an op stamped more than twice the allowed drift ahead
   of ``now_ms`` is beyond any honest clock difference — as bad as a forgery, and
   checked before the signatures so a forged far-future op is not the cheaper offence;
3. replay (``nothing_new``): a message whose ops this replica holds already is neither
   written nor forwarded. A held message has these very bytes (its id hashes them,
   signature included) and was checked when stored, so only the others go on;
4. drift, public payloads, signatures and authorization of each of those ops;
5. the authors' rates (``rate_limited``): only ops new here count.

2 and 4 are ``store.ingress.refuse_never_valid`` with gossip's limits (``Limits.relayed``):
the list of what can never be valid that every ingress shares; 3 is the ``unheld`` it is
handed, between them.

A message validated again (``first_sight=False``: its ops left the service's cache
before the receive loop took them) skips 3 and 5: it was charged once already.

Nothing here does I/O or reads a clock: the time is an argument, the replica's
"which of these do we hold" a function handed in.
"""

from __future__ import annotations

from collections.abc import Callable

from node.gossip.settings import GossipSettings
from node.limits import AuthorRates
from store.errors import InvalidInput, TooLarge
from store.ingress import Limits, refuse_never_valid
from store.ops import Op, decode_ops

MAX_OPS_PER_MESSAGE = 4096


class GossipValidator:
    def __init__(
        self,
        settings: GossipSettings,
        *,
        not_held: Callable[[list[Op]], list[Op]] | None = None,
        author_rates: AuthorRates | None = None,
    ) -> None:
        self.settings = settings
        self.not_held = not_held  # the ops this replica does not hold yet
        self.author_rates = author_rates  # shared with the API: one budget per author
        self.limits = Limits.relayed(settings.max_offset_ms)

    def check(self, data: bytes, now_ms: int, *, first_sight: bool = True) -> list[Op]:
        """The message's ops if it may be applied and forwarded; else InvalidInput (reason)."""
        s = self.settings
        if len(data) > s.max_bytes:
            raise TooLarge(f"gossip message of {len(data)} bytes over {s.max_bytes}")
        ops = decode_ops(
            data, max_bytes=s.max_bytes, max_ops=MAX_OPS_PER_MESSAGE, max_payload=s.max_payload
        )
        unheld = self.not_held if first_sight else None
        fresh = refuse_never_valid(ops, now_ms=now_ms, limits=self.limits, unheld=unheld)
        if unheld is not None and not fresh:
            raise InvalidInput("every op of the message is held here", reason="nothing_new")
        if first_sight and self.author_rates is not None:
            self.author_rates.check(fresh, now_ms)
        return ops
