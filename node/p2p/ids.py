"""A raw libp2p peer id as the base58 text peers are known by (blocklists, logs)."""

from __future__ import annotations


def peer_id_text(raw: bytes) -> str:
    """``raw`` (a peer id's bytes) in base58. Imports py-libp2p on first use: it loads slowly,
    and the blocklist asks only once someone is blocked."""
    from libp2p.peer.id import ID

    return ID(raw).to_base58()
