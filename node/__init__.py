"""The trio process: libp2p host, gossip, sync streams, DB writer, GC loop, HTTP API, and the CLI."""
