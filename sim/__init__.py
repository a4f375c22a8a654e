"""The PySpark simulator: replays multi-node traces through ``store`` and ``sync`` and checks convergence.

``trace`` (the Parquet format and the ``TraceWriter`` a node records with),
``generate`` (synthetic traces), ``engine`` (one shard's simulation, run in a Spark
task), ``oracle`` (the expected state, a Spark DataFrame job), ``runner`` (the
whole run), ``report``, ``bugs`` (planted bugs, test only), ``cli``. See SIM.md.
The Spark replay imports ``store`` and ``sync``, never ``node``; only ``inprocess``
and ``inprocess_node`` (the differential test's replay through the node's code) do.
"""

from sim.trace import Trace, TraceHeader, TraceWriter, read_header, read_trace

__all__ = ["Trace", "TraceHeader", "TraceWriter", "read_header", "read_trace"]
