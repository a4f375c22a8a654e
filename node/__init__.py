"""The node: one trio process serving a replica over libp2p and HTTP (``chatsync node run``).

``node.node`` runs it: RocksDB, the libp2p host (``p2p/``, the one package that imports
py-libp2p; ``peers``), the services built
once by ``services.build_services`` — the writer (``writer``), the intake of client ops
(``intake``), gossip (``gossip/``: pure validation and batching, a trio service), sync
sessions (``syncer`` over ``framing``), the retention GC (``gc``), limits and penalties
(``limits``, ``penalties``) — and the HTTP API (``api/``) on a narrow interface. Time is
trio's (``clock``); library exceptions become ours at the I/O edge (``errors``; libp2p's in
``p2p/errors``).
"""
