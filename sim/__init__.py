"""The PySpark simulator: replays multi-node traces through ``store`` and ``sync`` and checks convergence."""
