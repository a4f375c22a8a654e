"""The PySpark simulator: replays multi-node traces through ``store`` and ``sync`` and checks convergence.

``generate`` (synthetic traces in the format of ``store.trace``; ``sender_keys``, its group
senders' keys, in the stand-in payloads of ``group_payloads``), ``schedule`` (the
replay's ordered events), ``engine`` (one shard's simulation, run in a Spark task),
``replica`` (a node's replica, ``sync.replica.MemoryReplica`` with what a simulation
needs), ``oracle`` (the expected state, a Spark DataFrame job; ``key_oracle``, who can
read which group message), ``runner`` (the whole
run), ``report``, ``bugs`` (planted bugs, test only), ``cli``. See SIM.md.
The simulator imports ``store`` and ``sync``, never ``node``.
"""
