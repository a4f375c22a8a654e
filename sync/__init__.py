"""Merkle anti-entropy over 65,536 two-byte buckets, as a sans-IO protocol (see SYNC.md).

Imports only the pure parts of ``store``; no trio, libp2p or rocksdict.
"""
