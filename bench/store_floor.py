"""Beyond the floor: what every node does with each gossiped op once it has checked it.

It decodes the envelope and stores the ops (``DbReplica.apply_ops``, the node writer's path:
the messages' rows and indexes, the event log, the chat lists, the Merkle trees), and RocksDB
flushes and compacts them on its own threads. Measured in this process on a fresh store with
the node's settings (``node.node.db_config``), one gossip message's ops at a time: CPU µs per
op of all threads (``getrusage``), up to a final flush. The floor (py-libp2p + ``validate_op``)
plus this is the least a node that stores every op can spend on it; what a node spends beyond
both is its own machinery: the HTTP intake, thread hand-offs, gossip publishing, metrics.
"""

from __future__ import annotations

import resource
import tempfile

from node.config import NodeConfig
from node.node import db_config
from store.chatdb import ChatDb
from store.ops import Op, decode_ops, encode_ops
from sync.replica import DbReplica


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread: RocksDB's too
    return usage.ru_utime + usage.ru_stime


def store_us_per_op(joins: list[Op], ops: list[Op], per_message: int) -> float:
    """CPU µs per op of decoding ``ops`` in envelopes of ``per_message`` and storing them in a
    store that holds ``joins`` (the authors' adds, stored first, not timed)."""
    envelopes = [encode_ops(ops[i : i + per_message]) for i in range(0, len(ops), per_message)]
    with tempfile.TemporaryDirectory(prefix="chatsync-store-floor-") as data:
        db = ChatDb(db_config(NodeConfig(data=data)))
        try:
            replica = DbReplica(db)
            replica.apply_ops(joins)
            start = _cpu_s()
            stored = 0
            for envelope in envelopes:
                decoded = decode_ops(envelope, max_bytes=len(envelope), max_ops=per_message)
                stored += replica.apply_ops(decoded).changed
            db.flush()
            spent = _cpu_s() - start
        finally:
            db.close()
    if stored != len(ops):  # held back (no add op for a sender) or duplicates: not the cost
        raise ValueError(f"stored {stored:,} of {len(ops):,} ops: not a measure of storing them")
    return spent / len(ops) * 1e6
