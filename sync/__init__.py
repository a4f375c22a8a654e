"""Merkle anti-entropy over 65,536 two-byte buckets, as a sans-IO protocol (see SYNC.md):
the tree locates the differing ranges, a sketch of salted short ids reconciles them.

Imports only the pure parts of ``store``; no trio, libp2p or rocksdict.
"""
