"""Benchmarks as programs (``chatsync bench ...``): print a table, save JSON, compare in one run."""
